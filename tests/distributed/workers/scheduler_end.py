"""Schedules built from placeholders end on their final value at the run's last update.

Runs a CosineLrScheduler (from placeholders) and a WSDLrScheduler (from placeholders) with and
without gradient accumulation, and records, for each, the learning rate after every update
and the number of updates, so the test can check where each schedule ends.
"""

from __future__ import annotations

from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.schedulers import CosineLrScheduler, WSDLrScheduler

LR_MIN = 1e-4


class RecordLearningRates(TrainerCallback):
    def __init__(self) -> None:
        self.after_updates: list[float] = []
        self.seen_step = 0

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if trainer.progress.global_step != self.seen_step:
            self.seen_step = trainer.progress.global_step
            self.after_updates.append(trainer.optimizer.param_groups[0]["lr"])


def run(scheduler: str, accumulation: int) -> dict[str, Any]:
    model = make_mlp()
    recorder = RecordLearningRates()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=(recorder,))
    create = (
        CosineLrScheduler.create_scheduler_fn(lr_min=LR_MIN, num_warmup_epochs=1)
        if scheduler == "cosine"
        # WSD's lr_min is a ratio of the peak (0.1), as in 0.1.61: it ends on LR_MIN too.
        else WSDLrScheduler.create_scheduler_fn(lr_min=LR_MIN / 0.1, num_warmup_steps=2, num_checkpoints=2)
    )
    # 52 samples: with batch 4, 7 batches per process on 2 processes (the last one padded).
    trainer.train(
        RegressionDataset(52),
        num_epochs=3,
        per_device_batch_size=4,
        gradient_accumulation_steps=accumulation,
        create_scheduler_fn=create,
    )
    return {
        "num_processes": trainer.run_config.num_processes,
        "steps_per_epoch": trainer.run_config.num_update_steps_per_epoch,
        "global_step": trainer.progress.global_step,
        "scheduler_updates": trainer.scheduler.num_updates,
        "lrs": recorder.after_updates,
    }


if __name__ == "__main__":
    args = parse_args()
    write_result(
        args.out,
        {
            f"{name}-{accumulation}": run(name, accumulation)
            for name in ("cosine", "wsd")
            for accumulation in (1, 2)
        },
    )
