"""Instruction counts of timed regions, under valgrind's callgrind: the ``--instructions`` modes
of ``benchmarks/overhead.py`` and ``benchmarks/front.py``.

A benchmark re-runs itself as a child under ``valgrind --tool=callgrind --instr-atstart=no
--dump-before=time_process_time``: the child warms up uninstrumented, switches instrumentation
on (:func:`callgrind_control`), then runs its timed regions, each between two calls of its
clock, ``time.process_time``. Callgrind dumps its counters before every call of the clock, so
dump ``0`` holds what ran between switching on and the first region, dump ``1`` the first
region, dump ``2`` what ran between the first two regions, and so on. The count does not depend
on what else the machine runs, unlike time on a shared machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def callgrind_control(*options: str) -> None:
    """Run ``callgrind_control`` on this process, which runs under callgrind; keep executing
    meanwhile (callgrind answers commands only while the program runs, not while it waits)."""
    command = subprocess.Popen(["callgrind_control", *options, str(os.getpid())], stdout=subprocess.DEVNULL)
    while command.poll() is None:
        sum(range(10_000))
    if command.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(options)} failed ({command.returncode})")


def region_instructions(script: Path, child_options: list[str], cwd: Path) -> dict[str, int]:
    """Run ``script`` with ``child_options`` under callgrind and return the instructions of each
    timed region, by name. The child prints, as its last line of standard output, a JSON object
    whose ``"order"`` lists the names of its timed regions in the order they ran."""
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "callgrind.out"
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=time_process_time",
                   f"--callgrind-out-file={output}", sys.executable, str(script), *child_options]  # fmt: skip
        # Hash seeds and thread pools would otherwise change the counts from run to run.
        environment = {
            **os.environ,
            "PYTHONHASHSEED": "0",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
        }
        completed = subprocess.run(
            command, capture_output=True, text=True, cwd=cwd, env=environment, check=False
        )
        if completed.returncode != 0:
            raise RuntimeError(f"valgrind failed ({completed.returncode}):\n{completed.stderr[-3000:]}")
        child: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
        order: list[str] = child["order"]
        dumps = sorted(Path(folder).glob("callgrind.out.*"), key=lambda path: int(path.suffix[1:]))
        counts = [
            int(
                next(line for line in path.read_text().splitlines() if line.startswith("summary:")).split()[1]
            )
            for path in dumps
        ]
    if len(counts) < 2 * len(order):
        raise RuntimeError(f"callgrind wrote {len(counts)} dumps for {len(order)} timed regions")
    return dict(zip(order, counts[1 : 2 * len(order) : 2], strict=True))  # dumps at each clock() call
