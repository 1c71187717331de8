"""One script for the first launch and every relaunch: ``train(..., resume_from="auto")``.

Started by tests/distributed/test_auto_resume.py (under torchrun, on 2 processes) and by
tests/integration/test_auto_resume.py (one process)::

    python auto_resume.py --out OUT --save-dir DIR [--fail-at-update N] [--fail-once MARKER]
                          [--kill-at-update N] [--update-sleep S]

The run: the MLP of ``common.py``, SGD with momentum, 48 samples in per-device batches of 4
(6 updates per epoch on 2 processes, 12 on 1), 3 epochs, a state saved into ``--save-dir`` every
2 updates; ``resume_from="auto"``. ``--fail-at-update N``: a callback raises
``RuntimeError("injected failure at update N")`` on every process at update N (with
``--fail-once MARKER``: only while the file MARKER does not exist; the failing attempt creates
it). ``--kill-at-update N``: the process SIGKILLs itself at update N, after that update's save.
``--update-sleep S``: each update takes S seconds more. Each process appends
``<torchrun's restart count> <update>`` to ``OUT/updates_rank{RANK}.log`` after each update it
trains, ``<restart count> <seconds in train()> <finished or the exception's type>`` to
``OUT/attempts_rank{RANK}.log`` when ``train()`` ends, and writes ``rank{RANK}.json`` at the end: its final weights, update and number of processes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, state_dict_to_lists, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import STATE_SAVES_ORDER, SaveTrainingStateCallback, TrainerCallback

NUM_EPOCHS = 3
SAVE_EVERY_N_STEPS = 2


class LogUpdates(TrainerCallback):
    """Append each update trained, with the attempt (torchrun's restart count), to ``path``; sleep ``sleep_s``."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, path: Path, sleep_s: float) -> None:
        self.path, self.sleep_s = path, sleep_s
        self.attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        with self.path.open("a") as log:
            log.write(f"{self.attempt} {trainer.progress.global_step}\n")
        time.sleep(self.sleep_s)


class InjectFault(TrainerCallback):
    """At update ``at``: raise (unless ``once`` exists; then create it first), or SIGKILL this process."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, at: int, kill: bool, once: Path | None) -> None:
        self.at, self.kill, self.once = at, kill, once
        self.failed_before = once is not None and once.exists()  # read before any process writes it

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step != self.at or self.failed_before:
            return
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.once is not None and rank() == 0:
            self.once.write_text("failed once")
        raise RuntimeError(f"injected failure at update {self.at}")


def main() -> None:
    args = parse_args(
        {"save-dir": "", "fail-at-update": 0, "fail-once": "", "kill-at-update": 0, "update-sleep": 0.0}
    )
    model = make_mlp()
    callbacks: list[Any] = [
        SaveTrainingStateCallback(args.save_dir, save_every_n_steps=SAVE_EVERY_N_STEPS),
        LogUpdates(args.out / f"updates_rank{rank()}.log", args.update_sleep),
    ]
    if args.fail_at_update or args.kill_at_update:
        once = Path(args.fail_once) if args.fail_once else None
        callbacks.append(
            InjectFault(args.fail_at_update or args.kill_at_update, bool(args.kill_at_update), once)
        )
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), callbacks=callbacks
    )
    started, outcome = time.monotonic(), "finished"
    try:
        trainer.train(
            RegressionDataset(48), num_epochs=NUM_EPOCHS, per_device_batch_size=4, resume_from="auto"
        )
    except Exception as error:
        outcome = type(error).__name__
        raise
    finally:  # how long this attempt took, and how it ended
        with (args.out / f"attempts_rank{rank()}.log").open("a") as log:
            log.write(
                f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')} {time.monotonic() - started:.3f} {outcome}\n"
            )
    write_result(
        args.out,
        {
            "weights": state_dict_to_lists(trainer.get_model()),
            "global_step": trainer.progress.global_step,
            "num_processes": trainer.accelerator.num_processes,
        },
    )


if __name__ == "__main__":
    main()
