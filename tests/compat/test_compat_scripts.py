"""The scripts of ``scripts/`` use the API exactly as 0.1.61's docs and examples do; each runs
unchanged in a subprocess on one process, and those where the number of
processes matters (metrics, padded gather) also on 2 processes (torchrun, a CPU gloo group).

Each script checks its own results (exit code 0) and prints a ``COMPAT OK <name> ...`` line last
on the world's process zero.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import finished_but_aborted_at_teardown, subprocess_env
from tests.launch import launcher

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
    command = [*launcher(nproc), str(SCRIPTS / script)]
    result = subprocess.run(
        command, cwd=tmp_path, env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    output = result.stdout + result.stderr
    succeeded = f"COMPAT OK {ONE_PROCESS[script]}" in output
    returncode = (
        0 if finished_but_aborted_at_teardown(result.returncode, output, succeeded) else result.returncode
    )
    assert returncode == 0 and succeeded, f"{' '.join(command)} exited with {result.returncode}:\n{output}"
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
