"""Saves that fail for real, on one process or on one rank of a group.

Trains a little, saves a first training state, then runs each case named by ``--cases``:

- ``fsize``: a file-size limit (``RLIMIT_FSIZE``, with SIGXFSZ ignored so that the write fails
  with EFBIG) on rank ``--fault-rank`` only, set between the first save and this one.
- ``parent_is_file``: a state directory whose parent is a file (we run as root, so
  permissions would prove nothing).
- ``interrupt``: the same limit, but the failing write also brings a real SIGINT (the SIGXFSZ
  handler lifts the limit and sends it), as a Ctrl-C in the middle of ``torch.save``.
- ``checkpoint_fsize``: ``save_checkpoint`` over an existing file under the limit.
- ``damaged_rank_file``: not a save: a folder whose newest state has a truncated RNG file of
  rank 1 only; resuming from the folder must skip that state on both ranks, together.

Each case records the exception type, message and errno on every rank, then (the limit
lifted) saves again to show that the processes are still in step, and resumes from the first
state. Each rank writes ``rank{RANK}.json``: ``{case: {...}}``.
"""

from __future__ import annotations

import os
import resource
import signal
import warnings
from pathlib import Path
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback

LIMIT_BYTES = 1024
NO_LIMIT = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def new_trainer() -> Trainer:
    model = make_mlp()
    return Trainer(model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=0.01), callbacks=())


def train(trainer: Trainer, **kwargs: Any) -> None:
    trainer.train(
        RegressionDataset(16), num_epochs=kwargs.pop("num_epochs", 1), per_device_batch_size=4, **kwargs
    )


def send_sigint(signum: int, frame: Any) -> None:
    """A SIGINT (Ctrl-C) in the middle of a write that fails: the limit goes, the SIGINT comes."""
    resource.setrlimit(resource.RLIMIT_FSIZE, NO_LIMIT)
    os.kill(os.getpid(), signal.SIGINT)


def limit_file_size(on: bool, interrupt: bool = False) -> None:
    signal.signal(signal.SIGXFSZ, send_sigint if interrupt else signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, resource.RLIM_INFINITY) if on else NO_LIMIT)


def failing_save(trainer: Trainer, case: str, out: Path, fault_rank: int) -> None:
    """The save that fails on ``fault_rank`` (the limit is lifted before this returns)."""
    faulty = rank() == fault_rank
    if case == "parent_is_file":
        if trainer.is_world_process_zero:
            (out / "blocker").write_text("a file where a folder should be")
        trainer.accelerator.wait_for_everyone()
        trainer.save_training_state(out / "blocker" / "states" / "step-2")
        return
    try:
        limit_file_size(faulty, interrupt=case == "interrupt")
        if case == "checkpoint_fsize":
            trainer.save_checkpoint(out / "model.pt", checkpoint_kwargs={"version": 2})
        else:
            trainer.save_training_state(out / "states" / f"{case}-step-2")
    finally:
        limit_file_size(False)


def run_case(trainer: Trainer, case: str, out: Path, fault_rank: int) -> dict[str, Any]:
    result: dict[str, Any] = {"type": None}
    try:
        failing_save(trainer, case, out, fault_rank)
    except BaseException as error:  # KeyboardInterrupt included: it is what is asserted on
        result = {"type": type(error).__name__, "message": str(error), "errno": getattr(error, "errno", None)}
        if isinstance(error, KeyboardInterrupt) and trainer.accelerator.num_processes > 1:
            raise  # the other rank would wait for this one in vain
    trainer.save_training_state(out / "states" / f"{case}-after")  # still in step: saving works again
    resumed = new_trainer()
    train(resumed, num_epochs=2, resume_from=out / "states" / "step-1")
    result["resumed_global_step"] = resumed.progress.global_step
    return result


class RecordStart(TrainerCallback):
    """Records the step a run starts from (after the resumed state went in)."""

    def __init__(self) -> None:
        self.start_step: int | None = None

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.start_step = trainer.progress.global_step


def resume_past_a_damaged_rank_file(out: Path) -> dict[str, Any]:
    """States after epochs 1 and 2; the newer one's rng_state_1.pt is cut short."""
    trainer = new_trainer()
    train(trainer)
    trainer.save_training_state(out / "fallback" / "epoch-1")
    train(trainer, num_epochs=2, resume_from=out / "fallback" / "epoch-1")
    trainer.save_training_state(out / "fallback" / "epoch-2")
    damaged = out / "fallback" / "epoch-2" / "rng_state_1.pt"
    if trainer.is_world_process_zero:
        damaged.write_bytes(damaged.read_bytes()[:100])
    trainer.accelerator.wait_for_everyone()
    start = RecordStart()
    resumed = Trainer(
        resumed_model := make_mlp(),
        nn.MSELoss(),
        torch.optim.Adam(resumed_model.parameters()),
        callbacks=[start],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(resumed, num_epochs=3, resume_from=out / "fallback")
    skipped = [str(w.message) for w in caught if "Skipped the training state" in str(w.message)]
    return {"start_step": start.start_step, "skipped": skipped, "global_step": resumed.progress.global_step}


def main() -> None:
    args = parse_args({"cases": "fsize", "fault-rank": 0})
    trainer = new_trainer()
    train(trainer)
    trainer.save_training_state(args.out / "states" / "step-1")
    trainer.save_checkpoint(args.out / "model.pt", checkpoint_kwargs={"version": 1})
    cases = args.cases.split(",")
    results = {
        case: run_case(trainer, case, args.out, args.fault_rank)
        for case in cases
        if case != "damaged_rank_file"
    }
    if "damaged_rank_file" in cases:
        results["damaged_rank_file"] = resume_past_a_damaged_rank_file(args.out)
    write_result(args.out, results)


if __name__ == "__main__":
    main()
