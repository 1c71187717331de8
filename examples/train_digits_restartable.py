"""The digits job of examples/train_digits.py as one command for the first launch and every relaunch.

It saves a training state every ``--save-every-n-steps`` updates, at every epoch end and when it
receives SIGTERM, and resumes from the newest complete state in ``--save-dir`` when there is one
(else it starts fresh: ``resume_from="auto"``). So the same command serves torchrun's automatic restarts, a job that a
scheduler requeues, and a pod that Kubernetes restarts (see docs/recipes/clusters.md):

    torchrun --nproc_per_node 2 --max-restarts 3 examples/train_digits_restartable.py --save-dir states
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn, optim

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.trainer import DEFAULT_CALLBACKS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_digits.py beside this file
from train_digits import NUM_CLASSES, ClassificationMetricsCallback, DigitsModel, load_digit_splits  # noqa: E402


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch on each process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, shuffling")
    parser.add_argument("--save-dir", type=Path, default=Path("training_states"))
    parser.add_argument("--save-every-n-steps", type=int, default=5)
    return parser


def run(
    args: argparse.Namespace,
    model: nn.Module | None = None,
    trainer_class: type[Trainer] = Trainer,
    callbacks: Sequence[TrainerCallback] = (),
) -> Trainer:
    """Train (or go on training) and evaluate on the test split; ``model`` replaces the digits MLP."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: see train_digits.py
    torch.manual_seed(args.seed)  # the same initial weights on every process
    train_dataset, validation_dataset, test_dataset, _ = load_digit_splits(args.seed)
    model = DigitsModel() if model is None else model
    # Saves every N updates, at every epoch end and on SIGTERM (handle_signals' default).
    saver = SaveTrainingStateCallback(
        args.save_dir,
        save_every_n_epochs=1,
        save_every_n_steps=args.save_every_n_steps,
        max_checkpoints=3,
    )
    trainer = trainer_class(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        callbacks=(
            ClassificationMetricsCallback(NUM_CLASSES),
            saver,
            *callbacks,
            *DEFAULT_CALLBACKS,
        ),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        seed=args.seed,
        resume_from="auto",  # the newest state in the saver's folder, or a new run if there is none
    )
    if saver.signal_received is not None:  # stopped early: the state is saved, the relaunch goes on
        return trainer
    accuracy = trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)["accuracy"]
    trainer.print(f"FINAL global_step={trainer.progress.global_step} test_accuracy={accuracy:.4f}")
    return trainer


def main(argv: Sequence[str] | None = None) -> Any:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    main()
