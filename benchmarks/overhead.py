"""Per-step overhead of the Trainer against a hand-written PyTorch loop.

Four loops train the same tiny MLP (32 -> 32 -> 10, so that per-step framework cost, not
arithmetic, dominates) on the same data, with the same seed, batch size, optimizer and number
of optimizer steps:

- ``plain``: a hand-written PyTorch loop: ``DataLoader(shuffle=True)``, ``model.train()``,
  forward, loss, ``backward``, ``optimizer.step``, ``zero_grad``; the epoch loss is summed on
  the device and read once per epoch, as a careful user would.
- ``accelerate``: the same loop after ``Accelerator().prepare(model, optimizer, loader)``,
  with ``accelerator.backward``.
- ``trainer_default_callbacks``: ``Trainer.train`` with ``DEFAULT_CALLBACKS`` exactly as users
  get them (progress bar and printing included).
- ``trainer_no_callbacks``: ``Trainer.train`` with ``callbacks=()``: the Trainer logging nothing.
- ``trainer_tracking_every_50``: ``Trainer.train`` with only
  ``TrackingCallback(["csv"], log_every_n_steps=50)``: step metrics measured and written to a
  CSV file every 50 updates (and the epoch loss at each epoch's end), against
  ``trainer_no_callbacks`` (its own ``RATIO`` line; the goal is within 2% per step).

``--loops`` measures only some of them (``plain`` is always measured: the ratios need it).

How the per-step cost is measured: each loop is timed for a short run (``--short-epochs``
whole epochs) and a long run (that plus about ``--steps`` more optimizer steps, rounded up to
whole epochs), each starting from a freshly built model and optimizer. The per-step cost is
``(t_long - t_short) / (steps_long - steps_short)``: everything done once per run (Trainer
construction, ``accelerator.prepare``, data-loader creation, seeding, run-start and run-end
callbacks) cancels out, while everything done per step or per epoch (creating the data-loader
iterator, opening the progress bar, recording the epoch loss, printing the epoch's metrics) is
counted, spread over the steps of an epoch, as a user pays for it. Construction of the model,
optimizer, loader, Trainer and Accelerator is outside the timed region for every loop.

To keep the figures stable on a small, shared machine: ``torch.set_num_threads(1)`` is set
for the whole process; every loop is run once untimed first (warm-up); the loops are then
measured in a different order in each of ``--repeats`` rounds (interleaved, so that drift in
machine speed affects them all alike). ``ms/step`` is the median over the rounds; ``x plain``
(and the final ``RATIO`` line) is the median over the rounds of the loop's per-step cost
divided by the plain loop's in the same round, which cancels slow spells that span a round.
On a CPU device the clock is this process's CPU time (``time.process_time``), which other
processes competing for the cores disturb far less than elapsed time; on an accelerator it is
elapsed time (each loop ends by reading a loss, which waits for the device). stdout and stderr
are sent to ``os.devnull`` while a loop runs, so the Trainer's progress bar and messages are
produced (and paid for) but do not flood the terminal. Every run checks that it made exactly
the expected number of optimizer steps. Results and profile: docs/benchmarks.md.

``--instructions`` also counts each loop's instructions per step, the same way (two run
lengths differenced), in one round under valgrind's callgrind after an uninstrumented warm-up
(``benchmarks/callgrind.py``, shared with ``benchmarks/front.py``): a figure that other programs
on a shared machine cannot disturb, printed as ``INSTRUCTIONS_RATIO`` lines beside the ``RATIO``
ones. Under callgrind a step takes about 50 times longer. ``--repeats 0 --instructions`` counts
only, without the timed rounds.

Run from the repository root::

    .venv/bin/python benchmarks/overhead.py
    .venv/bin/python benchmarks/overhead.py --steps 2048 --repeats 21 --json-out overhead.json
    .venv/bin/python benchmarks/overhead.py --loops trainer_no_callbacks trainer_tracking_every_50 --repeats 31
    .venv/bin/python benchmarks/overhead.py --repeats 0 --instructions --steps 512   # minutes
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Measure the checkout this script lives in, whether or not the package is installed. The
# entry replaces the script's own folder, so sys.path keeps its usual length (accelerate 1.15's
# optimizer wrapper searches it on every step: see docs/benchmarks.md).
REPO = Path(__file__).resolve().parents[1]
sys.path[0] = str(REPO)

import accelerate  # noqa: E402
from accelerate import Accelerator  # noqa: E402

from benchmarks.callgrind import callgrind_control, region_instructions  # noqa: E402
from pytorch_accelerated import Trainer  # noqa: E402
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrackingCallback  # noqa: E402

SEED = 0
NUM_FEATURES, HIDDEN, NUM_CLASSES = 32, 32, 10

Clock = Callable[[], float]
# A loop takes the data set, the batch size, a number of epochs and a clock, and returns the
# seconds taken by the training itself and the number of optimizer steps it made.
Loop = Callable[[TensorDataset, int, int, Clock], tuple[float, int]]


def make_dataset(num_samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(SEED)
    inputs = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    targets = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    return TensorDataset(inputs, targets)


def build_model() -> tuple[nn.Module, torch.optim.Optimizer, nn.Module]:
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(NUM_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), nn.CrossEntropyLoss()


def default_device() -> torch.device:
    accelerator_api = getattr(torch, "accelerator", None)
    if accelerator_api is not None and accelerator_api.is_available():
        return torch.device(accelerator_api.current_accelerator())
    return torch.device("cpu")


def seeded_loader(data: TensorDataset, batch_size: int) -> DataLoader:
    return DataLoader(
        data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(SEED)
    )


def plain_loop(data: TensorDataset, batch_size: int, num_epochs: int, clock: Clock) -> tuple[float, int]:
    device = default_device()
    model, optimizer, loss_func = build_model()
    model.to(device)
    loader = seeded_loader(data, batch_size)
    steps = 0
    start = clock()
    for _ in range(num_epochs):
        model.train()
        epoch_loss = torch.zeros((), device=device)
        for inputs, targets in loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            loss = loss_func(model(inputs), targets)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            # Summed on the device: reading it every step would wait for the device each time.
            epoch_loss += loss.detach() * inputs.shape[0]
            steps += 1
        epoch_loss.item()  # read once per epoch (and it waits for the device's queued work)
    return clock() - start, steps


def accelerate_loop(data: TensorDataset, batch_size: int, num_epochs: int, clock: Clock) -> tuple[float, int]:
    accelerator = Accelerator()
    model, optimizer, loss_func = build_model()
    model, optimizer, loader = accelerator.prepare(model, optimizer, seeded_loader(data, batch_size))
    steps = 0
    start = clock()
    for _ in range(num_epochs):
        model.train()
        epoch_loss = torch.zeros((), device=accelerator.device)
        for inputs, targets in loader:
            loss = loss_func(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            epoch_loss += loss.detach() * inputs.shape[0]
            steps += 1
        epoch_loss.item()
    return clock() - start, steps


def trainer_loop(callbacks: tuple | Callable[[str], tuple]) -> Loop:
    """A Trainer loop with ``callbacks``, or with the callbacks that ``callbacks(logging_dir)``
    makes afresh for each run (a tracker writes its files in a new temporary folder)."""

    def run(data: TensorDataset, batch_size: int, num_epochs: int, clock: Clock) -> tuple[float, int]:
        with tempfile.TemporaryDirectory() as logging_dir:
            model, optimizer, loss_func = build_model()
            run_callbacks = callbacks(logging_dir) if callable(callbacks) else callbacks
            trainer = Trainer(model, loss_func, optimizer, callbacks=run_callbacks)
            start = clock()
            trainer.train(data, num_epochs=num_epochs, per_device_batch_size=batch_size, seed=SEED)
            return clock() - start, trainer.progress.global_step

    return run


def tracking_every_50(logging_dir: str) -> tuple:
    return (TrackingCallback(["csv"], log_every_n_steps=50, logging_dir=logging_dir),)


LOOPS: dict[str, Loop] = {
    "plain": plain_loop,
    "accelerate": accelerate_loop,
    "trainer_default_callbacks": trainer_loop(DEFAULT_CALLBACKS),
    "trainer_no_callbacks": trainer_loop(()),
    "trainer_tracking_every_50": trainer_loop(tracking_every_50),
}
#: RATIO lines printed at the end (when both loops were measured): numerator, denominator.
RATIOS = (("trainer_default_callbacks", "plain"), ("trainer_tracking_every_50", "trainer_no_callbacks"))


@contextlib.contextmanager
def output_silenced() -> Iterator[None]:
    with (
        open(os.devnull, "w") as devnull,
        contextlib.redirect_stdout(devnull),
        contextlib.redirect_stderr(devnull),
    ):
        yield


def time_run(name: str, data: TensorDataset, batch_size: int, num_epochs: int, clock: Clock) -> float:
    gc.collect()  # outside the timed region: every run starts with the same garbage (none)
    with output_silenced():
        seconds, steps = LOOPS[name](data, batch_size, num_epochs, clock)
    expected = num_epochs * len(seeded_loader(data, batch_size))
    if steps != expected:
        raise RuntimeError(
            f"{name} made {steps} optimizer steps in {num_epochs} epochs, expected {expected}."
        )
    return seconds


def measured_loops(args: argparse.Namespace) -> list[str]:
    return ["plain", *(name for name in LOOPS if name != "plain" and name in args.loops)]


def measure(
    args: argparse.Namespace,
    data: TensorDataset,
    epochs: tuple[int, int],
    clock: Clock,
    after_warm_up: Callable[[], None] = lambda: None,
) -> dict[str, list[float]]:
    """Per-step seconds of every loop in every round: (t_long - t_short) / extra steps."""
    short_epochs, long_epochs = epochs
    extra_steps = (long_epochs - short_epochs) * len(seeded_loader(data, args.batch_size))
    names = measured_loops(args)
    for name in names:  # warm-up: imports, allocator, accelerate state, first-call caches
        time_run(name, data, args.batch_size, short_epochs, clock)
    after_warm_up()
    per_step: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            t_short = time_run(name, data, args.batch_size, short_epochs, clock)
            t_long = time_run(name, data, args.batch_size, long_epochs, clock)
            per_step[name].append((t_long - t_short) / extra_steps)
    return per_step


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=1024,
        help="optimizer steps in the long run beyond the short one (rounded up to whole epochs)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=15,
        help="interleaved measurement rounds (medians are reported); 0 with --instructions: no timing",
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dataset-size", type=int, default=1024, help="samples in the training set")
    parser.add_argument("--short-epochs", type=int, default=1, help="epochs in the short run")
    parser.add_argument(
        "--clock",
        choices=("auto", "cpu", "wall"),
        default="auto",
        help="cpu: this process's CPU time, steadier on a shared machine but blind to time spent "
        "waiting for an accelerator; wall: elapsed time; auto: cpu on a CPU device, else wall",
    )
    parser.add_argument(
        "--loops",
        nargs="+",
        choices=list(LOOPS),
        default=list(LOOPS),
        help="the loops to measure (plain is always measured)",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per step, one round under valgrind's callgrind (minutes)",
    )
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write every measurement to this file"
    )
    parser.add_argument("--child", choices=("instructions",), help=argparse.SUPPRESS)
    args = parser.parse_args()
    for option in ("steps", "repeats", "batch_size", "dataset_size", "short_epochs"):
        if getattr(args, option) < (0 if option == "repeats" and args.instructions else 1):
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    return args


def instructions_per_step(args: argparse.Namespace, measured_steps: int) -> dict[str, float]:
    """Instructions per step of each loop, counted by callgrind in one round after the warm-up
    (see benchmarks/callgrind.py; the count does not depend on what else the machine runs):
    (n_long - n_short) / extra steps."""
    options = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("steps", "batch_size", "dataset_size", "short_epochs")
    ]
    child = ["--child", "instructions", "--loops", *args.loops, *options]
    regions = region_instructions(Path(__file__).resolve(), child, REPO)
    per_step = {
        name: (regions[f"{name}:long"] - regions[f"{name}:short"]) / measured_steps
        for name in measured_loops(args)
    }
    print(f"\n{'loop':<28}{'instructions/step':>18}{'x plain':>10}")
    for name, value in per_step.items():
        print(f"{name:<28}{value:>18,.0f}{value / per_step['plain']:>10.3f}")
    return per_step


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    device = default_device()
    clock_name = args.clock if args.clock != "auto" else ("cpu" if device.type == "cpu" else "wall")
    clock: Clock = time.process_time if clock_name == "cpu" else time.perf_counter
    data = make_dataset(args.dataset_size)
    steps_per_epoch = len(seeded_loader(data, args.batch_size))
    extra_epochs = -(-args.steps // steps_per_epoch)
    epochs = (args.short_epochs, args.short_epochs + extra_epochs)
    if args.child == "instructions":  # under callgrind: one round, counted after the warm-up
        args.repeats = 1
        measure(args, data, epochs, time.process_time, after_warm_up=lambda: callgrind_control("-i", "on"))
        order = [f"{name}:{length}" for name in measured_loops(args) for length in ("short", "long")]
        print(json.dumps({"order": order}))
        return
    print(
        f"torch {torch.__version__}, accelerate {accelerate.__version__}, python {platform.python_version()}, "
        f"device {device}, torch threads {torch.get_num_threads()}, {clock_name} clock\n"
        f"MLP {NUM_FEATURES}->{HIDDEN}->{NUM_CLASSES}, batch {args.batch_size}, {args.dataset_size} samples "
        f"({steps_per_epoch} steps/epoch); per-step cost = (t[{epochs[1]} epochs] - t[{epochs[0]} epochs]) "
        f"/ {extra_epochs * steps_per_epoch} steps; {args.repeats} interleaved rounds after a warm-up",
        flush=True,
    )
    per_step = measure(args, data, epochs, clock) if args.repeats else {}
    median = {name: statistics.median(values) for name, values in per_step.items()}
    ratio = {  # paired: each round's cost over the plain loop's in the same round
        name: statistics.median(t / p for t, p in zip(values, per_step["plain"], strict=True))
        for name, values in per_step.items()
    }
    if per_step:
        print(f"\n{'loop':<28}{'ms/step':>10}{'min':>9}{'max':>9}{'x plain':>10}")
    for name, values in per_step.items():
        print(
            f"{name:<28}{median[name] * 1e3:>10.4f}{min(values) * 1e3:>9.4f}{max(values) * 1e3:>9.4f}"
            f"{ratio[name]:>10.2f}"
        )
    instructions = instructions_per_step(args, extra_epochs * steps_per_epoch) if args.instructions else {}
    if args.json_out is not None:
        report = {
            "config": {
                **vars(args),
                "json_out": str(args.json_out),
                "steps_per_epoch": steps_per_epoch,
                "measured_steps": extra_epochs * steps_per_epoch,
                "epochs": list(epochs),
            },
            "environment": {
                "torch": torch.__version__,
                "accelerate": accelerate.__version__,
                "python": platform.python_version(),
                "device": str(device),
                "torch_threads": torch.get_num_threads(),
                "clock": clock_name,
            },
            "seconds_per_step": per_step,
            "median_seconds_per_step": median,
            "ratio_to_plain": ratio,
            "instructions_per_step": instructions,
        }
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    for name, reference in RATIOS:
        digits = 2 if reference == "plain" else 3  # the goal against no logging is 2%
        if name in per_step and reference in per_step:
            paired = statistics.median(
                t / r for t, r in zip(per_step[name], per_step[reference], strict=True)
            )
            print(f"RATIO {name}/{reference} = {paired:.{digits}f}")
        if name in instructions and reference in instructions:
            print(
                f"INSTRUCTIONS_RATIO {name}/{reference} = {instructions[name] / instructions[reference]:.{digits + 1}f}"
            )


if __name__ == "__main__":
    main()
