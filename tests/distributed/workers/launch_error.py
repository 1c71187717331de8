"""Launched as 2 processes on a machine without GPUs, with the docs' pattern: a Trainer subclass
whose ``_create_accelerator`` returns ``Accelerator(mixed_precision="bf16")``.

accelerate then leaves every process on its own (a group of 1); the Trainer must refuse to
start, on every process, rather than let each one train the whole run. Each rank writes the
error it got, then lets it propagate so the process exits non-zero.

``--mode fixed``: the recipe's fix, ``cpu=True`` where there is no GPU: the processes form one
group of 2 and train in bf16.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer


class BF16Trainer(Trainer):
    def _create_accelerator(self) -> Accelerator:
        return Accelerator(mixed_precision="bf16")


class FixedBF16Trainer(Trainer):  # as docs/recipes/precision.md shows it
    def _create_accelerator(self) -> Accelerator:
        return Accelerator(mixed_precision="bf16", cpu=not torch.cuda.is_available())


def main() -> None:
    args = parse_args({"mode": "override"})
    if args.mode == "fixed":
        model = make_mlp()
        trainer = FixedBF16Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01))
        trainer.train(RegressionDataset(16), num_epochs=1, per_device_batch_size=4)
        config = trainer.run_config
        write_result(args.out, {"num_processes": config.num_processes, "mixed_precision": config.mixed_precision,
                                "global_step": trainer.progress.global_step})  # fmt: skip
        return
    result: dict[str, Any] = {"error_type": None, "message": None}
    try:
        BF16Trainer(make_mlp(), nn.MSELoss(), None)
    except Exception as error:
        result = {"error_type": type(error).__name__, "message": str(error)}
        raise
    finally:
        write_result(args.out, result)
        wait_for_every_rank(args.out)


def wait_for_every_rank(out_dir: Path, timeout_s: float = 30.0) -> None:
    """Wait until every rank has written its result: once one process fails, torchrun stops
    the others, and a slower rank must have reached the Trainer by then to show its own error."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((out_dir / f"rank{rank}.json").exists() for rank in range(world_size)):
            return
        time.sleep(0.05)


if __name__ == "__main__":
    main()
