"""Launched as 2 processes with a plain ``Accelerator()`` on a machine without GPUs.

accelerate then leaves every process on its own (a group of 1); the Trainer must refuse to
start, on every process, rather than let each one train the whole run. Each rank writes the
error it got, then lets it propagate so the process exits non-zero.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from common import make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer


class PlainAcceleratorTrainer(Trainer):
    def _create_accelerator(self) -> Accelerator:
        return Accelerator()


def main() -> None:
    args = parse_args()
    result: dict[str, Any] = {"error_type": None, "message": None}
    try:
        PlainAcceleratorTrainer(make_mlp(), nn.MSELoss(), None)
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
