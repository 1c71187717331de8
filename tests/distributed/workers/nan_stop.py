"""Rank 1 alone produces a NaN training loss at one step; the run must stop on both ranks, cleanly.

Two runs: with the default callbacks, and with ``TerminateOnNaNCallback(check_every_n_steps=1)``
(where rank 0's own losses are still finite when the stop is decided, so it can only learn of
the NaN from rank 1). Each rank writes the events it saw and where it stopped.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    TRAINER_EVENTS,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
    get_default_callbacks,
)


class NaNLossOnRank1(Trainer):
    """Returns a NaN loss on rank 1 only, for the batch taken when ``global_step == nan_at_step``."""

    nan_at_step = 5

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nan_injected_at: list[int] = []

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if rank() == 1 and self.progress.global_step == self.nan_at_step:
            output["loss"] = output["loss"] * float("nan")
            self.nan_injected_at.append(self.progress.global_step)
        return output


class RecordEvents(TrainerCallback):
    def __init__(self) -> None:
        self.events: list[str] = []


def _recording_hook(event: str) -> Any:
    def hook(self: RecordEvents, trainer: Any, **kwargs: Any) -> None:
        self.events.append(event)

    return hook


for _event in TRAINER_EVENTS:
    setattr(RecordEvents, _event, _recording_hook(_event))


def train_until_stopped(
    callbacks: tuple[Any, ...], recorder: RecordEvents, num_epochs: int
) -> dict[str, Any]:
    model = make_mlp(seed=0)
    trainer = NaNLossOnRank1(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(*callbacks, recorder)
    )
    trainer.train(RegressionDataset(64), num_epochs=num_epochs, per_device_batch_size=2)
    config = trainer.run_config
    return {
        "num_processes": config.num_processes,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "global_step": trainer.progress.global_step,
        "planned_steps": config.num_epochs * config.num_update_steps_per_epoch,
        "nan_injected_at": trainer.nan_injected_at,
        "events": recorder.events,
    }


def main() -> None:
    args = parse_args()
    result = {
        "default_callbacks": train_until_stopped(
            get_default_callbacks(progress_bar=False), RecordEvents(), num_epochs=2
        ),
        "check_every_step": train_until_stopped(
            (
                MoveModulesToDeviceCallback(),
                TerminateOnNaNCallback(check_every_n_steps=1),
                PrintProgressCallback(),
                LogMetricsCallback(),
            ),
            RecordEvents(),
            num_epochs=2,
        ),
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
