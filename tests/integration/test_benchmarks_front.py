"""benchmarks/front.py runs and reports every figure (a smoke run: the figures are not checked,
a timed test on a shared machine would be flaky; docs/benchmarks.md has the measured ones)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT, subprocess_env

FIGURES = ("EVAL_RATIO", "EVAL_IN_TRAIN_RATIO", "FIRST_UPDATE_MS", "IMPORT_S", "PEAK_MB_ABOVE_PLAIN")


def test_front_benchmark_runs_and_prints_every_figure_with_its_goal(tmp_path: Path) -> None:
    json_out = tmp_path / "front.json"
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "front.py"), "--quick", "--json-out", str(json_out)],
        capture_output=True,
        text=True,
        env=subprocess_env(tmp_path),
        cwd=tmp_path,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    for name in FIGURES:
        assert re.search(
            rf"^{name} = [0-9.]+x? \(goal <= [0-9.]+: (met|MISSED)\)$", completed.stdout, re.M
        ), f"no {name} line in:\n{completed.stdout}"
    assert "optional extras imported by the package: none" in completed.stdout
    report = json.loads(json_out.read_text())
    assert set(FIGURES) <= set(report["figures"])
    assert report["start_up"]["importtime_top"], "python -X importtime listed no module of the package"
