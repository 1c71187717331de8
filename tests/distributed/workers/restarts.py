"""The same script for the first launch and every relaunch of a job under ``torchrun --max-restarts``,
with real faults injected on one rank: SIGKILL (during training, or inside a save), SIGTERM, or
a Python exception raised in a callback.

The job: an MLP with dropout (each process draws its own masks) trained on a fixed synthetic
data set, 2 processes x per-device batch 4, 80 updates per epoch, 3 epochs (240 updates), AdamW,
``SaveTrainingStateCallback(--save-dir, save_every_n_steps=SAVE_EVERY_N_STEPS)`` with its default
SIGTERM handling, and ``resume_from="auto"``: every attempt resumes from the newest complete state
in ``--save-dir``, if any.

``--faults`` is a JSON list of ``{"attempt", "rank", "step", "kind"}``: on attempt
``TORCHELASTIC_RESTART_COUNT == attempt``, rank ``rank``, after ``step`` updates:

- ``kill``: SIGKILL to itself at the start of the next training batch;
- ``kill-in-save``: SIGKILL to itself inside the save of ``step_{step}``, after its first file is
  written into the state's hidden directory;
- ``term``: SIGTERM to itself (preemption: the run saves and stops);
- ``raise``: a ``RuntimeError`` from a callback, once (a marker file keeps it from repeating).

Written to the output folder: ``attempt{A}_rank{R}.json`` when an attempt starts training (the
update it resumed from), ``fault{A}.json`` just before a fault (the update it happens at), and at
the end ``weights{R}.pt`` (the final state_dict) and ``rank{R}.json``.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from common import NUM_FEATURES, RegressionDataset, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    STATE_SAVES_ORDER,
    SaveTrainingStateCallback,
    TrainerCallback,
    get_default_callbacks,
)
from pytorch_accelerated.checkpoints import directories

NUM_SAMPLES = 640
PER_DEVICE_BATCH_SIZE = 4
NUM_EPOCHS = 3
SAVE_EVERY_N_STEPS = 8


def attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Faults(TrainerCallback):
    """Injects this attempt's fault for this rank, and records where each attempt started."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, faults: list[dict[str, Any]], out: Path) -> None:
        self.out = out
        self.mine = [f for f in faults if f["attempt"] == attempt() and f["rank"] == rank()]
        self.started = False

    def record_fault(self, fault: dict[str, Any], step: int) -> None:
        path = self.out / f"fault{attempt()}.json"
        path.write_text(json.dumps({**fault, "at_update": step}))

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if not self.started:
            self.started = True
            resumed = {"resumed_at_update": trainer.progress.global_step}
            (self.out / f"attempt{attempt()}_rank{rank()}.json").write_text(json.dumps(resumed))

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        step = trainer.progress.global_step
        for fault in self.mine:
            if fault["step"] == step and fault["kind"] == "kill":
                self.record_fault(fault, step)
                os.kill(os.getpid(), signal.SIGKILL)

    def on_train_step_end(self, trainer: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        step = trainer.progress.global_step
        for fault in self.mine:
            if fault["step"] != step or not is_update_step:
                continue
            if fault["kind"] == "term":
                self.record_fault(fault, step)
                os.kill(os.getpid(), signal.SIGTERM)
            marker = self.out / "raised"
            if fault["kind"] == "raise" and not marker.exists():
                marker.write_text(str(step))
                self.record_fault(fault, step)
                raise RuntimeError(f"injected failure at update {step}")

    def kill_inside_saves(self) -> None:
        """SIGKILL this process inside the planned save, once its first file is on disk."""
        planned = [f for f in self.mine if f["kind"] == "kill-in-save"]
        if not planned:
            return
        write, hidden = directories.write_file, f".step_{planned[0]['step']}.incomplete"

        def write_then_die(obj: Any, path: Path) -> None:
            write(obj, path)
            if path.parent.name == hidden:
                self.record_fault(planned[0], planned[0]["step"])
                os.kill(os.getpid(), signal.SIGKILL)

        directories.write_file = write_then_die  # type: ignore[assignment]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 2))


def main() -> None:
    args = parse_args({"save-dir": "", "faults": "[]"})
    save_dir = Path(args.save_dir)
    faults = Faults(json.loads(args.faults), args.out)
    faults.kill_inside_saves()
    model = make_model()
    saver = SaveTrainingStateCallback(save_dir, save_every_n_steps=SAVE_EVERY_N_STEPS)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01),
        callbacks=[*get_default_callbacks(progress_bar=False), saver, faults],
    )
    trainer.train(
        RegressionDataset(NUM_SAMPLES, seed=1),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=PER_DEVICE_BATCH_SIZE,
        resume_from="auto",
        seed=7,
    )
    torch.save(trainer.get_model().state_dict(), args.out / f"weights{rank()}.pt")
    write_result(
        args.out,
        {
            "attempt": attempt(),
            "num_processes": trainer.run_config.num_processes,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "progress": trainer.progress.state_dict(),
        },
    )


if __name__ == "__main__":
    main()
