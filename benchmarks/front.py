"""What the Trainer costs beside the training step: evaluation, start-up, import and memory.

Four figures, each against the same work done without the Trainer, with the goals of issue 11:

- ``EVAL_RATIO``: time per evaluation batch of ``trainer.evaluate(...)`` (default callbacks,
  progress bar included) over a hand-written ``torch.no_grad()`` loop over the same data and
  model (``model.eval()``, forward, loss, the loss summed on the device and read once). The
  per-batch cost is found by differencing two data-set lengths, ``(t_long - t_short) /
  (batches_long - batches_short)``, so that what is done once per evaluation (building and
  preparing the loader, the run-start and run-end events, the one gather of the loss across
  processes) cancels. The evaluation inside ``train`` (one training batch, then the evaluation
  set) is measured the same way: the training part is the same in both runs and cancels.
  Interleaved rounds, the process's CPU time (on a CPU device), output silenced, the median over
  rounds of each round's ratio to the plain loop: the machinery of ``benchmarks/overhead.py``.
  ``--instructions`` also counts the instructions per batch of the same loops under valgrind's
  callgrind, which other programs on the machine cannot disturb (``EVAL_INSTRUCTIONS_RATIO``):
  instrumentation is switched on after the warm-up, and callgrind dumps its counters at every
  call of the clock (``--dump-before=time_process_time``), so each timed region is one dump.
  Goal: at most 1.05x.
- ``FIRST_UPDATE_MS``: from calling ``trainer.train(...)`` (default callbacks, the small MLP of
  ``overhead.py``) to the end of the first optimizer update (the first ``on_train_step_end``),
  in a fresh process per repeat (after the imports, the model and the Trainer are built: the
  first ``train`` of a process, as users run it), CPU time; the median over the fresh processes.
  The same figure for a later ``train`` in the same process is printed beside it. Goal: at
  most 50 ms.
- ``IMPORT_S``: in the same fresh processes, ``import torch, accelerate`` first, then the time
  of ``import pytorch_accelerated`` and ``from pytorch_accelerated import Trainer`` (CPU time;
  elapsed time beside it); the median over the processes. One more process, run first (it
  also warms the file cache) and not counted, runs under ``python -X importtime``: the largest
  contributors after torch and accelerate are listed. The optional extras (the
  trackers' packages, matplotlib, pandas) must not be imported by the package: any that is,
  and was not already imported by torch or accelerate, is listed and the script exits 1.
  Goal: at most 0.3 s.
- ``PEAK_MB_ABOVE_PLAIN``: the peak resident memory of a fresh process that trains a wider MLP
  (32 -> ``--memory-hidden`` -> ``--memory-hidden`` -> 10, 4.3M parameters by default: a copy
  of its weights would be 17 MB) for ``--memory-epochs`` with the Trainer (default callbacks),
  minus that of a fresh process running the plain loop on the same model and data, after the
  same imports (torch, accelerate and the package's callbacks in both); the median over
  ``--memory-repeats`` processes of each, interleaved. The peak is Linux's ``VmHWM``, reset
  (``/proc/self/clear_refs``) once the model and data are built, just before the run: the
  imports peak higher than a small run does, so ``ru_maxrss`` would only show the imports.
  glibc's mmap threshold is fixed in these processes (``MALLOC_MMAP_THRESHOLD_``; otherwise
  the peak varies by one weight-sized tensor from run to run). On a CUDA device
  ``torch.cuda.max_memory_allocated`` is compared too. Goal: at most 15 MB.

Run from the repository root (a few minutes on a 2-core machine)::

    .venv/bin/python benchmarks/front.py
    .venv/bin/python benchmarks/front.py --json-out front.json
    .venv/bin/python benchmarks/front.py --quick          # a smoke run, seconds: figures are noise

The last lines are the figures, each with its goal. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Measure the checkout this script lives in (as overhead.py does, replacing the script's folder).
sys.path[0] = str(REPO)

from benchmarks.callgrind import callgrind_control, region_instructions  # noqa: E402

#: Packages of the optional extras, which ``import pytorch_accelerated`` must not import.
OPTIONAL_EXTRAS = (
    "matplotlib",
    "pandas",
    "tensorboard",
    "mlflow",
    "wandb",
    "comet_ml",
    "aim",
    "clearml",
    "dvclive",
    "swanlab",
    "trackio",
    "timm",
    "transformers",
    "torchmetrics",
)
#: glibc otherwise moves its mmap threshold as large blocks are freed, so whether a weight-sized
#: tensor is kept in the heap or returned to the system varies from run to run, and the peak by
#: about one such tensor (16 MB here); a fixed threshold makes the peak repeatable to 0.1 MB.
MEMORY_ENVIRONMENT = {"MALLOC_MMAP_THRESHOLD_": "131072"}
#: Printed to stderr before and after the package's import, around its ``-X importtime`` lines.
IMPORT_MARK = "-- pytorch_accelerated import --"
GOALS = {"EVAL_RATIO": 1.05, "FIRST_UPDATE_MS": 50.0, "IMPORT_S": 0.3, "PEAK_MB_ABOVE_PLAIN": 15.0}


def load_overhead() -> ModuleType:
    """``benchmarks/overhead.py`` (its data, model and measuring helpers), without putting the
    benchmarks folder on ``sys.path``."""
    if "overhead" not in sys.modules:
        spec = importlib.util.spec_from_file_location("overhead", Path(__file__).with_name("overhead.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["overhead"] = module
        spec.loader.exec_module(module)
    return sys.modules["overhead"]


# ---------------------------------------------------------------------------- evaluation


def plain_eval(data: Any, batch_size: int, clock: Callable[[], float]) -> tuple[float, int]:
    """A hand-written evaluation loop: ``model.eval()``, ``torch.no_grad()``, forward, loss."""
    import torch
    from torch.utils.data import DataLoader

    overhead = load_overhead()
    device = overhead.default_device()
    model, _, loss_func = overhead.build_model()
    model.to(device)
    loader = DataLoader(data, batch_size=batch_size)
    batches = 0
    start = clock()
    model.eval()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for inputs, targets in loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            total += loss_func(model(inputs), targets) * inputs.shape[0]
            batches += 1
    (total / len(data)).item()  # the mean loss, read once
    return clock() - start, batches


def trainer_eval(callbacks: Any, inside_train: bool) -> Callable[..., tuple[float, int]]:
    """``trainer.evaluate(data)``, or ``train`` on one batch with ``eval_dataset=data``."""

    def run(data: Any, batch_size: int, clock: Callable[[], float]) -> tuple[float, int]:
        from pytorch_accelerated import Trainer

        overhead = load_overhead()
        model, optimizer, loss_func = overhead.build_model()
        trainer = Trainer(model, loss_func, optimizer, callbacks=callbacks)
        one_batch = overhead.make_dataset(batch_size)
        start = clock()
        if inside_train:
            trainer.train(one_batch, num_epochs=1, eval_dataset=data, per_device_batch_size=batch_size)
        else:
            trainer.evaluate(data, per_device_batch_size=batch_size)
        seconds = clock() - start
        return seconds, len(trainer.eval_dataloader)

    return run


def eval_loops() -> dict[str, Callable[..., tuple[float, int]]]:
    from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS

    return {
        "plain": plain_eval,
        "trainer_evaluate": trainer_eval(DEFAULT_CALLBACKS, inside_train=False),
        "trainer_evaluate_no_callbacks": trainer_eval((), inside_train=False),
        "trainer_train_eval": trainer_eval(DEFAULT_CALLBACKS, inside_train=True),
    }


def measure_eval(
    args: argparse.Namespace, clock: Callable[[], float], after_warm_up: Callable[[], None] = lambda: None
) -> dict[str, list[float]]:
    """Seconds per evaluation batch of every loop in every round: (t_long - t_short) / extra."""
    import gc

    overhead = load_overhead()
    loops = eval_loops()
    sizes = (
        args.eval_short_batches * args.batch_size,
        (args.eval_short_batches + args.eval_extra_batches) * args.batch_size,
    )
    datasets = [overhead.make_dataset(size) for size in sizes]

    def timed(name: str, data: Any) -> float:
        gc.collect()
        with overhead.output_silenced():
            seconds, batches = loops[name](data, args.batch_size, clock)
        if batches != len(data) // args.batch_size:
            raise RuntimeError(
                f"{name} ran {batches} evaluation batches, expected {len(data) // args.batch_size}."
            )
        return seconds

    names = list(loops)
    for name in names:  # warm-up
        timed(name, datasets[0])
    after_warm_up()
    per_batch: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(args.eval_repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            t_short, t_long = timed(name, datasets[0]), timed(name, datasets[1])
            per_batch[name].append((t_long - t_short) / args.eval_extra_batches)
    return per_batch


def report_eval(per_batch: dict[str, list[float]]) -> dict[str, Any]:
    ratio = {
        name: statistics.median(t / p for t, p in zip(values, per_batch["plain"], strict=True))
        for name, values in per_batch.items()
    }
    print(f"\n{'evaluation loop':<32}{'us/batch':>10}{'min':>9}{'max':>9}{'x plain':>10}")
    for name, values in per_batch.items():
        print(
            f"{name:<32}{statistics.median(values) * 1e6:>10.1f}{min(values) * 1e6:>9.1f}"
            f"{max(values) * 1e6:>9.1f}{ratio[name]:>10.3f}"
        )
    return {"seconds_per_batch": per_batch, "ratio_to_plain": ratio}


# ---------------------------------------------------------------------------- instructions


def child_eval_instructions(args: argparse.Namespace) -> dict[str, Any]:
    """Under callgrind: warm up uninstrumented, then run one round of the evaluation loops;
    callgrind dumps its counts at every call of the clock, so each timed region is one dump."""
    import torch

    torch.set_num_threads(1)
    args.eval_repeats = 1
    per_batch = measure_eval(args, time.process_time, after_warm_up=lambda: callgrind_control("-i", "on"))
    return {"order": [f"{name}:{length}" for name in per_batch for length in ("short", "long")]}


def eval_instructions(args: argparse.Namespace) -> dict[str, float]:
    """Instructions per evaluation batch of each loop, counted by callgrind in one run (the
    count does not depend on what else the machine runs): (n_long - n_short) / extra batches."""
    options = [
        f"--{name.replace('_', '-')}={getattr(args, name)}"
        for name in ("batch_size", "eval_short_batches", "eval_extra_batches")
    ]
    regions = region_instructions(Path(__file__).resolve(), ["--child", "eval-instructions", *options], REPO)
    names = dict.fromkeys(entry.split(":")[0] for entry in regions)
    per_batch = {
        name: (regions[f"{name}:long"] - regions[f"{name}:short"]) / args.eval_extra_batches for name in names
    }
    print(f"\n{'evaluation loop':<32}{'instructions/batch':>20}{'x plain':>10}")
    for name, value in per_batch.items():
        print(f"{name:<32}{value:>20,.0f}{value / per_batch['plain']:>10.3f}")
    return per_batch


# ---------------------------------------------------------------------------- fresh processes


def first_update_seconds(clock: Callable[[], float]) -> float:
    """Build a Trainer (default callbacks) on overhead.py's MLP, call ``train`` and return the
    time from the call to the end of the first optimizer update."""
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback

    overhead = load_overhead()
    marks: list[float] = []

    class FirstUpdate(TrainerCallback):
        def on_train_step_end(self, trainer: Any, is_update_step: bool = False, **kwargs: Any) -> None:
            if is_update_step and not marks:
                marks.append(clock())

    model, optimizer, loss_func = overhead.build_model()
    data = overhead.make_dataset(64)
    trainer = Trainer(model, loss_func, optimizer, callbacks=(*DEFAULT_CALLBACKS, FirstUpdate()))
    with overhead.output_silenced():
        start = clock()
        trainer.train(data, num_epochs=1, per_device_batch_size=16, max_num_train_steps=1)
    return marks[0] - start


def child_start_up() -> dict[str, Any]:
    """In a fresh process: time the package's import after torch and accelerate, list the
    modules it imports, then time ``train`` to the first update, twice."""
    import accelerate  # noqa: F401
    import torch

    torch.set_num_threads(1)
    before = set(sys.modules)
    rss_before = status_kb("VmRSS")
    print(IMPORT_MARK, file=sys.stderr, flush=True)  # the package's lines for python -X importtime
    cpu, wall = time.process_time(), time.perf_counter()
    import pytorch_accelerated  # noqa: F401

    package = (time.process_time() - cpu, time.perf_counter() - wall)
    from pytorch_accelerated import Trainer  # noqa: F401

    trainer = (time.process_time() - cpu, time.perf_counter() - wall)
    print(IMPORT_MARK, file=sys.stderr, flush=True)
    new_modules = set(sys.modules) - before
    rss_after = status_kb("VmRSS")
    extras = sorted(name for name in new_modules if name.split(".")[0] in OPTIONAL_EXTRAS)
    first = [first_update_seconds(time.process_time), first_update_seconds(time.process_time)]
    return {
        "import_package_cpu_s": package[0],
        "import_package_wall_s": package[1],
        "import_trainer_cpu_s": trainer[0],
        "import_trainer_wall_s": trainer[1],
        "import_rss_kb": rss_after - rss_before,
        "modules_imported": len(new_modules),
        "optional_extras_imported": extras,
        "first_update_cpu_s": first[0],
        "second_run_first_update_cpu_s": first[1],
    }


def status_kb(field: str) -> int:
    """A memory figure of this process from ``/proc/self/status`` (Linux), in kB: ``VmRSS`` is
    the resident memory now, ``VmHWM`` its peak since the process started or since
    :func:`reset_peak_rss`."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> int:
    """Make ``VmHWM`` the resident memory now (Linux >= 4.0), so that the peak measures the run,
    not the imports before it (which peak higher than a small run does); return it, in kB."""
    Path("/proc/self/clear_refs").write_text("5")
    return status_kb("VmHWM")


def memory_run(kind: str, hidden: int, epochs: int) -> tuple[Any, int]:
    """Train the wider MLP with the plain loop or the Trainer (default callbacks); return the
    model and the resident memory (kB) just before the run."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS

    overhead = load_overhead()
    device = overhead.default_device()
    data = overhead.make_dataset(1024)
    torch.manual_seed(overhead.SEED)
    model = nn.Sequential(
        nn.Linear(overhead.NUM_FEATURES, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, overhead.NUM_CLASSES),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_func = nn.CrossEntropyLoss()
    rss_before_run = reset_peak_rss()
    with overhead.output_silenced():
        if kind == "plain":
            model.to(device)
            loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
            for _ in range(epochs):
                model.train()
                for inputs, targets in loader:
                    loss = loss_func(model(inputs.to(device)), targets.to(device))
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
        else:
            trainer = Trainer(model, loss_func, optimizer, callbacks=DEFAULT_CALLBACKS)
            trainer.train(data, num_epochs=epochs, per_device_batch_size=16)
    return model, rss_before_run


def child_memory(kind: str, hidden: int, epochs: int) -> dict[str, Any]:
    """In a fresh process, after the same imports (torch, accelerate, the package and its
    callbacks): the peak resident memory of a training run (and the CUDA peak on CUDA)."""
    import torch

    import pytorch_accelerated.callbacks  # noqa: F401  (the same imports for both loops)

    torch.set_num_threads(1)
    model, rss_before_run = memory_run(kind, hidden, epochs)
    result: dict[str, Any] = {
        "peak_rss_kb": status_kb("VmHWM"),
        "rss_before_run_kb": rss_before_run,
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
    }
    if torch.cuda.is_available():
        result["cuda_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
    return result


def run_child(
    arguments: list[str], environment: dict[str, str] | None = None, python_options: tuple[str, ...] = ()
) -> tuple[dict[str, Any], str]:
    """Run this script in a fresh process with ``arguments``; return the JSON it prints last,
    and its stderr."""
    completed = subprocess.run(
        [sys.executable, *python_options, str(Path(__file__).resolve()), *arguments],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        env={**os.environ, **(environment or {})},
    )
    if completed.returncode != 0:
        raise RuntimeError(f"child {arguments} failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1]), completed.stderr


def import_time_top(stderr: str, limit: int) -> list[tuple[int, int, str]]:
    """From the stderr of a start-up child run with ``python -X importtime``: the modules
    imported after torch and accelerate, largest cumulative time first: (self us, cumulative
    us, name)."""
    rows = []
    for line in stderr.split(IMPORT_MARK + "\n")[1].splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, cumulative_us, name = (part.strip() for part in line[len("import time:") :].split("|"))
            rows.append((int(self_us), int(cumulative_us), name))
    return sorted(rows, key=lambda row: -row[1])[:limit]


# ---------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--eval-short-batches", type=int, default=16, help="batches in the short evaluation set"
    )
    parser.add_argument("--eval-extra-batches", type=int, default=512, help="extra batches in the long one")
    parser.add_argument("--eval-repeats", type=int, default=11, help="interleaved evaluation rounds")
    parser.add_argument(
        "--start-up-repeats",
        type=int,
        default=7,
        help="fresh processes timing the import and the first update",
    )
    parser.add_argument(
        "--memory-repeats", type=int, default=3, help="fresh processes per loop for peak memory"
    )
    parser.add_argument(
        "--memory-hidden", type=int, default=2048, help="width of the MLP trained for peak memory"
    )
    parser.add_argument("--memory-epochs", type=int, default=1)
    parser.add_argument(
        "--figures",
        nargs="+",
        choices=("eval", "start-up", "memory"),
        default=["eval", "start-up", "memory"],
        help="measure only these",
    )
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="also count instructions per evaluation batch under valgrind's callgrind (minutes)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes and one repeat: checks the script runs"
    )
    parser.add_argument(
        "--json-out", type=Path, default=None, help="also write every measurement to this file"
    )
    parser.add_argument(
        "--child",
        choices=("start-up", "memory-plain", "memory-trainer", "eval-instructions"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.quick:
        args.eval_short_batches, args.eval_extra_batches, args.eval_repeats = 2, 8, 1
        args.start_up_repeats, args.memory_repeats, args.memory_hidden = 0, 1, 64
    for option in (
        "batch_size",
        "eval_short_batches",
        "eval_extra_batches",
        "eval_repeats",
        "start_up_repeats",
        "memory_repeats",
        "memory_hidden",
        "memory_epochs",
    ):
        if getattr(args, option) < (0 if args.quick and option == "start_up_repeats" else 1):
            parser.error(f"--{option.replace('_', '-')} must be >= 1, got {getattr(args, option)}")
    return args


def start_up_figures(args: argparse.Namespace) -> dict[str, Any]:
    """The first fresh process runs under ``python -X importtime`` (and warms the file cache);
    the figures are the medians over the others (over that one alone with ``--quick``)."""
    first, stderr = run_child(["--child", "start-up"], python_options=("-X", "importtime"))
    children = [run_child(["--child", "start-up"])[0] for _ in range(args.start_up_repeats)] or [first]
    median = {
        key: statistics.median(child[key] for child in children)
        for key in children[0]
        if isinstance(children[0][key], float | int)
    }
    extras = sorted({name for child in (first, *children) for name in child["optional_extras_imported"]})
    top = import_time_top(stderr, limit=12)
    print(f"\nfresh processes: {len(children)}; medians:")
    print(
        f"  import pytorch_accelerated         {median['import_package_cpu_s']:.3f} s CPU, "
        f"{median['import_package_wall_s']:.3f} s elapsed, {median['modules_imported']:.0f} modules, "
        f"+{median['import_rss_kb'] / 1024:.1f} MB resident"
    )
    print(
        f"  ... then from pytorch_accelerated import Trainer: {median['import_trainer_cpu_s']:.3f} s CPU in all"
    )
    print(
        f"  train() to the first update        {median['first_update_cpu_s'] * 1e3:.1f} ms CPU "
        f"(a second train() in the same process: {median['second_run_first_update_cpu_s'] * 1e3:.1f} ms)"
    )
    print("  python -X importtime, after torch and accelerate (cumulative us, self us, module):")
    for self_us, cumulative_us, name in top:
        print(f"    {cumulative_us:>9} {self_us:>9}  {name}")
    print(f"  optional extras imported by the package: {', '.join(extras) or 'none'}")
    return {"children": children, "median": median, "optional_extras_imported": extras, "importtime_top": top}


def memory_figures(args: argparse.Namespace) -> dict[str, Any]:
    options = ["--memory-hidden", str(args.memory_hidden), "--memory-epochs", str(args.memory_epochs)]
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "trainer": []}
    for _ in range(args.memory_repeats):  # interleaved
        for kind in runs:
            runs[kind].append(run_child(["--child", f"memory-{kind}", *options], MEMORY_ENVIRONMENT)[0])
    peak = {
        kind: statistics.median(run["peak_rss_kb"] for run in kind_runs) / 1024
        for kind, kind_runs in runs.items()
    }
    print(
        f"\npeak RSS, fresh processes ({runs['plain'][0]['parameters']} parameters, {args.memory_epochs} epoch(s)): "
        f"plain {peak['plain']:.1f} MB, trainer {peak['trainer']:.1f} MB"
    )
    result: dict[str, Any] = {"runs": runs, "peak_rss_mb": peak}
    if "cuda_max_allocated_bytes" in runs["plain"][0]:
        cuda = {
            kind: statistics.median(run["cuda_max_allocated_bytes"] for run in kind_runs) / 2**20
            for kind, kind_runs in runs.items()
        }
        print(f"CUDA max allocated: plain {cuda['plain']:.1f} MB, trainer {cuda['trainer']:.1f} MB")
        result["cuda_max_allocated_mb"] = cuda
    return result


def main() -> None:
    args = parse_args()
    if args.child is not None:
        if args.child == "start-up":
            child = child_start_up()
        elif args.child == "eval-instructions":
            child = child_eval_instructions(args)
        else:
            child = child_memory(args.child.removeprefix("memory-"), args.memory_hidden, args.memory_epochs)
        print(json.dumps(child))
        return
    import accelerate
    import torch

    overhead = load_overhead()
    torch.set_num_threads(1)
    device = overhead.default_device()
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    print(
        f"torch {torch.__version__}, accelerate {accelerate.__version__}, python {platform.python_version()}, "
        f"device {device}, {'cpu' if device.type == 'cpu' else 'wall'} clock, load average "
        f"{Path('/proc/loadavg').read_text().split()[:3] if Path('/proc/loadavg').exists() else 'unknown'}",
        flush=True,
    )
    evaluation = report_eval(measure_eval(args, clock)) if "eval" in args.figures else None
    start_up = start_up_figures(args) if "start-up" in args.figures else None
    memory = memory_figures(args) if "memory" in args.figures else None
    figures: dict[str, float] = {}
    if evaluation is not None:
        figures["EVAL_RATIO"] = evaluation["ratio_to_plain"]["trainer_evaluate"]
        figures["EVAL_IN_TRAIN_RATIO"] = evaluation["ratio_to_plain"]["trainer_train_eval"]
    if args.instructions and "eval" in args.figures:
        instructions = eval_instructions(args)
        evaluation = {**(evaluation or {}), "instructions_per_batch": instructions}
        figures["EVAL_INSTRUCTIONS_RATIO"] = instructions["trainer_evaluate"] / instructions["plain"]
    if start_up is not None:
        figures["FIRST_UPDATE_MS"] = start_up["median"]["first_update_cpu_s"] * 1e3
        figures["IMPORT_S"] = start_up["median"]["import_trainer_cpu_s"]
    if memory is not None:
        figures["PEAK_MB_ABOVE_PLAIN"] = memory["peak_rss_mb"]["trainer"] - memory["peak_rss_mb"]["plain"]
        if "cuda_max_allocated_mb" in memory:
            cuda = memory["cuda_max_allocated_mb"]
            figures["CUDA_PEAK_MB_ABOVE_PLAIN"] = cuda["trainer"] - cuda["plain"]
    if args.json_out is not None:
        report = {
            "config": {**vars(args), "json_out": str(args.json_out)},
            "figures": figures,
            "environment": {
                "torch": torch.__version__,
                "accelerate": accelerate.__version__,
                "python": platform.python_version(),
                "device": str(device),
            },
            "evaluation": evaluation,
            "start_up": start_up,
            "memory": memory,
        }
        args.json_out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print()
    for name, value in figures.items():
        goal = GOALS[name.replace("_IN_TRAIN", "").replace("_INSTRUCTIONS", "").replace("CUDA_", "")]
        text = (
            f"{value:.3f}x" if "RATIO" in name else f"{value:.3f}" if name == "IMPORT_S" else f"{value:.1f}"
        )
        print(f"{name} = {text} (goal <= {goal}: {'met' if value <= goal else 'MISSED'})")
    if start_up is not None and start_up["optional_extras_imported"]:
        sys.exit(
            f"import pytorch_accelerated imported optional extras: {start_up['optional_extras_imported']}"
        )


if __name__ == "__main__":
    main()
