"""One run per folder on 2 processes: only the main process takes the folder's lock, every
process fails together when another run holds it, and the run id is the same on every process.

- ``held``: ``OUT/held`` is held by the test's own (live) process: every rank records the error
  of ``train()`` and how many updates it made.
- ``free``: a run into ``OUT/free`` saving after every update; every rank records its run id and
  whether the lock existed during the run.
- ``own``: each rank's folder is its own (``OUT/own-{RANK}``), on one machine: refused before
  training on every rank (every process of a machine must see its folder).

Each rank writes ``rank{RANK}.json``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback


class Look(TrainerCallback):
    def __init__(self, folder: Any) -> None:
        self.folder, self.updates, self.lock_seen = folder, 0, []

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        self.updates += int(is_update_step)
        self.lock_seen.append((self.folder / ".run.lock").exists())


def run(folder: Any) -> dict[str, Any]:
    model, look = make_mlp(), Look(folder)
    callbacks = (SaveTrainingStateCallback(folder, save_every_n_steps=1), look)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=callbacks)
    result: dict[str, Any] = {"error": None}
    try:
        trainer.train(RegressionDataset(16), num_epochs=1, per_device_batch_size=4)
    except Exception as error:
        result["error"] = {"type": type(error).__name__, "message": str(error)}
    return {
        **result,
        "updates": look.updates,
        "lock_seen": look.lock_seen,
        "run_id": trainer.run_identity.run_id,
    }


def main() -> None:
    args = parse_args()
    result = {"held": run(args.out / "held"), "free": run(args.out / "free")}
    write_result(args.out, {**result, "own": run(args.out / f"own-{os.environ['RANK']}")})


if __name__ == "__main__":
    main()
