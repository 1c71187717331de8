"""The module path of pytorch-accelerated 0.1.61 for :class:`WSDLrScheduler` (see :mod:`.wsd`)."""

from .wsd import WSDLrScheduler, estimate_checkpoint_steps

__all__ = ["WSDLrScheduler", "estimate_checkpoint_steps"]
