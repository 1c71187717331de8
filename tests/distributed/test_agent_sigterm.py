"""SIGTERM sent to torchrun's agent (not to the workers), as docs/launching.md describes: the agent
passes it on, both workers stop at the same safe point, save one state and return, and torchrun
still exits 1 with torch's ``SignalException`` traceback."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.launch import DEFAULT_TIMEOUT_S, start_workers


def test_sigterm_to_the_agent_saves_the_state_and_torchrun_exits_1(tmp_path: Path) -> None:
    group = start_workers(
        "resume_worker.py",
        tmp_path / "run",
        "--save-dir", str(tmp_path / "states"),
        "--pause-at-step", "5",
        expect_success=False,
        torchrun=True,  # the launcher is under test
    )  # fmt: skip
    deadline = time.monotonic() + DEFAULT_TIMEOUT_S
    while not (tmp_path / "run" / "paused").exists():
        if not group.running() or time.monotonic() > deadline:
            pytest.fail(f"The run ended or hung before pausing.\n{group.wait().describe()}")
        time.sleep(0.05)
    os.kill(group.process.pid, signal.SIGTERM)  # the agent: torchrun's own process
    run = group.wait()
    assert run.returncode == 1, run.describe()
    assert "SignalException: Process" in run.output and "got signal: 15" in run.output
    # Both workers received it, stopped at the same step (the end of epoch 1), saved and returned.
    assert [r["signal_received"] for r in run.results] == [signal.SIGTERM, signal.SIGTERM], run.describe()
    assert [r["progress"]["global_step"] for r in run.results] == [9, 9]
    assert "Training stopped: received SIGTERM; saved the training state to" in run.output
    assert (tmp_path / "states" / "epoch_1" / "manifest.json").exists()
