"""Learning-rate (or any param-group value) schedulers stepped once per optimizer update.

- :mod:`.base`: ``SchedulerBase`` and ``StatefulSchedulerBase``, the base classes: a value of
  every param group set after each update;
- :mod:`.cosine`: ``CosineLrScheduler``: linear warm-up, k-decay cosine annealing, cool-down;
- :mod:`.wsd`: ``WSDLrScheduler``: warmup-stable-decay, with a decay before each checkpoint;
- :mod:`.scheduler_base`, :mod:`.cosine_scheduler`, :mod:`.wsd_scheduler`: 0.1.61's module
  paths, re-exporting the same classes (and ``estimate_checkpoint_steps``).

They import nothing from the Trainer.
"""

from .base import SchedulerBase, StatefulSchedulerBase
from .cosine import CosineLrScheduler
from .wsd import WSDLrScheduler

__all__ = ["SchedulerBase", "StatefulSchedulerBase", "CosineLrScheduler", "WSDLrScheduler"]
