"""Per-update cost of the learning-rate range test against ``train()`` on the same model.

Two loops make the same number of optimizer updates of the same model, on the same data, with the
same batch size and optimizer:

- ``train``: ``Trainer(callbacks=()).train(..., max_num_train_steps=N)``;
- ``range_test``: ``Trainer(callbacks=()).find_learning_rate(..., num_steps=N)``, over a range of
  small learning rates with ``divergence_factor=None``, so that every run makes its N updates. Its
  extra work per update: the exponential schedule's step, the recorder's bookkeeping of each batch,
  and every 10 updates one read of the losses.

The per-update cost is measured as in benchmarks/overhead.py: each loop runs a short run
(``--short-steps`` updates) and a long one (that plus ``--steps``), each from a fresh model and
Trainer, and ``(t_long - t_short) / steps`` cancels what is done once per run (the range test's
snapshot of the model, optimizer and RNGs, and putting them back). After a warm-up, the two loops
are measured in alternating order in each of ``--repeats`` rounds; the clock is this process's CPU
time (``time.process_time``) on a CPU device, elapsed time on an accelerator. ``RATIO`` is the
median over the rounds of the range test's per-update cost over ``train()``'s in the same round.

``--instructions`` also counts each loop's instructions per update the same way (two run lengths
differenced), in one round under valgrind's callgrind after an uninstrumented warm-up
(benchmarks/callgrind.py, as benchmarks/overhead.py does): a figure that other programs on a
shared machine cannot disturb, printed as an ``INSTRUCTIONS_RATIO`` line. ``--repeats 0
--instructions`` counts only.

``--model`` picks the model: ``tiny`` (benchmarks/overhead.py's MLP 32 -> 32 -> 10, where framework
cost dominates) or ``digits`` (examples/train_digits.py's MLP 64 -> 128 -> 64 -> 10 on 8x8 digits).

    .venv/bin/python benchmarks/lr_finder.py
    .venv/bin/python benchmarks/lr_finder.py --model digits --steps 2000 --repeats 11
    .venv/bin/python benchmarks/lr_finder.py --repeats 0 --instructions --steps 300   # minutes
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

from benchmarks.callgrind import callgrind_control, region_instructions  # noqa: E402
from benchmarks.overhead import (  # noqa: E402
    NUM_CLASSES,
    SEED,
    build_model,
    default_device,
    make_dataset,
    output_silenced,
)
from pytorch_accelerated import Trainer  # noqa: E402


def digits_model() -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, NUM_CLASSES)
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), nn.CrossEntropyLoss()


def digits_dataset(num_samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(num_samples, 64, generator=generator)
    return TensorDataset(inputs, torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator))


MODELS = {"tiny": (build_model, make_dataset), "digits": (digits_model, digits_dataset)}

Run = Callable[[Trainer, TensorDataset, int, int], int]


def train_run(trainer: Trainer, data: TensorDataset, batch_size: int, steps: int) -> int:
    trainer.train(data, num_epochs=1, per_device_batch_size=batch_size, max_num_train_steps=steps, seed=SEED)
    return trainer.progress.global_step


def range_test_run(trainer: Trainer, data: TensorDataset, batch_size: int, steps: int) -> int:
    result = trainer.find_learning_rate(
        data,
        per_device_batch_size=batch_size,
        start_lr=1e-5,
        end_lr=1e-3,
        num_steps=steps,
        divergence_factor=None,
        seed=SEED,
    )
    return len(result.losses)


LOOPS: dict[str, Run] = {"train": train_run, "range_test": range_test_run}


def timed(
    name: str, args: argparse.Namespace, data: TensorDataset, steps: int, clock: Callable[[], float]
) -> float:
    build = MODELS[args.model][0]
    model, optimizer, loss_func = build()
    trainer = Trainer(model, loss_func, optimizer, callbacks=())
    gc.collect()
    with output_silenced():
        start = clock()
        made = LOOPS[name](trainer, data, args.batch_size, steps)
        seconds = clock() - start
    if made != steps:
        raise RuntimeError(f"{name} made {made} updates, expected {steps}")
    return seconds


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=list(MODELS), default="tiny")
    parser.add_argument(
        "--steps", type=int, default=1000, help="updates in the long run beyond the short one"
    )
    parser.add_argument("--short-steps", type=int, default=100)
    parser.add_argument(
        "--repeats", type=int, default=9, help="timed rounds; 0 with --instructions: no timing"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dataset-size", type=int, default=1024)
    parser.add_argument("--instructions", action="store_true", help="also count instructions (callgrind)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def instructions_child(args: argparse.Namespace, data: TensorDataset) -> None:
    """Under callgrind: warm up uninstrumented, then run each loop's two regions once, counted."""
    for name in LOOPS:
        timed(name, args, data, args.short_steps, time.process_time)
    callgrind_control("-i", "on")
    order = []
    for name in LOOPS:
        for label, steps in (("short", args.short_steps), ("long", args.short_steps + args.steps)):
            timed(name, args, data, steps, time.process_time)
            order.append(f"{name}:{label}")
    print(json.dumps({"order": order}))


def count_instructions(args: argparse.Namespace) -> None:
    options = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("model", "steps", "short_steps", "batch_size", "dataset_size")
    ]
    regions = region_instructions(Path(__file__).resolve(), ["--child", *options], REPO)
    per_update = {name: (regions[f"{name}:long"] - regions[f"{name}:short"]) / args.steps for name in LOOPS}
    for name, value in per_update.items():
        print(f"{name:<12} {value:,.0f} instructions/update")
    print(f"INSTRUCTIONS_RATIO range_test/train = {per_update['range_test'] / per_update['train']:.4f}")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    device = default_device()
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    data = MODELS[args.model][1](args.dataset_size)
    if args.child:
        instructions_child(args, data)
        return
    long_steps = args.short_steps + args.steps
    print(
        f"model {args.model} ({'32->32->10' if args.model == 'tiny' else '64->128->64->10'}), batch "
        f"{args.batch_size}, device {device}, torch {torch.__version__}; per-update cost = (t[{long_steps}] - "
        f"t[{args.short_steps}]) / {args.steps}; {args.repeats} alternating rounds after a warm-up",
        flush=True,
    )
    if args.repeats:
        time_loops(args, data, clock)
    if args.instructions:
        count_instructions(args)


def time_loops(args: argparse.Namespace, data: TensorDataset, clock: Callable[[], float]) -> None:
    long_steps = args.short_steps + args.steps
    for name in LOOPS:  # warm-up
        timed(name, args, data, args.short_steps, clock)
    per_update: dict[str, list[float]] = {name: [] for name in LOOPS}
    for round_index in range(args.repeats):
        names = list(LOOPS) if round_index % 2 == 0 else list(reversed(LOOPS))
        for name in names:
            short = timed(name, args, data, args.short_steps, clock)
            long = timed(name, args, data, long_steps, clock)
            per_update[name].append((long - short) / args.steps)
    for name, values in per_update.items():
        print(
            f"{name:<12} {statistics.median(values) * 1e3:.4f} ms/update (min {min(values) * 1e3:.4f}, max {max(values) * 1e3:.4f})"
        )
    ratio = statistics.median(
        r / t for r, t in zip(per_update["range_test"], per_update["train"], strict=True)
    )
    print(f"RATIO range_test/train = {ratio:.3f}")


if __name__ == "__main__":
    main()
