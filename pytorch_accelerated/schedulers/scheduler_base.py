"""The module path of pytorch-accelerated 0.1.61 for the scheduler base classes (see :mod:`.base`)."""

from .base import SchedulerBase, StatefulSchedulerBase

__all__ = ["SchedulerBase", "StatefulSchedulerBase"]
