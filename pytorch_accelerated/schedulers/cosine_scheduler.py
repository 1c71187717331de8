"""The module path of pytorch-accelerated 0.1.61 for :class:`CosineLrScheduler` (see :mod:`.cosine`)."""

from .cosine import CosineLrScheduler

__all__ = ["CosineLrScheduler"]
