"""The scripts of ``scripts/`` use the API exactly as 0.1.61's docs and examples do; each runs
unchanged in a process of its own on one process, and those where the number of
processes matters (metrics, padded gather) also on 2 processes (a CPU gloo group launched as
torchrun launches it). The processes are forked from the suite's one interpreter that has imported
torch (:mod:`tests.forked`), each a fresh process running the script as ``__main__``.

Each script checks its own results (exit code 0) and prints a ``COMPAT OK <name> ...`` line last
on the world's process zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import forked
from tests.helpers import subprocess_env

SCRIPTS = Path(__file__).parent / "scripts"
TIMEOUT_S = 120

#: script -> the name in its ``COMPAT OK`` line.
ONE_PROCESS = {
    "metrics_callback_and_subclass.py": "metrics",
    "custom_event.py": "custom_event",
    "gather_padded_detections.py": "gather_padded",
    "timm_mixup_ema.py": "timm_mixup_ema",
    "progressive_resizing.py": "progressive_resizing",
    "transformers_classifier.py": "transformers_classifier",
    "wsd_checkpoints_continuation.py": "wsd_checkpoints",
}
TWO_PROCESSES = ["metrics_callback_and_subclass.py", "gather_padded_detections.py"]
#: script -> the optional package it needs (timm needs torchvision, absent in the lower-bounds tier).
NEEDS = {"timm_mixup_ema.py": "timm", "transformers_classifier.py": "transformers"}


def run_script(script: str, tmp_path: Path, nproc: int) -> str:
    result = forked.run(
        SCRIPTS / script, nproc=nproc, cwd=tmp_path, env=subprocess_env(tmp_path), timeout=TIMEOUT_S
    )
    output = result.stdout + result.stderr
    succeeded = f"COMPAT OK {ONE_PROCESS[script]}" in output
    assert result.returncode == 0 and succeeded, (
        f"{' '.join(result.args)} exited with {result.returncode}:\n{output}"
    )
    return output


@pytest.mark.parametrize("script", sorted(ONE_PROCESS))
def test_original_style_script_runs_on_one_process(script, tmp_path):
    if script in NEEDS:
        pytest.importorskip(NEEDS[script])
    run_script(script, tmp_path, nproc=1)


@pytest.mark.distributed
@pytest.mark.parametrize("script", TWO_PROCESSES)
def test_original_style_script_runs_on_two_processes(script, tmp_path):
    output = run_script(script, tmp_path, nproc=2)
    if script == "gather_padded_detections.py":
        # docs/migration.md: [[1,2],[3,4]] and [[5,6]] gathered with padding_value=-1 give 3 rows.
        assert "example_rows=3" in output, output
    else:
        assert "processes=2" in output, output
