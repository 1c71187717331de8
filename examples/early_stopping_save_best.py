"""Early stopping, and keeping the best weights, on scikit-learn's digits.

A small MLP is given far more epochs than it needs. ``SaveBestModelCallback`` saves a checkpoint
to ``--output-dir``/best_model.pt whenever the validation loss reaches a new low, and
``EarlyStoppingCallback`` ends the run once the loss has not improved by more than
``--threshold`` for ``--patience`` epochs in a row. When the run ends, early or not, the best
checkpoint is loaded back into the model, so what is evaluated and saved afterwards is the best
epoch's model, not the last one's: the script shows this by evaluating the validation set again.

    python examples/early_stopping_save_best.py
    python examples/early_stopping_save_best.py --patience 5  # stops at epoch 10, best still epoch 5
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
from pytorch_accelerated.callbacks import (
    DEFAULT_CALLBACKS,
    EarlyStoppingCallback,
    SaveBestModelCallback,
    TrainerCallback,
)

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
    parser.add_argument("--epochs", type=int, default=100, help="the most epochs; early stopping ends sooner")
    parser.add_argument("--patience", type=int, default=2, help="epochs without improvement before stopping")
    parser.add_argument("--threshold", type=float, default=0.01, help="the least fall in loss that counts")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch on each process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/early_stopping"))
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, shuffling")
    args = parser.parse_args()
    start = time.perf_counter()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: extra intra-op threads only wait for each other

    torch.manual_seed(args.seed)
    train_dataset, validation_dataset, test_dataset = load_digit_splits(args.seed)
    model = create_model()
    best_path = args.output_dir / "best_model.pt"
    save_best = SaveBestModelCallback(save_path=best_path)  # watches eval_loss_epoch
    trainer = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        # Saving before stopping: callbacks run in order, and none after the one that stops the
        # run is called in the epoch that stops it.
        callbacks=(
            AccuracyCallback(),
            *DEFAULT_CALLBACKS,
            save_best,
            EarlyStoppingCallback(
                early_stopping_patience=args.patience, early_stopping_threshold=args.threshold
            ),
        ),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        seed=args.seed,
    )

    eval_losses = trainer.run_history.get_metric_values("eval_loss_epoch")[:]
    stopped_at_epoch = len(eval_losses)  # one evaluation per epoch run
    trainer.print(f"\nvalidation loss per epoch: {[round(loss, 4) for loss in eval_losses]}")

    # The model now holds the best epoch's weights: evaluating the validation set again gives
    # that epoch's loss, not the last epoch's.
    reloaded_loss = trainer.evaluate(dataset=validation_dataset, per_device_batch_size=args.batch_size)[
        "evaluation_loss"
    ]
    trainer.print(
        f"validation loss of the model after the run: {reloaded_loss:.4f} (best epoch "
        f"{save_best.best_epoch}: {save_best.best_metric:.4f}; last epoch {stopped_at_epoch}: "
        f"{eval_losses[-1]:.4f})"
    )
    test_accuracy = trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)[
        "accuracy"
    ]

    trainer.print(f"\nbest checkpoint: {best_path}, wall_time_s={time.perf_counter() - start:.1f}")
    trainer.print(
        f"STOPPED_AT_EPOCH={stopped_at_epoch} BEST_EPOCH={save_best.best_epoch} MAX_EPOCHS={args.epochs}"
    )
    trainer.print(f"FINAL test_accuracy={test_accuracy:.4f}")


if __name__ == "__main__":
    main()
