"""The Python side of docs/recipes/clusters.md, on one machine: the page's Slurm script run as it is
(bash, with stand-ins for ``srun`` and ``scontrol``) through a SIGTERM, a requeue and the
relaunch; the torchrun restart after a SIGKILL (a short run of benchmarks/restart_time.py); and
the page's excerpt of examples/train_digits_restartable.py, which is the script these run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port, subprocess_env

PAGE = REPO_ROOT / "docs" / "recipes" / "clusters.md"
EXAMPLE = REPO_ROOT / "examples" / "train_digits_restartable.py"
TIMEOUT_S = 300
UPDATES = 10 * 20  # the example's 10 epochs of 20 updates (1257 samples, 2 processes of 32)

SRUN = """#!/bin/bash
# srun on one machine: drop srun's own options and become the command (so its signals reach it).
while [[ "$1" == -* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
case "$1" in
    show) echo 127.0.0.1 ;;  # show hostnames "$SLURM_JOB_NODELIST"
    requeue) echo "$*" >> "$(dirname "$0")/requeued" ;;
    *) echo "scontrol stand-in: unexpected $*" >&2; exit 2 ;;
esac
"""


def _page_block(pattern: str) -> str:
    found = re.search(pattern, PAGE.read_text(), flags=re.S)
    assert found is not None, f"{PAGE.name}: no block matching {pattern!r}"
    return found[1]


def test_the_page_shows_lines_of_the_script_that_is_tested() -> None:
    excerpt = _page_block(r"<!-- illustrative -->\n```python\n(.*?)```")
    lines = [line.strip() for line in EXAMPLE.read_text().splitlines()]
    position = 0
    for shown in (line.strip() for line in excerpt.splitlines()):
        if shown in ("", "..."):
            continue
        assert shown in lines[position:], (
            f"{PAGE.name} shows {shown!r}, which is not (or not in this order) in {EXAMPLE.name}"
        )
        position = lines.index(shown, position) + 1


def _slurm_job(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    """The page's batch script, started as Slurm would start it on one node with 2 "GPUs"."""
    stubs = tmp_path / "bin"
    stubs.mkdir(exist_ok=True)
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    script = tmp_path / "digits.sbatch"
    script.write_text(_page_block(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```"))
    env = subprocess_env(tmp_path)
    env.update(
        PATH=os.pathsep.join((str(stubs), str(Path(sys.executable).parent), env["PATH"])),
        HOME=str(tmp_path),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="localhost",
        SLURM_NNODES="1",
        SLURM_GPUS_ON_NODE="2",
        MASTER_PORT=str(port),
    )
    return subprocess.Popen(
        ["bash", str(script)], cwd=REPO_ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


def _finish(job: subprocess.Popen[str]) -> str:
    try:
        return job.communicate(timeout=TIMEOUT_S)[0]
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGTERM)
        output = job.communicate(timeout=60)[0]
        pytest.fail(f"the batch script did not finish within {TIMEOUT_S} s:\n{output}")


def test_slurm_script_saves_on_sigterm_to_the_batch_shell_requeues_and_the_relaunch_resumes(
    tmp_path: Path,
) -> None:
    states, requeued = tmp_path / "states" / "digits", tmp_path / "bin" / "requeued"
    job = _slurm_job(tmp_path, free_port())
    deadline = time.monotonic() + TIMEOUT_S
    while not (states / "step_5" / "manifest.json").exists():  # training is under way
        if job.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the job ended or hung before its first state:\n{_finish(job)}")
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)  # --signal=B:TERM: to the batch shell only
    output = _finish(job)
    assert job.returncode == 1, f"torchrun exits 1 after a SIGTERM to its agent:\n{output}"
    assert f'resume_from="auto": no training state in {states}, starting a new run' in output, output
    stopped = re.findall(r"Training stopped: received SIGTERM; saved the training state to ([^;\s]+)", output)
    assert len(stopped) == 1, f"expected the stop line once (main process):\n{output}"
    assert Path(stopped[0]).parent == states and (Path(stopped[0]) / "manifest.json").exists()
    assert "FINAL" not in output, f"the run finished before the signal stopped it:\n{output}"
    assert requeued.read_text() == "requeue 4242\n", output

    # The requeued job: the same script, no signal. It resumes from the state saved on SIGTERM.
    job = _slurm_job(tmp_path, free_port())
    output = _finish(job)
    assert job.returncode == 0, output
    assert f"from {stopped[0]}, the newest usable state in {states}" in output, output
    assert 'resume_from="auto": resuming run ' in output, output
    assert f"FINAL global_step={UPDATES} " in output, output
    assert requeued.read_text() == "requeue 4242\n", "a job that ended by itself was requeued"


def test_torchrun_restart_after_a_sigkill_resumes_from_the_newest_state(tmp_path: Path) -> None:
    """benchmarks/restart_time.py, one case: rank 1 SIGKILLs itself after update 6 under
    ``torchrun --max-restarts 1``, as the page's one-machine command (no
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE: the store torchrun shares); the restarted group resumes from
    step_5 and finishes."""
    benchmark = [sys.executable, str(REPO_ROOT / "benchmarks" / "restart_time.py"), "--store", "shared"]
    result = subprocess.run(
        [*benchmark, "--cases", "2", "--keep", str(tmp_path)],
        cwd=tmp_path, env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    states = tmp_path / "case0" / "states"
    assert f"from {states / 'step_5'}, the newest usable state in {states} (epoch 1, update 5; " in output
    assert re.search(
        r"^\| digits, batch 32, early \(batch 5 of 20\) \| 0\.\d\d MB \|( [0-9.]+ s \|){5}", output, re.M
    )
    assert re.search(
        r"^RESTART_LIBRARY_SHARE digits max = [0-9.]+ s \(goal under 1 s: (met|NOT met)\)$", output, re.M
    )
    torchrun_output = (tmp_path / "case0" / "output.txt").read_text()
    assert "FINAL global_step=20 " in torchrun_output, torchrun_output
