"""One script for every launch of an elastic job (``torchrun --nnodes 1:2``): ``resume_from="auto"``.

The run: a small MLP, SGD with momentum under a one-cycle schedule (its length from the updates
per epoch), 96 samples that return their index, per-device batch 8,
``gradient_accumulation_steps`` 1 as written, seed 42, 3 epochs, a state every 2 updates into
``--save-dir``. Launched on 2 processes, that is 16 samples per update; on 1 process the resume
keeps 16 by accumulating 2 batches.

Every process appends one JSON line per event to ``<out>/log-<pid>.jsonl`` (flushed at once, so a
killed process leaves what it did): ``start`` (after the state is loaded: processes, position,
accumulation, updates per epoch), ``batch`` (the sample indices of each batch, with the update it
belongs to) and ``end`` (final weights, when the run finished). Held points, for the test to act on
a known position (the state is saved there already):

- a fresh run on 2 processes holds after update 4 until ``<out>/go`` exists (the test kills one
  agent meanwhile; the survivor then meets the dead peer in its next all-reduce);
- a run on 1 process holds after update 8 until SIGTERM (torchrun stops it when a node joins).
Each hold is announced by ``<out>/held-<update>-<pid>.json`` (rank, pid, torchrun agent's pid).
"""

from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, state_dict_to_lists
from torch import nn

from pytorch_accelerated import Trainer, TrainerPlaceholderValues
from pytorch_accelerated.callbacks import STATE_SAVES_ORDER, SaveTrainingStateCallback, TrainerCallback

NUM_SAMPLES, BATCH_SIZE, NUM_EPOCHS, SAVE_EVERY = 96, 8, 3, 2
HOLD_S = 120.0  # a hold that is never released fails the run instead of hanging it


class Log(TrainerCallback):
    """The log lines (see the module docstring); first, so it sees every batch trained."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.file = (out / f"log-{os.getpid()}.jsonl").open("a", buffering=1)
        self.start_step = 0

    def write(self, **record: Any) -> None:
        self.file.write(
            json.dumps({"pid": os.getpid(), "rank": int(os.environ["RANK"]), "t": time.time(), **record})
            + "\n"
        )

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        config, progress = trainer.run_config, trainer.progress
        self.start_step = progress.global_step
        self.write(
            event="start",
            num_processes=config.num_processes,
            accumulation=config.gradient_accumulation_steps,
            updates_per_epoch=config.num_update_steps_per_epoch,
            max_num_train_steps=config.max_num_train_steps,
            progress=progress.state_dict(),
            restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )

    def on_train_step_end(self, trainer: Any, batch: Any, **kwargs: Any) -> None:
        progress = trainer.progress
        update = progress.global_step + (0 if kwargs["is_update_step"] else 1)
        self.write(event="batch", epoch=progress.epoch, update=update, ids=batch[2].tolist())


class Hold(TrainerCallback):
    """The held points (see the module docstring); after the state saver, so the state is saved."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, log: Log, saver: SaveTrainingStateCallback) -> None:
        self.log, self.saver = log, saver

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        processes = trainer.run_config.num_processes
        after = kwargs["is_update_step"] and trainer.progress.global_step
        if processes == 2 and self.log.start_step == 0 and after == 4:
            self.hold(4, lambda: (self.log.out / "go").exists())
        if processes == 1 and after == 8:
            self.hold(8, lambda: self.saver.signal_received is not None)

    def hold(self, update: int, released: Any) -> None:
        mark = {"rank": int(os.environ["RANK"]), "pid": os.getpid(), "agent": os.getppid()}
        (self.log.out / f"held-{update}-{os.getpid()}.json").write_text(json.dumps(mark))
        deadline = time.monotonic() + HOLD_S
        while not released():
            if time.monotonic() > deadline:
                raise RuntimeError(f"held after update {update} for {HOLD_S} s: the test never released it")
            time.sleep(0.05)


def main() -> None:
    args = parse_args({"save-dir": ""})
    model = make_mlp(seed=0)
    saver = SaveTrainingStateCallback(args.save_dir, save_every_n_steps=SAVE_EVERY, save_at_end=False)
    log = Log(args.out)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        callbacks=(log, saver, Hold(log, saver)),
    )
    trainer.train(
        RegressionDataset(NUM_SAMPLES, seed=1, with_index=True),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=BATCH_SIZE,
        create_scheduler_fn=partial(
            torch.optim.lr_scheduler.OneCycleLR,
            max_lr=0.1,
            epochs=TrainerPlaceholderValues.NUM_EPOCHS,
            steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
        ),
        resume_from="auto",
    )
    if trainer.progress.epoch == NUM_EPOCHS:  # not stopped by a signal
        log.write(
            event="end",
            num_processes=trainer.run_config.num_processes,
            global_step=trainer.progress.global_step,
            weights=state_dict_to_lists(trainer.get_model()),
        )


if __name__ == "__main__":
    main()
