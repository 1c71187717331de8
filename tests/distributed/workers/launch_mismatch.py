"""One process of a launch set up by hand (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT), started
with plain ``python`` as a script or SLURM's ``srun`` would start it.

It creates a Trainer, timing only the Trainer's creation, so that the wait does not include the
imports; with ``--gather 1`` the processes then gather their ranks through the group. It writes
``{--name}.json``: the error it got, if any, the seconds it waited and what it gathered; then
lets the error propagate so the process exits non-zero.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from common import make_mlp, parse_args
from torch import nn

from pytorch_accelerated import Trainer


def main() -> None:
    args = parse_args({"name": "process", "gather": 0})
    result: dict[str, Any] = {"error_type": None, "message": None, "num_processes": None, "gathered": None}
    model = make_mlp()
    started = time.monotonic()
    try:
        # No optimizer: creating one imports torch._dynamo, seconds of CPU per process.
        trainer = Trainer(model, nn.MSELoss(), None, callbacks=())
        result["wait_s"] = time.monotonic() - started
        result["num_processes"] = trainer.accelerator.num_processes
        if args.gather:
            result["gathered"] = trainer.gather(torch.tensor([int(os.environ["RANK"])])).tolist()
    except Exception as error:
        result.update(error_type=type(error).__name__, message=str(error), wait_s=time.monotonic() - started)
        raise
    finally:
        (args.out / f"{args.name}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
