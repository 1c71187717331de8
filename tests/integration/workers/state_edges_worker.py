"""Runs whose state lives outside the weights: tests/integration/test_state_edges.py starts, kills and
resumes them.

Not a test module (pytest does not collect it); the tests import its builders for in-process runs
and start it as a script where a process has to be killed::

    python tests/integration/workers/state_edges_worker.py --out DIR --run NAME [--pause-at-step N]

The data, schedule and states are those of ``resume_worker.py`` (66 samples in batches of 4,
accumulation 2: 9 updates per epoch; a state every 4 updates and after every epoch, into
``DIR/states``), over 4 epochs. The runs (``NAME``):

- ``unfreeze``: gradual unfreezing. The script freezes every layer group but the head
  (``ModelFreezer(model).freeze()``), and a callback unfreezes the rest when epoch 2 starts
  (``if epoch == 2``); the optimizer holds every parameter (frozen ones get no gradient).
- ``ema-then-save`` / ``save-then-ema``: a ``ModelEmaCallback`` listed before (or after) the
  ``SaveTrainingStateCallback``.

After each update the run prints ``STEP <global step>`` (after that update's save); with
``--pause-at-step N`` it then prints ``PAUSED`` and waits to be killed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    ModelEmaCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
    get_default_callbacks,
)
from pytorch_accelerated.finetuning import ModelFreezer
from tests.integration.workers import resume_worker as rw

NUM_EPOCHS = 4
RUNS = ("unfreeze", "ema-then-save", "save-then-ema")
UNFREEZE_AT_EPOCH = 2


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(rw.NUM_FEATURES, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1)
    )


class UnfreezeAtEpoch(TrainerCallback):
    """Unfreezes every layer group when epoch ``epoch`` (counted from 1) starts."""

    def __init__(self, freezer: ModelFreezer, epoch: int) -> None:
        self.freezer = freezer
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.run_history.current_epoch == self.epoch:
            self.freezer.unfreeze()


def make_trainer(run: str, save_dir: str | os.PathLike | None = None, markers: Any = None) -> Trainer:
    """The Trainer of ``run`` (one of :data:`RUNS`), saving states into ``save_dir`` (None: none)."""
    model = make_model()
    saver = (
        [
            SaveTrainingStateCallback(
                str(save_dir), save_every_n_steps=rw.SAVE_EVERY_N_STEPS, save_every_n_epochs=1
            )
        ]
        if save_dir is not None
        else []
    )
    extra: list[Any]
    if run == "unfreeze":
        freezer = ModelFreezer(model)
        freezer.freeze()  # every group but the head
        extra = [UnfreezeAtEpoch(freezer, UNFREEZE_AT_EPOCH), *saver]
    else:
        ema = ModelEmaCallback(decay=0.9, evaluate_during_training=False, save_path=None)
        extra = [ema, *saver] if run == "ema-then-save" else [*saver, ema]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01)
    callbacks = [*get_default_callbacks(progress_bar=False), *extra, *([markers] if markers else [])]
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)


def train(trainer: Trainer, resume_from: str | os.PathLike | None = None) -> None:
    rw.train(trainer, resume_from=resume_from, num_epochs=NUM_EPOCHS)


def ema_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    """The EMA copy's weights of an EMA run (``ema-then-save`` or ``save-then-ema``)."""
    ema = trainer.callback_handler.get_callback(ModelEmaCallback)
    return {name: value.detach().clone() for name, value in ema.ema_model.module.state_dict().items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", choices=RUNS, required=True)
    parser.add_argument("--pause-at-step", type=int)
    args = parser.parse_args()
    trainer = make_trainer(args.run, args.out / "states", markers=rw.Markers(args.pause_at_step))
    train(trainer)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
