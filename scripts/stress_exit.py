"""How often a 2-process launch fails after its work is done: N launches under real ``torchrun`` of
each kind, counting the launches in which a process aborted (``terminate called without an active
exception``, SIGABRT) at interpreter exit, and any other failure.

Kinds (each a 2-process CPU gloo group, ``torchrun --nproc_per_node 2``; the workers are those of
tests/distributed/workers/clean_exit.py, which the suite launches once each):

- ``evaluate``: ``Trainer(model, loss, None).evaluate(...)`` on 101 samples, batch size 1;
- ``train-eval-predict``: one epoch of training with evaluation, then ``evaluate()`` and ``predict()``;
- ``async-save``: training with ``SaveTrainingStateCallback(..., asynchronous=True)``;
- ``plain``: a plain torch gloo script, no library code (50 all-reduces, then a barrier);
- ``plain-destroyed``: the same, ending with ``torch.distributed.destroy_process_group()``, as
  docs/launching.md asks of a user's own gloo code.

Run from the repository root (long: about 6 s a launch on 2 busy cores)::

    nice -n 10 .venv/bin/python scripts/stress_exit.py --launches 100
    nice -n 10 .venv/bin/python scripts/stress_exit.py --launches 30 --kinds plain plain-destroyed
    nice -n 10 .venv/bin/python scripts/stress_exit.py --launches 100 --code /path/to/other/checkout

``--code`` runs the workers on the package of another checkout (e.g. main's, for a "before"
figure); the default is this checkout. The output of every failed launch is kept under
``--keep`` (default: a temporary folder, printed).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ABORT = "terminate called without an active exception"
WORKER = ROOT / "tests" / "distributed" / "workers" / "clean_exit.py"
KINDS = ("evaluate", "train-eval-predict", "async-save", "plain", "plain-destroyed")


# ---------------------------------------------------------------- the driver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(kind: str, code: Path, work: Path) -> tuple[str, str]:
    """One launch: ("ok" | "aborted" | "failed", its output)."""
    work.mkdir(parents=True)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(WORKER), "--kind", kind, "--out", str(work),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as error:
        return "failed", f"timed out after 300 s\n{error.stdout or ''}{error.stderr or ''}"
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return "ok", output
    return ("aborted" if ABORT in output else "failed"), output


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--launches", type=int, default=100, help="launches of each kind")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=KINDS[:3])
    parser.add_argument("--code", type=Path, default=ROOT, help="the checkout whose package the workers run")
    parser.add_argument("--keep", type=Path, default=None, help="where the output of failed launches goes")
    args = parser.parse_args()
    keep = args.keep or Path(tempfile.mkdtemp(prefix="stress_exit_"))
    keep.mkdir(parents=True, exist_ok=True)
    print(
        f"code: {args.code.resolve()}; failed launches' output in {keep}; load {os.getloadavg()}", flush=True
    )
    counts = {}
    with tempfile.TemporaryDirectory() as scratch:
        for kind in args.kinds:
            counts[kind] = {"ok": 0, "aborted": 0, "failed": 0}
            started = time.monotonic()
            for number in range(args.launches):
                outcome, output = launch(kind, args.code.resolve(), Path(scratch) / f"{kind}{number}")
                counts[kind][outcome] += 1
                if outcome != "ok":
                    (keep / f"{kind}{number}.{outcome}.txt").write_text(output)
            taken = time.monotonic() - started
            print(
                f"{kind}: aborted {counts[kind]['aborted']}/{args.launches}, other failures "
                f"{counts[kind]['failed']}/{args.launches} ({taken:.0f} s, load {os.getloadavg()})",
                flush=True,
            )


if __name__ == "__main__":
    main()
