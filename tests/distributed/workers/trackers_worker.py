"""A run logging to every tracker (csv, tensorboard, mlflow, W&B offline) from each process.

Every rank trains the same linear model on 24 samples (global batch 4: 6 updates an epoch, 2
epochs) with ``TrackingCallback(log_every_n_steps=2)`` writing under ``OUT/logs``, then writes
``rank{R}.json``: how many trackers it started and the run history's series. The test runs
:func:`run` in one process with the same global batch as the reference.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrackingCallback, TrainerCallback

TRACKERS = ("csv", "tensorboard", "mlflow", "wandb")
RUN_NAME = "two"
GLOBAL_BATCH_SIZE = 4
NUM_EPOCHS = 2


class CountTrackers(TrainerCallback):
    """Records how many trackers the tracking callback started on this process."""

    def __init__(self, tracking: TrackingCallback) -> None:
        self.tracking, self.started = tracking, -1

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.started = max(self.started, len(self.tracking.trackers))


def make_data(num_samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 3, generator=generator)
    return TensorDataset(x, (x @ torch.tensor([1.0, -2.0, 0.5])).unsqueeze(1))


def run(out: Path, num_processes: int) -> tuple[Trainer, CountTrackers]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    tracking = TrackingCallback(
        TRACKERS,
        log_every_n_steps=2,
        run_name=RUN_NAME,
        logging_dir=out / "logs",
        init_kwargs={"wandb": {"mode": "offline"}},
    )
    count = CountTrackers(tracking)
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=[tracking, count]
    )
    trainer.train(
        make_data(24, seed=1),
        num_epochs=NUM_EPOCHS,
        eval_dataset=make_data(8, seed=2),
        per_device_batch_size=GLOBAL_BATCH_SIZE // num_processes,
    )
    return trainer, count


def series(trainer: Trainer) -> dict[str, Any]:
    history = trainer.run_history
    result = {name: history.get_step_metric_values(name) for name in history.get_step_metric_names()}
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        result[name] = history.get_metric_values(name)
    return result


def main() -> None:
    from common import parse_args, write_result  # beside this script (the test imports the rest alone)

    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_CONSOLE": "off",
    }.items():
        os.environ[name] = value
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    args = parse_args()
    trainer, count = run(args.out, int(os.environ.get("WORLD_SIZE", "1")))
    write_result(args.out, {"trackers_started": count.started, "series": series(trainer)})


if __name__ == "__main__":
    main()
