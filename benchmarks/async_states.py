"""How long the training loop is blocked per training-state save: asynchronous vs synchronous.

A model of about 100M parameters (``--layers`` x ``Linear(--width, --width)``; 6 x 4096 by
default: 100.7M parameters, 403 MB in float32) trains with ``SaveTrainingStateCallback`` saving
every ``--save-every`` updates, once with ``asynchronous=False`` and once with
``asynchronous=True``. The time the loop is blocked per save is the time spent inside
``trainer.save_training_state`` (for an asynchronous save: waiting for the previous one, if it
is still being written, the finite check, collecting the state dicts and copying them to host
memory; for a synchronous one: writing and flushing every file). The wait at the end of the
run for the last background write is reported on its own line. The saves are spaced so that a
background write has time to finish before the next save (the default spacing suits a disk
that writes about 70 MB/s with fsync); if it has not, its wait is counted in the next save.

    .venv/bin/python benchmarks/async_states.py            # SGD: the state is the model (403 MB)
    .venv/bin/python benchmarks/async_states.py --optimizer adamw --save-every 60   # 1.2 GB

Prints one line per mode and ``RATIO async_blocked_per_save/sync_blocked_per_save = X`` (the
goal is at most 0.2).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback


class TimedTrainer(Trainer):
    """A Trainer that records how long each save (and the final wait) blocks the loop."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_s: list[float] = []
        self.wait_s: list[float] = []

    def save_training_state(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().save_training_state(*args, **kwargs)
        self.save_s.append(time.perf_counter() - start)

    def wait_for_training_state(self) -> None:
        start = time.perf_counter()
        super().wait_for_training_state()
        self.wait_s.append(time.perf_counter() - start)


def run(args: argparse.Namespace, asynchronous: bool, folder: Path) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(args.width, args.width) for _ in range(args.layers)))
    if args.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-5)
    saver = SaveTrainingStateCallback(
        str(folder), save_every_n_steps=args.save_every, save_at_end=False, max_checkpoints=1,
        handle_signals=(), asynchronous=asynchronous,
    )  # fmt: skip
    trainer = TimedTrainer(model, nn.MSELoss(), optimizer, callbacks=(saver,))
    num_samples = args.batch_size * args.save_every * args.saves
    data = TensorDataset(torch.randn(num_samples, args.width), torch.randn(num_samples, args.width))
    start = time.perf_counter()
    trainer.train(data, num_epochs=1, per_device_batch_size=args.batch_size)
    total = time.perf_counter() - start
    return {"blocked": statistics.median(trainer.save_s), "end_wait": sum(trainer.wait_s), "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--save-every", type=int, default=30, help="optimizer updates between saves")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dir", default=None, help="where to write the states (default: a temporary folder)")
    args = parser.parse_args()
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"model: {params / 1e6:.1f}M parameters, optimizer {args.optimizer}, a save every {args.save_every} updates"
    )
    results = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for mode in ("sync", "async"):
            results[mode] = run(args, mode == "async", Path(folder) / mode)
            figures = results[mode]
            print(
                f"{mode:5s}: blocked per save {figures['blocked'] * 1e3:8.1f} ms (median of {args.saves}), "
                f"wait at the end {figures['end_wait'] * 1e3:8.1f} ms, whole run {figures['total']:6.1f} s"
            )
    ratio = results["async"]["blocked"] / results["sync"]["blocked"]
    print(f"RATIO async_blocked_per_save/sync_blocked_per_save = {ratio:.3f}")


if __name__ == "__main__":
    main()
