"""Time from a kill to the first update after torchrun restarts the group, split into its parts.

The digits job (examples/train_digits_restartable.py: the MLP of examples/train_digits.py, a
state every ``K`` updates, the same command for the first launch and the relaunch) runs on 2 CPU
processes under ``torchrun --nproc_per_node 2 --max-restarts 1``. In the first attempt, rank 1
kills itself with SIGKILL right after update ``kill_at`` (the state of update ``kill_at - 1`` is
complete by then); torchrun notices, stops rank 0, starts both again, and they resume from that
state, mid-epoch. Every worker notes wall-clock times (``time.time()``, one machine) in a file:

- ``start``: the first line of this script (interpreter start-up is before it);
- ``find``: ``resume_from="auto"`` choosing the newest complete state, at the start of ``train()``
  (before the loaders and ``prepare``; timed by wrapping ``AutoResume.choose``);
- ``load``: ``load_training_state`` entered and left (an override that calls ``super()``);
- ``first batch``: ``on_train_step_start`` of the first step (the data position restored: the
  loader skipped to the saved batch and produced the next one);
- ``first update``: ``on_train_step_end`` of the first optimizer update.

Each part is measured to the last process reaching its end (a collective waits for the slowest):

| part | from | to |
|---|---|---|
| torchrun's restart | the kill | the last new process's first line |
| process start | that | the last process entering ``load_training_state`` (imports, Trainer, loaders, ``prepare``), less ``find`` |
| state load | that | the last process leaving it, plus ``find`` |
| position restore | that | the last process's first batch ready |
| first update | that | the last process's first update done |

The library's share is state load + position restore (goal: under 1 s for the digits job,
growing with the state's size only). Cases: a kill early and late in a long epoch (per-process
batches of 2: 315 batches an epoch), the same with the job's batches of 32 (20 batches an epoch),
and larger models (hidden widths 2048 and 4096) for the growth with size. Run from the
repository root::

    .venv/bin/python benchmarks/restart_time.py
    .venv/bin/python benchmarks/restart_time.py --repeats 3 --json-out restart.json
    .venv/bin/python benchmarks/restart_time.py --store shared --cases 3   # torchrun's shared store

``--store own`` (the default, as in the tables of docs/benchmarks.md) launches with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: a store per attempt; ``--store shared`` without it, on
the store torchrun's agent keeps across attempts.
"""

import time

STARTED_AT = time.time()  # the first line a worker runs: the end of torchrun's restart

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENT_PARTS = ("noticed", "others stopped", "new processes")
PARTS = ("torchrun restart", "process start", "state load", "position restore", "first update")
# name (the position resumed at), per-process batch size, hidden width (None: the digits MLP),
# save every K updates, kill after update
CASES = (
    ("digits, batch 2, early (batch 10 of 315)", 2, None, 5, 11),
    ("digits, batch 2, late (batch 300 of 315)", 2, None, 5, 301),
    ("digits, batch 32, early (batch 5 of 20)", 32, None, 5, 6),
    ("digits, batch 32, late (batch 15 of 20)", 32, None, 5, 16),
    ("width 2048, batch 32 (batch 15 of 20)", 32, 2048, 5, 16),
    ("width 4096, batch 32 (batch 15 of 20)", 32, 4096, 5, 16),
)


# ---------------------------------------------------------------- the worker (under torchrun)


def worker(argv: list[str]) -> None:
    sys.path[0] = str(ROOT)  # the checkout this script lives in
    sys.path.insert(1, str(ROOT / "examples"))
    import torch
    import train_digits_restartable as job
    from torch import nn

    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import TrainerCallback
    from pytorch_accelerated.checkpoints.auto_resume import AutoResume

    parser = job.parser()
    parser.add_argument("--times", type=Path, required=True)
    parser.add_argument("--kill-at", type=int, required=True)
    parser.add_argument("--width", type=int, default=None)
    args = parser.parse_args(argv)
    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    times: dict[str, Any] = {"rank": rank, "attempt": attempt, "start": STARTED_AT}

    def note(event: str) -> None:
        times[event] = time.time()
        if event in ("first update", "kill"):  # the last notes of this process that matter
            with open(args.times / f"attempt{attempt}.rank{rank}.json", "w") as file:
                json.dump(times, file)

    class TimedTrainer(Trainer):
        def load_training_state(self, input_dir: Any) -> dict[str, Any]:
            note("load start")
            try:
                return super().load_training_state(input_dir)
            finally:
                note("load end")

    class Stopwatch(TrainerCallback):
        def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
            if "first batch" not in times:
                note("first batch")

        def on_train_step_end(self, trainer: Any, is_update_step: bool = True, **kwargs: Any) -> None:
            if is_update_step and "first update" not in times:
                note("first update")
            if attempt == 0 and rank == 1 and trainer.progress.global_step == args.kill_at:
                note("kill")
                os.kill(os.getpid(), signal.SIGKILL)

    choose = AutoResume.choose  # resume_from="auto" finds the state before the set-up: time that too

    def timed_choose(self: AutoResume) -> Any:
        started = time.time()
        try:
            return choose(self)
        finally:
            times["find s"] = time.time() - started

    AutoResume.choose = timed_choose  # type: ignore[method-assign]
    model = None
    if args.width is not None:
        torch.manual_seed(args.seed)
        w = args.width
        model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    job.run(args, model=model, trainer_class=TimedTrainer, callbacks=(Stopwatch(),))


# ---------------------------------------------------------------- the driver


def run_case(
    batch_size: int, width: int | None, every: int, kill_at: int, work: Path, store: str = "own"
) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)
    (work / "times").mkdir(parents=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
        __file__, "--worker", "--epochs", "1", "--batch-size", str(batch_size),
        "--save-dir", str(work / "states"), "--save-every-n-steps", str(every),
        "--times", str(work / "times"), "--kill-at", str(kill_at),
        *(["--width", str(width)] if width else []),
    ]  # fmt: skip
    # shared: the store torchrun's agent keeps across attempts (torch's default); own: a store of
    # its own for every attempt (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; docs/recipes/clusters.md).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    if store == "own":
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout + result.stderr
    (work / "output.txt").write_text(output)
    if "FINAL global_step=" not in output:
        sys.exit(f"the run did not finish (exit code {result.returncode}):\n{' '.join(command)}\n{output}")
    kill = _read(work / "times" / "attempt0.rank1.json")["kill"]
    after = [_read(work / "times" / f"attempt1.rank{rank}.json") for rank in (0, 1)]

    def last(event: str) -> float:
        return max(t[event] for t in after)

    ends = [
        kill,
        last("start"),
        last("load start"),
        last("load end"),
        last("first batch"),
        last("first update"),
    ]
    parts = {name: ends[i + 1] - ends[i] for i, name in enumerate(PARTS)}
    parts.update(_agent_parts(output, kill, last("start")))
    find_s = max(t["find s"] for t in after)  # resume_from="auto" choosing the state: a part of the load
    parts["process start"] -= find_s
    parts["state load"] += find_s
    state_files = [p for p in (work / "states").rglob("*") if p.is_file()]
    resumed = [line for line in output.splitlines() if 'resume_from="auto": resuming' in line]
    return {
        "parts": parts,
        "library": parts["state load"] + parts["position restore"],
        "state_mb": _state_mb(work / "states"),
        "resumed": resumed[0].strip() if resumed else None,
        "files": len(state_files),
    }


def _agent_parts(output: str, kill: float, started: float) -> dict[str, float]:
    """torchrun's restart split by its own log lines (local time, to the millisecond): the kill
    noticed (it sends the others SIGTERM), the others stopped (it reports the failure), the new
    processes' first lines."""
    day = time.strftime("%Y-%m-%d", time.localtime(kill))

    def logged(pattern: str) -> float:
        found = re.search(rf"^[WEI]\d{{4}} (\d\d:\d\d:\d\d\.\d+) .*{pattern}", output, flags=re.MULTILINE)
        if found is None:
            return float("nan")
        return time.mktime(time.strptime(f"{day} {found[1][:8]}", "%Y-%m-%d %H:%M:%S")) + float(found[1][8:])

    noticed, stopped = logged("closing signal SIGTERM"), logged(r"failed \(exitcode")
    return {
        "noticed": noticed - kill,
        "others stopped": stopped - noticed,
        "new processes": started - stopped,
    }


def _state_mb(states: Path) -> float:
    """The size of one step state (all hold the same tensors)."""
    steps = sorted(states.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return sum(p.stat().st_size for p in steps[0].rglob("*") if p.is_file()) / 1e6 if steps else 0.0


def _read(path: Path) -> dict[str, Any]:
    if not path.exists():
        sys.exit(f"{path} is missing: a worker did not reach its last note")
    return json.loads(path.read_text())


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def environment() -> str:
    import accelerate
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"python {platform.python_version()}, torch {torch.__version__}, accelerate {accelerate.__version__}, "
        f"{os.cpu_count()} cores, load average {load}, {platform.platform()}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1, help="runs per case; the median is shown")
    parser.add_argument("--cases", type=int, nargs="*", help="indices into the case list (default: all)")
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--store",
        choices=("own", "shared"),
        default="own",
        help="own: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, a store per attempt; shared: torchrun's default",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the last run of each case here (states, times, output)"
    )
    args = parser.parse_args()
    print(environment(), flush=True)
    chosen = [CASES[i] for i in args.cases] if args.cases else list(CASES)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, (name, batch_size, width, every, kill_at) in enumerate(chosen):
            work = (args.keep or Path(tmp)) / f"case{index}"
            runs = [
                run_case(batch_size, width, every, kill_at, work, args.store) for _ in range(args.repeats)
            ]
            median = {part: statistics.median(r["parts"][part] for r in runs) for part in PARTS}
            library = statistics.median(r["library"] for r in runs)
            rows.append({"case": name, "parts": median, "library": library, "runs": runs})
            print(f"{name}: {runs[-1]['resumed']}", flush=True)
    print("\n| case | state | " + " | ".join(PARTS) + " | library's share |")
    print("|---|---|" + "---|" * (len(PARTS) + 1))
    for row in rows:
        cells = " | ".join(f"{row['parts'][part]:.2f} s" for part in PARTS)
        mb = statistics.median(r["state_mb"] for r in row["runs"])
        print(f"| {row['case']} | {mb:.2f} MB | {cells} | **{row['library']:.3f} s** |")
    print("\ntorchrun's restart, split by its log lines:\n")
    print("| case | kill noticed | the others stopped | new processes' first line |\n|---|---|---|---|")
    for row in rows:
        split = [statistics.median(r["parts"][part] for r in row["runs"]) for part in AGENT_PARTS]
        print(f"| {row['case']} | " + " | ".join(f"{value:.2f} s" for value in split) + " |")
    print(f"\n{environment()}")
    digits = [row["library"] for row in rows if row["case"].startswith("digits")]
    if digits:
        verdict = "met" if max(digits) < 1.0 else "NOT met"
        print(f"RESTART_LIBRARY_SHARE digits max = {max(digits):.3f} s (goal under 1 s: {verdict})")
    if args.json_out:
        args.json_out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2:])
    else:
        main()
