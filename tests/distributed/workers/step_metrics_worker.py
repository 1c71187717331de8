"""Step metrics on a group of processes: each rank writes what each of its batches gave and the
points it measured.

27 samples in batches of 3 over 2 processes, 2 epochs, a point every 3 updates (points fall
mid-epoch and one spans the epoch boundary). Each rank records ``(update, loss, batch_size)``
for every batch it trained on, so the test can compute the oracle over the global batches
(both ranks' batches of each update) and check that every rank measured the same points.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback

EVERY = 3


class Recorder(TrainerCallback):
    def __init__(self) -> None:
        self.batches: list[tuple[int, float, float]] = []
        self.points: list[tuple[int, dict[str, float]]] = []

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        trainer.loop_state.step_metrics.request(EVERY)

    def on_train_step_end(
        self, trainer: Any, batch_output: Any = None, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        update = trainer.progress.global_step + (0 if is_update_step else 1)
        self.batches.append((update, float(batch_output["loss"].detach()), float(batch_output["batch_size"])))

    def on_step_metrics(
        self, trainer: Any, step: int = 0, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        self.points.append((step, dict(metrics or {})))


def main() -> None:
    args = parse_args()
    recorder = Recorder()
    model = make_mlp()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=(recorder,)
    )
    trainer.train(RegressionDataset(27), num_epochs=2, per_device_batch_size=3)
    write_result(
        args.out,
        {
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "batches": recorder.batches,
            "points": recorder.points,
            "history": trainer.run_history.get_step_metric_values("train_loss"),
            "global_step": trainer.progress.global_step,
        },
    )


if __name__ == "__main__":
    main()
