"""The two explicit pieces of run state: the frozen per-run config, and the progress counters."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TrainerRunConfig:
    """The settings of one training run, fixed when ``train()`` starts.

    Step counts are optimizer updates. An update happens on every process at once, so
    ``num_update_steps_per_epoch`` and ``max_num_train_steps`` are the same number whether the
    run uses one process or many; ``num_local_update_steps_per_epoch`` is kept for
    compatibility and equals ``num_update_steps_per_epoch``.
    ``train_total_batch_size`` is the number of samples that go into one update across all
    processes (per-device batch x processes x accumulation steps).
    """

    num_epochs: int
    train_per_device_batch_size: int
    train_dl_kwargs: dict[str, Any]
    eval_per_device_batch_size: int
    eval_dl_kwargs: dict[str, Any]
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    train_total_batch_size: int
    eval_total_batch_size: int
    num_update_steps_per_epoch: int
    num_local_update_steps_per_epoch: int
    max_num_train_steps: int | None
    is_local_process_zero: bool
    is_world_process_zero: bool
    is_distributed: bool
    mixed_precision: str
    num_processes: int
    max_grad_norm: float | None = None
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunProgress:
    """Where a training run is. Updated by the Trainer only; read it anywhere.

    Attributes:
        epoch: the epoch being run, counted from 0 (``run_history.current_epoch`` is the same
            epoch counted from 1); once an epoch's last event has fired, the next one.
        global_step: optimizer updates completed since the start of the run.
        batch_index: batches of the current epoch fully processed by this process.
        epoch_step: optimizer updates completed in the current epoch.
    """

    epoch: int = 0
    global_step: int = 0
    batch_index: int = 0
    epoch_step: int = 0

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))
