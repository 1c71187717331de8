"""The module path of pytorch-accelerated 0.1.61 for the run history (see :mod:`.run_history`)."""

from .run_history import InMemoryRunHistory, LossTracker, MetricNotFoundError, RunHistory

__all__ = ["RunHistory", "InMemoryRunHistory", "LossTracker", "MetricNotFoundError"]
