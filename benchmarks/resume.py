"""Time to resume mid-epoch does not grow with the position: skipped batches are never loaded.

A training set whose ``__getitem__`` sleeps ``--load-ms`` (1 ms by default, a stand-in for
reading and decoding a sample) is trained in batches of 2 for one epoch of ``--num-batches``
batches. Training states are saved at batch k of that epoch, for each k of ``--positions``
(0, 100, 1000 and 5000 by default): one run with a fast copy of the data set (no sleep) steps
through the epoch and saves at each k.

Then, for each k, a fresh Trainer calls ``train(resume_from=state_k)`` on the slow data set,
and a callback notes the time when the first training step starts (after the first batch
still to run has been loaded) and ends the run there. The time from the ``train`` call to
that point is the time to resume; it includes building the data loaders, ``accelerate``'s
``prepare``, reading the state files and loading one batch, all of which are the same for
every k. Loading the k skipped batches instead would add ``k x batch size x load-ms``, shown
beside it.

Meanwhile the data set records every index it is asked for: before the first step of the
resumed run only batch k and the one after it are loaded (accelerate's data loader reads one
batch ahead, to know which batch is the last), and none of the k skipped batches.

Each k is timed ``--repeats`` times in interleaved order (elapsed time: the sleeps are the
point) and the median is reported. The last line is the one to compare across machines::

    RESUME_TIME_RATIO k=5000/k=0 = X.XX

Run from the repository root::

    .venv/bin/python benchmarks/resume.py
    .venv/bin/python benchmarks/resume.py --positions 0 100 1000 5000 --repeats 7 --json-out resume.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Measure the checkout this script lives in, whether or not the package is installed.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

from pytorch_accelerated import Trainer  # noqa: E402
from pytorch_accelerated.callbacks import TrainerCallback  # noqa: E402

BATCH_SIZE = 2
SEED = 0
MAX_BATCHES_LOADED = 2  # the batch to run and accelerate's look-ahead


class SlowDataset(Dataset):
    """Fixed samples; ``__getitem__`` sleeps ``load_s`` and records the index it was asked for."""

    def __init__(self, num_samples: int, load_s: float) -> None:
        generator = torch.Generator().manual_seed(SEED)
        self.x = torch.randn(num_samples, 8, generator=generator)
        self.y = torch.randn(num_samples, 1, generator=generator)
        self.load_s = load_s
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.load_s:
            time.sleep(self.load_s)
        self.loaded.append(index)
        return self.x[index], self.y[index]


class SaveAtBatches(TrainerCallback):
    """Saves a training state when ``k`` batches of the epoch are done, for each ``k``."""

    def __init__(self, positions: list[int], states_dir: Path) -> None:
        self.positions, self.states_dir = set(positions), states_dir

    def _save_if_wanted(self, trainer: Any) -> None:
        k = trainer.progress.batch_index
        if k in self.positions:
            self.positions.discard(k)
            trainer.save_training_state(self.states_dir / f"k{k}")
        if not self.positions:
            raise _Done

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        self._save_if_wanted(trainer)

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self._save_if_wanted(trainer)


class StopAtFirstStep(TrainerCallback):
    """Notes when the first training step of the resumed run starts, and ends the run."""

    def __init__(self) -> None:
        self.reached_at: float | None = None
        self.batch_index: int | None = None

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        self.reached_at = time.perf_counter()
        self.batch_index = trainer.progress.batch_index
        raise _Done


class _Done(Exception):
    pass


def make_trainer(callback: TrainerCallback) -> Trainer:
    torch.manual_seed(SEED)
    model = nn.Linear(8, 1)
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(callback,))


def train(trainer: Trainer, dataset: Dataset, resume_from: Path | None = None) -> None:
    with contextlib.suppress(_Done):
        trainer.train(
            dataset, num_epochs=1, per_device_batch_size=BATCH_SIZE, resume_from=resume_from, seed=SEED
        )


def save_states(positions: list[int], num_samples: int, states_dir: Path) -> None:
    train(make_trainer(SaveAtBatches(positions, states_dir)), SlowDataset(num_samples, load_s=0.0))


def time_resume(state: Path, dataset: SlowDataset, shuffle_order: list[int]) -> dict[str, Any]:
    stop = StopAtFirstStep()
    trainer = make_trainer(stop)
    dataset.loaded.clear()
    start = time.perf_counter()
    train(trainer, dataset, resume_from=state)
    assert stop.reached_at is not None and stop.batch_index is not None, (
        "the resumed run never started a step"
    )
    k = stop.batch_index
    skipped = set(shuffle_order[: k * BATCH_SIZE])
    loaded = list(dataset.loaded)
    return {
        "seconds": stop.reached_at - start,
        "resumed_at_batch": k,
        "getitem_calls": len(loaded),
        "skipped_samples_loaded": len(skipped.intersection(loaded)),
        # Batch k, then at most accelerate's look-ahead of one batch (it loads the next batch
        # before handing one out, to know which batch is the last).
        "loaded_batch_k_onwards": loaded == shuffle_order[k * BATCH_SIZE : k * BATCH_SIZE + len(loaded)]
        and BATCH_SIZE <= len(loaded) <= MAX_BATCHES_LOADED * BATCH_SIZE,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[0, 100, 1000, 5000])
    parser.add_argument("--num-batches", type=int, default=5100, help="batches in the epoch")
    parser.add_argument("--load-ms", type=float, default=1.0, help="sleep in each __getitem__")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    positions = sorted(set(args.positions))
    if positions[-1] >= args.num_batches:
        parser.error(
            f"--num-batches ({args.num_batches}) must exceed the largest position ({positions[-1]})."
        )
    torch.set_num_threads(1)
    num_samples = args.num_batches * BATCH_SIZE
    dataset = SlowDataset(num_samples, load_s=args.load_ms / 1000)
    # The epoch's order (the Trainer's shuffle depends only on the seed and the epoch).
    shuffle_order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(SEED)).tolist()

    with tempfile.TemporaryDirectory() as tmp, open(os.devnull, "w") as devnull:
        states_dir = Path(tmp)
        setup_start = time.perf_counter()
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            save_states(positions, num_samples, states_dir)
        setup_s = time.perf_counter() - setup_start
        with contextlib.redirect_stdout(devnull), contextlib.redirect_stderr(devnull):
            time_resume(states_dir / f"k{positions[0]}", dataset, shuffle_order)  # warm-up
            rounds: dict[int, list[dict[str, Any]]] = {k: [] for k in positions}
            for repeat in range(args.repeats):
                order = positions if repeat % 2 == 0 else positions[::-1]
                for k in order:
                    rounds[k].append(time_resume(states_dir / f"k{k}", dataset, shuffle_order))

    rows = []
    for k in positions:
        results = rounds[k]
        rows.append(
            {
                "k": k,
                "median_s": statistics.median(r["seconds"] for r in results),
                "min_s": min(r["seconds"] for r in results),
                "max_s": max(r["seconds"] for r in results),
                "getitem_calls": max(r["getitem_calls"] for r in results),
                "skipped_samples_loaded": max(r["skipped_samples_loaded"] for r in results),
                "resumed_at_batch": {r["resumed_at_batch"] for r in results} == {k},
                "loaded_batch_k_onwards": all(r["loaded_batch_k_onwards"] for r in results),
                "loading_skipped_would_take_s": k * BATCH_SIZE * args.load_ms / 1000,
            }
        )

    print(
        f"Resume mid-epoch: {args.num_batches} batches of {BATCH_SIZE}, __getitem__ sleeps {args.load_ms:g} ms; "
        f"median of {args.repeats} (states saved in {setup_s:.1f} s)"
    )
    print(f"torch {torch.__version__}, python {platform.python_version()}, {platform.machine()}, 1 thread")
    header = f"{'k':>6} | {'resume (median)':>15} | {'min - max':>15} | {'__getitem__ calls':>17} | {'skipped loaded':>14} | {'loading k batches':>17}"
    print(header)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['k']:>6} | {row['median_s'] * 1000:>12.1f} ms | "
            f"{row['min_s'] * 1000:>5.0f} - {row['max_s'] * 1000:>4.0f} ms | {row['getitem_calls']:>17} | "
            f"{row['skipped_samples_loaded']:>14} | {row['loading_skipped_would_take_s'] * 1000:>14.0f} ms"
        )
    problems = [
        f"k={row['k']}: resumed at the wrong batch, or loaded samples other than batch k and the next"
        for row in rows
        if not row["resumed_at_batch"] or row["skipped_samples_loaded"] or not row["loaded_batch_k_onwards"]
    ]
    print(
        "Samples loaded before the first step: batch k and the next (accelerate's look-ahead); skipped "
        "samples loaded: " + ("; ".join(problems) if problems else "none")
    )
    ratio = rows[-1]["median_s"] / rows[0]["median_s"]
    print(f"RESUME_TIME_RATIO k={rows[-1]['k']}/k={rows[0]['k']} = {ratio:.2f}")
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {"rows": rows, "ratio": ratio, "args": vars(args) | {"json_out": str(args.json_out)}},
                indent=2,
            )
        )
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
