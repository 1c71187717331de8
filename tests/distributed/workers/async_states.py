"""Training states written in the background (``asynchronous=True``), under real faults.

``--mode``:

- ``kill`` (1 process): a state ``step_1`` saved synchronously, then ``step_2`` saved
  asynchronously on a model of about 1.5M parameters (about 17 MB with Adam's state), and the
  process SIGKILLs itself the moment that save returns, while the background thread writes.
- ``fsize`` (1 or 2 processes): ``step_1`` saved; then, under a file-size limit on process
  ``--fault-rank`` (``RLIMIT_FSIZE``, with SIGXFSZ ignored so that the write fails with EFBIG),
  ``step_2`` saved asynchronously: its error must come at the next save (``step_3``), on every
  process; then ``step_4`` saved asynchronously, whose error must come at the end of the run.
  ``rank{R}.json`` holds both errors.
- ``readonly`` (1 process): after a run, ``step_1`` saved asynchronously by hand; the background
  thread waits until the folder has been made unwritable (``chattr +i`` as root, where chmod
  has no effect, else ``chmod 555``), then writes and fails to publish. ``rank0.json`` holds
  the error of ``wait_for_training_state`` and what the folder holds once writable again.
- ``resume`` (run on 2 processes): ``SaveTrainingStateCallback(asynchronous=True,
  save_every_n_steps=3, max_checkpoints=3)`` over 2 epochs of 10 updates, with dropout; with
  ``--resume-from``, the run continues from that state. ``rank{R}.json`` holds the final weights.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import traceback
from pathlib import Path
from typing import Any

import torch
from common import (
    NUM_FEATURES,
    NUM_OUTPUTS,
    RegressionDataset,
    parse_args,
    rank,
    state_dict_to_lists,
    write_result,
)
from torch import nn

import pytorch_accelerated.checkpoints.directories as directories
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.schedulers import CosineLrScheduler

NO_LIMIT = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
FAULT_RANK = [0]  # the process whose writes fail, in --mode fsize


def limit_file_size(on: bool) -> None:
    on = on and rank() == FAULT_RANK[0]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY) if on else NO_LIMIT)


def error_record(error: BaseException) -> dict[str, Any]:
    return {"type": type(error).__name__, "message": str(error), "errno": getattr(error, "errno", None)}


class SaveAtSteps(TrainerCallback):
    """After update N, do ``actions[N](trainer)``."""

    def __init__(self, actions: dict[int, Any]) -> None:
        self.actions = actions

    def on_train_step_end(self, trainer: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        action = self.actions.get(trainer.progress.global_step) if is_update_step else None
        if action is not None:
            action(trainer)


def run_kill(out: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, 1200), nn.Linear(1200, 1200), nn.Linear(1200, NUM_OUTPUTS))

    def save_then_die(trainer: Trainer) -> None:
        trainer.save_training_state(out / "states" / "step_2", asynchronous=True)
        os.kill(os.getpid(), signal.SIGKILL)  # the background thread is writing step_2 now

    actions = {1: lambda trainer: trainer.save_training_state(out / "states" / "step_1"), 2: save_then_die}
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-3), callbacks=(SaveAtSteps(actions),)
    )
    trainer.train(RegressionDataset(16), num_epochs=1, per_device_batch_size=4)


def run_fsize(out: Path) -> None:
    states, result = out / "states", {}

    def start_failing_save(name: str) -> Any:
        def action(trainer: Trainer) -> None:
            limit_file_size(True)  # kept until the error has surfaced: the write happens later
            trainer.save_training_state(states / name, asynchronous=True)

        return action

    def next_save(trainer: Trainer) -> None:
        try:
            trainer.save_training_state(states / "step_3")
        except Exception as error:
            result["at_next_save"] = error_record(error)
        limit_file_size(False)

    actions = {
        1: lambda trainer: trainer.save_training_state(states / "step_1"),
        2: start_failing_save("step_2"),
        3: next_save,
        4: start_failing_save("step_4"),
    }
    torch.manual_seed(0)
    model = nn.Linear(NUM_FEATURES, NUM_OUTPUTS)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-3), callbacks=(SaveAtSteps(actions),)
    )
    try:
        trainer.train(
            RegressionDataset(16 * int(os.environ.get("WORLD_SIZE", "1"))),
            num_epochs=1,
            per_device_batch_size=4,
        )
    except Exception as error:
        result["at_end"] = error_record(error)
        result["traceback"] = traceback.format_exc()
    limit_file_size(False)
    write_result(out, result)


def make_unwritable(folder: Path, on: bool) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i" if on else "-i", str(folder)], check=True)
    else:
        folder.chmod(0o555 if on else 0o755)


def run_readonly(out: Path) -> None:
    states, result = out / "states", {}
    states.mkdir()
    made_unwritable = threading.Event()
    write_file = directories.write_file

    def write_file_later(obj: Any, path: Path) -> None:  # in the background thread
        made_unwritable.wait(60)
        write_file(obj, path)

    directories.write_file = write_file_later
    torch.manual_seed(0)
    model = nn.Linear(NUM_FEATURES, NUM_OUTPUTS)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-3), callbacks=())
    trainer.train(RegressionDataset(8), num_epochs=1, per_device_batch_size=4)
    trainer.save_training_state(states / "step_1", asynchronous=True)
    make_unwritable(states, True)
    try:
        result["writable"] = os.access(states, os.W_OK) and _can_create(states)
        made_unwritable.set()
        try:
            trainer.wait_for_training_state()
        except Exception as error:
            result["error"] = error_record(error)
    finally:
        make_unwritable(states, False)
    result["left"] = sorted(path.name for path in states.iterdir())
    write_result(out, result)


def _can_create(folder: Path) -> bool:
    try:
        (folder / "probe").mkdir()
    except OSError:
        return False
    (folder / "probe").rmdir()
    return True


def run_resume(out: Path, save_dir: str, resume_from: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, NUM_OUTPUTS))
    saver = SaveTrainingStateCallback(save_dir, save_every_n_steps=3, max_checkpoints=3, asynchronous=True)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=3e-2), callbacks=(saver,))
    trainer.train(
        RegressionDataset(40, seed=1),
        num_epochs=2,
        per_device_batch_size=2,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, warmup_starting_lr=1e-3
        ),
        resume_from=resume_from or None,
        seed=7,
    )
    write_result(
        out,
        {"weights": state_dict_to_lists(trainer.get_model()), "global_step": trainer.progress.global_step},
    )


def main() -> None:
    args = parse_args({"mode": "", "save-dir": "", "resume-from": "", "fault-rank": 0})
    FAULT_RANK[0] = args.fault_rank
    if args.mode == "kill":
        run_kill(args.out)
    elif args.mode == "fsize":
        run_fsize(args.out)
    elif args.mode == "readonly":
        run_readonly(args.out)
    else:
        run_resume(args.out, args.save_dir, args.resume_from)
    if rank() == 0:
        (args.out / "done").write_text("")


if __name__ == "__main__":
    main()
