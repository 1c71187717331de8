"""A small training run that saves training states; tests/integration/test_resume.py starts, kills and resumes it.

Not a test module (pytest does not collect it); the tests import its builders for in-process
runs and start it as a script where a process has to be killed::

    python tests/integration/workers/resume_worker.py --out DIR [--num-workers 2] [--resume-from PATH]
        [--pause-at-step N | --pause-at-epoch E | --slow-save N] [--per-device-batch-size B]

The run: an MLP with dropout, AdamW, a cosine schedule with warm-up, gradient accumulation 2,
66 training samples in batches of 4 (17 batches: the last one is smaller and alone in the last
accumulation window, so an epoch is 9 optimizer steps), 3 epochs, an evaluation set, a stateful
callback, and ``SaveTrainingStateCallback`` saving into ``DIR/states`` every 4 steps and after
every epoch. At the end, process 0 writes ``DIR/weights.pt`` (the model's state dict) and
``DIR/history.json`` (the run history and the final position).

After each optimizer step the run prints ``STEP <global step>`` (after that step's save), and
after each epoch ``EPOCH <epoch>`` (after the epoch's save), flushed, so a test can follow it:

* ``--pause-at-step N`` / ``--pause-at-epoch E``: after printing that marker, print ``PAUSED``
  and wait, so the test can kill the process at exactly that point; a signal handled by
  ``SaveTrainingStateCallback`` (SIGTERM) ends the wait, and the run goes on to act on it.
* ``--slow-save N``: the N-th save writes half of ``model.pt``, prints ``SAVING`` and sleeps,
  so the test can kill the process in the middle of a save.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

import pytorch_accelerated.checkpoints.directories
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    STATE_SAVES_ORDER,
    SaveTrainingStateCallback,
    TrainerCallback,
    get_default_callbacks,
)
from pytorch_accelerated.schedulers import CosineLrScheduler

NUM_FEATURES = 5
NUM_TRAIN_SAMPLES = 66
NUM_EVAL_SAMPLES = 20
PER_DEVICE_BATCH_SIZE = 4
GRADIENT_ACCUMULATION_STEPS = 2
NUM_EPOCHS = 3
STEPS_PER_EPOCH = 9  # ceil(ceil(66 / 4) / 2)
TOTAL_STEPS = NUM_EPOCHS * STEPS_PER_EPOCH
SAVE_EVERY_N_STEPS = 4
PAUSE_S = 600.0


class RegressionData(Dataset):
    """Fixed ``(x, y)`` pairs; counts the samples it hands out."""

    def __init__(self, num_samples: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, NUM_FEATURES, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(
            num_samples, 1, generator=generator
        )
        self.num_loaded = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.num_loaded += 1
        return self.x[index], self.y[index]


def make_model(hidden: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(NUM_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))


def make_datasets() -> tuple[RegressionData, RegressionData]:
    return RegressionData(NUM_TRAIN_SAMPLES, seed=1), RegressionData(NUM_EVAL_SAMPLES, seed=2)


def make_scheduler_fn() -> Any:
    return CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1, warmup_starting_lr=1e-3, lr_min=1e-4)


class CountBatches(TrainerCallback):
    """A stateful callback: records the number of batches seen so far at each epoch's end.

    If its state were not restored on resume, the resumed run's history would differ.
    """

    def __init__(self) -> None:
        self.batches_seen = 0

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.batches_seen += 1

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("batches_seen", self.batches_seen)

    def state_dict(self) -> dict[str, Any]:
        return {"batches_seen": self.batches_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.batches_seen = state["batches_seen"]


class Markers(TrainerCallback):
    """Prints ``STEP n`` / ``EPOCH e`` and pauses where asked (listed after the save callback)."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, pause_at_step: int | None = None, pause_at_epoch: int | None = None) -> None:
        self.pause_at_step = pause_at_step
        self.pause_at_epoch = pause_at_epoch
        self.last_step = -1

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.last_step = trainer.progress.global_step  # a resumed run starts after its saved step

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        step = trainer.progress.global_step
        if step != self.last_step:
            self.last_step = step
            _marker(trainer, f"STEP {step}", pause=step == self.pause_at_step)

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        _marker(trainer, f"EPOCH {epoch}", pause=epoch == self.pause_at_epoch)


def _marker(trainer: Any, text: str, pause: bool) -> None:
    if trainer.is_world_process_zero:
        print(text, flush=True)
    if not pause:
        return
    print("PAUSED", flush=True)
    # Wait to be killed, or for a signal that SaveTrainingStateCallback handles (the run then
    # goes on to its next step, where the callback acts on it).
    savers = [c for c in trainer.callback_handler.callbacks if isinstance(c, SaveTrainingStateCallback)]
    deadline = time.monotonic() + PAUSE_S
    while time.monotonic() < deadline and not any(s.signal_received for s in savers):
        time.sleep(0.02)


def make_trainer(
    save_dir: str | os.PathLike | None = None,
    *,
    save_every_n_steps: int | None = SAVE_EVERY_N_STEPS,
    save_every_n_epochs: int | None = 1,
    max_checkpoints: int | None = None,
    extra_callbacks: tuple[TrainerCallback, ...] = (),
    hidden: int = 16,
) -> Trainer:
    model = make_model(hidden)
    callbacks: list[Any] = [*get_default_callbacks(progress_bar=False), CountBatches()]
    if save_dir is not None:
        callbacks.append(
            SaveTrainingStateCallback(
                str(save_dir),
                save_every_n_steps=save_every_n_steps,
                save_every_n_epochs=save_every_n_epochs,
                max_checkpoints=max_checkpoints,
            )
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=(*callbacks, *extra_callbacks))


def train(
    trainer: Trainer,
    *,
    resume_from: str | os.PathLike | None = None,
    num_workers: int = 0,
    per_device_batch_size: int = PER_DEVICE_BATCH_SIZE,
    gradient_accumulation_steps: int = GRADIENT_ACCUMULATION_STEPS,
    num_epochs: int = NUM_EPOCHS,
    create_scheduler_fn: Any = "cosine",
    datasets: tuple[Dataset, Dataset] | None = None,
) -> None:
    train_set, eval_set = datasets if datasets is not None else make_datasets()
    trainer.train(
        train_set,
        num_epochs=num_epochs,
        eval_dataset=eval_set,
        per_device_batch_size=per_device_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        create_scheduler_fn=make_scheduler_fn() if create_scheduler_fn == "cosine" else create_scheduler_fn,
        train_dataloader_kwargs={"num_workers": num_workers},
        resume_from=resume_from,
        seed=7,
    )


def history_of(trainer: Trainer) -> dict[str, Any]:
    return {"run_history": trainer.run_history.state_dict(), "progress": trainer.progress.state_dict()}


def slow_down_save(nth: int) -> None:
    """Make the ``nth`` save write half of ``model.pt``, then announce it and sleep."""
    original = pytorch_accelerated.checkpoints.directories.write_file
    model_files_written = 0

    def write_file(obj: Any, path: Path) -> None:
        nonlocal model_files_written
        if Path(path).name == "model.pt":
            model_files_written += 1
            if model_files_written == nth:
                buffer = io.BytesIO()
                torch.save(obj, buffer)
                with open(path, "wb") as file:
                    file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                print("SAVING", flush=True)
                time.sleep(PAUSE_S)
        original(obj, path)

    pytorch_accelerated.checkpoints.directories.write_file = write_file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--per-device-batch-size", type=int, default=PER_DEVICE_BATCH_SIZE)
    parser.add_argument("--resume-from", type=Path)
    parser.add_argument("--pause-at-step", type=int)
    parser.add_argument("--pause-at-epoch", type=int)
    parser.add_argument("--slow-save", type=int)
    args = parser.parse_args()
    if args.slow_save is not None:
        slow_down_save(args.slow_save)
    trainer = make_trainer(
        args.out / "states", extra_callbacks=(Markers(args.pause_at_step, args.pause_at_epoch),)
    )
    train(
        trainer,
        resume_from=args.resume_from,
        num_workers=args.num_workers,
        per_device_batch_size=args.per_device_batch_size,
    )
    if trainer.is_world_process_zero:
        torch.save(trainer.get_model().state_dict(), args.out / "weights.pt")
        result = {**history_of(trainer), "num_processes": trainer.run_config.num_processes}
        (args.out / "history.json").write_text(json.dumps(result))
    print("DONE", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
