"""A cosine learning-rate schedule with warm-up, and an EMA of the weights, on scikit-learn's digits.

A small MLP trained with ``CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=..., lr_min=...)``:
the learning rate climbs linearly for the warm-up epochs, then follows a cosine down to exactly
``lr_min`` at the last update. ``ModelEmaCallback`` keeps an exponential moving average of the
weights, updated after every optimizer update; after each evaluation epoch it evaluates the average
on the same data (``ema_model_eval_loss_epoch``, ``ema_model_accuracy``) and saves the best one to
``--output-dir``/ema_model.pt. At the end, that file is loaded into a fresh model and scored on the
test set beside the trained model.

    python examples/train_cosine_ema.py
    python examples/train_cosine_ema.py --epochs 4 --warmup-epochs 1  # a few seconds
"""

import argparse
import os
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from sklearn.preprocessing import StandardScaler
from torch import nn, optim
from torch.utils.data import TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, ModelEmaCallback, TrainerCallback
from pytorch_accelerated.schedulers import CosineLrScheduler

NUM_CLASSES = 10


def create_model():
    return nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES)
    )


class AccuracyCallback(TrainerCallback):
    """Record the accuracy of every evaluation epoch as ``accuracy`` in the run history."""

    def __init__(self):
        self.accuracy = MulticlassAccuracy(NUM_CLASSES, average="micro")

    def on_eval_epoch_start(self, trainer, **kwargs):
        self.accuracy.to(trainer.device)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        self.accuracy.update(batch_output["model_outputs"].argmax(dim=-1), batch[1])

    def on_eval_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("accuracy", self.accuracy.compute().item())
        self.accuracy.reset()


class LearningRateCallback(TrainerCallback):
    """Record the learning rate left in the optimizer at the end of each training epoch as ``lr``."""

    def on_train_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("lr", trainer.optimizer.param_groups[0]["lr"])


def load_digit_splits(seed):
    """Return standardised (train, validation, test) datasets of the 64 pixel values."""
    features, targets = load_digits(return_X_y=True)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed)).numpy()
    n_train, n_val = int(0.7 * len(order)), int(0.15 * len(order))
    splits = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]
    scaler = StandardScaler().fit(features[splits[0]])
    return [
        TensorDataset(
            torch.tensor(scaler.transform(features[idx]), dtype=torch.float32),
            torch.tensor(targets[idx], dtype=torch.long),
        )
        for idx in splits
    ]


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch on each process")
    parser.add_argument(
        "--lr", type=float, default=0.1, help="the peak learning rate, reached after the warm-up"
    )
    parser.add_argument("--lr-min", type=float, default=1e-3, help="the learning rate at the end of the run")
    parser.add_argument(
        "--ema-decay", type=float, default=0.98, help="the average covers ~1/(1-decay) updates"
    )
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/cosine_ema"))
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, shuffling")
    args = parser.parse_args()
    start = time.perf_counter()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: extra intra-op threads only wait for each other

    torch.manual_seed(args.seed)
    train_dataset, validation_dataset, test_dataset = load_digit_splits(args.seed)
    model = create_model()
    loss_func = nn.CrossEntropyLoss()
    # Only the callbacks given to ModelEmaCallback see its evaluation: the same accuracy
    # callback, passed to both, records accuracy for the model and ema_model_accuracy for the EMA.
    accuracy_callback = AccuracyCallback()
    ema_callback = ModelEmaCallback(
        decay=args.ema_decay, save_path=args.output_dir / "ema_model.pt", callbacks=(accuracy_callback,)
    )
    trainer = Trainer(
        model,
        loss_func=loss_func,
        optimizer=optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        # Metrics first, so LogMetricsCallback prints them; the EMA callback last, after the
        # epoch's metrics are recorded, so that the EMA's evaluation follows the model's.
        callbacks=(accuracy_callback, LearningRateCallback(), *DEFAULT_CALLBACKS, ema_callback),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=args.warmup_epochs, warmup_starting_lr=args.lr / 100, lr_min=args.lr_min
        ),
        seed=args.seed,
    )

    history = trainer.run_history
    columns = (
        "lr",
        "train_loss_epoch",
        "eval_loss_epoch",
        "ema_model_eval_loss_epoch",
        "accuracy",
        "ema_model_accuracy",
    )
    per_epoch = zip(*(history.get_metric_values(name) for name in columns), strict=True)
    trainer.print("\nepoch " + " ".join(columns))
    for epoch, values in enumerate(per_epoch, start=1):
        cells = (f"{value:>{len(name)}.4g}" for name, value in zip(columns, values, strict=True))
        trainer.print(f"{epoch:>5} " + " ".join(cells))

    final_lr = trainer.optimizer.param_groups[0]["lr"]
    # The model keeps its last weights; the callback saved the best average (by EMA eval loss).
    test_accuracy = trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)[
        "accuracy"
    ]
    ema_checkpoint = torch.load(args.output_dir / "ema_model.pt", weights_only=True)
    ema_model = create_model()
    ema_model.load_state_dict(ema_checkpoint["model_state_dict"])
    ema_trainer = Trainer(ema_model, loss_func=loss_func, optimizer=None, callbacks=(AccuracyCallback(),))
    ema_test_accuracy = ema_trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)[
        "accuracy"
    ]

    trainer.print(
        f"\nBest EMA weights: epoch {ema_checkpoint['epoch']}, update {ema_checkpoint['global_step']}, "
        f"ema_model_eval_loss_epoch={ema_checkpoint['ema_model_eval_loss_epoch']:.4f}, "
        f"saved to {args.output_dir / 'ema_model.pt'}"
    )
    trainer.print(f"wall_time_s={time.perf_counter() - start:.1f}")
    trainer.print(f"FINAL_LR={final_lr!r} LR_MIN={args.lr_min!r} equal={final_lr == args.lr_min}")  # exactly
    trainer.print(f"FINAL test_accuracy={test_accuracy:.4f} ema_test_accuracy={ema_test_accuracy:.4f}")


if __name__ == "__main__":
    main()
