"""Learning-rate (or any param-group value) schedulers stepped once per optimizer update."""

from .base import SchedulerBase, StatefulSchedulerBase
from .cosine import CosineLrScheduler
from .wsd import WSDLrScheduler

__all__ = ["SchedulerBase", "StatefulSchedulerBase", "CosineLrScheduler", "WSDLrScheduler"]
