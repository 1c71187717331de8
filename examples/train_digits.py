"""Train a small classifier on scikit-learn's handwritten digits with the pytorch-accelerated Trainer.

The walk-through of "Introducing pytorch-accelerated" (an MLP on MNIST, with torchmetrics in a
callback), on the 8x8 digits that ship inside scikit-learn, so nothing is downloaded. The same
script runs on one process or several:

    python examples/train_digits.py
    python examples/train_digits.py --find-lr    # the learning rate from a range test
    torchrun --nproc_per_node 2 examples/train_digits.py
    accelerate launch --multi_gpu --num_processes 2 examples/train_digits.py

(`accelerate launch --cpu --num_processes 2` starts ONE process: use one of the last two for
several CPU processes.)
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
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision, MulticlassRecall

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import PlotRunCallback, TrackingCallback, TrainerCallback
from pytorch_accelerated.trainer import DEFAULT_CALLBACKS

NUM_CLASSES = 10


class DigitsModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(in_features=64, out_features=128),
            nn.ReLU(),
            nn.Linear(in_features=128, out_features=64),
            nn.ReLU(),
            nn.Linear(in_features=64, out_features=NUM_CLASSES),
        )

    def forward(self, x):
        return self.main(x.view(x.shape[0], -1))


class ClassificationMetricsCallback(TrainerCallback):
    """Accuracy, precision and recall of every evaluation epoch, recorded in the run history.

    torchmetrics sums its counts over all processes in ``compute()``, so nothing is gathered here.
    """

    def __init__(self, num_classes):
        self.metrics = MetricCollection(
            {
                "accuracy": MulticlassAccuracy(num_classes, average="micro"),
                "precision": MulticlassPrecision(num_classes),
                "recall": MulticlassRecall(num_classes),
            }
        )

    def on_training_run_start(self, trainer, **kwargs):
        self.metrics.to(trainer.device)

    def on_evaluation_run_start(self, trainer, **kwargs):
        self.metrics.to(trainer.device)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        self.metrics.update(batch_output["model_outputs"].argmax(dim=-1), batch[1])

    def on_eval_epoch_end(self, trainer, **kwargs):
        for name, value in self.metrics.compute().items():
            trainer.run_history.update_metric(name, value.item())
        self.metrics.reset()


def load_digit_splits(seed):
    """Return (train, validation, test) datasets and the scaler fitted on the training split."""
    features, targets = load_digits(return_X_y=True)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed)).numpy()
    n_train, n_val = int(0.7 * len(order)), int(0.15 * len(order))
    splits = order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]
    scaler = StandardScaler().fit(features[splits[0]])
    datasets = [
        TensorDataset(
            torch.tensor(scaler.transform(features[idx]), dtype=torch.float32),
            torch.tensor(targets[idx], dtype=torch.long),
        )
        for idx in splits
    ]
    return (*datasets, scaler)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch on each process")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument(
        "--find-lr",
        action="store_true",
        help="run a learning-rate range test first and train with its suggestion instead of --lr",
    )
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/digits"))
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, shuffling")
    parser.add_argument(
        "--log-every-n-steps",
        type=int,
        default=5,
        help="optimizer updates between two points of the step metrics",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    if "OMP_NUM_THREADS" not in os.environ:
        # This model is tiny: extra intra-op threads only wait for each other, and on a busy CPU
        # that waiting costs more than the maths (torchrun sets OMP_NUM_THREADS=1 likewise).
        torch.set_num_threads(1)

    torch.manual_seed(args.seed)  # the same initial weights on every process
    train_dataset, validation_dataset, test_dataset, scaler = load_digit_splits(args.seed)
    model = DigitsModel()
    optimizer = optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_func = nn.CrossEntropyLoss()

    trainer = Trainer(
        model,
        loss_func=loss_func,
        optimizer=optimizer,
        callbacks=(
            # Before the defaults, so the metrics are in the history when LogMetricsCallback prints it.
            ClassificationMetricsCallback(NUM_CLASSES),
            # Step metrics (loss, learning rate, samples/s...) every few updates, one CSV row per value.
            TrackingCallback(
                ["csv"], args.log_every_n_steps, run_name="digits", logging_dir=args.output_dir / "runs"
            ),
            # One picture of the run: losses, learning rate and every metric against update steps.
            PlotRunCallback(args.output_dir / "training_curves.png"),
            *DEFAULT_CALLBACKS,
        ),
    )
    if args.find_lr:
        # The range test leaves the model, optimizer and RNGs as they were: only the rate changes.
        result = trainer.find_learning_rate(
            train_dataset, per_device_batch_size=args.batch_size, seed=args.seed
        )
        if trainer.is_world_process_zero:
            result.plot(args.output_dir / "lr_finder.png")
        for group in optimizer.param_groups:
            group["lr"] = result.suggestion
        trainer.print(f"RANGE_TEST suggestion={result.suggestion:.4g} (see {args.output_dir}/lr_finder.png)")
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        seed=args.seed,
    )
    # No gradients are kept during evaluation, so a larger batch fits.
    test_metrics = trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)
    test_accuracy = test_metrics["accuracy"]

    # Every process calls save_checkpoint; only the main process of each node writes the file.
    trainer.save_checkpoint(
        args.output_dir / "digits_mlp.pt",
        checkpoint_kwargs={
            "test_accuracy": test_accuracy,
            "epochs": args.epochs,
            "scaler_mean": scaler.mean_,  # numpy arrays are stored as tensors
            "scaler_scale": scaler.scale_,
        },
    )
    trainer.print(
        f"\nSaved {args.output_dir}/digits_mlp.pt, {args.output_dir}/training_curves.png and "
        f"{args.output_dir}/runs/digits/metrics.csv"
    )
    trainer.print(
        f"num_processes={trainer.run_config.num_processes} wall_time_s={time.perf_counter() - start:.1f}"
    )
    trainer.print(f"FINAL test_accuracy={test_accuracy:.4f}")


if __name__ == "__main__":
    main()
