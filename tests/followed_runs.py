"""A script run in forked processes that a test follows line by line, to kill it at an exact point.

The script runs in a session of its own (so a kill reaches its data-loader workers too), forked
(:mod:`tests.forked`), with ``--out DIR`` first among its arguments and its output in
``DIR/worker.log``. Scripts built for it print markers such as ``STEP 12`` or ``PAUSED`` (see
``tests/integration/workers/resume_worker.py``'s ``Markers``) and wait there to be killed.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests import forked
from tests.helpers import subprocess_env


class FollowedRun:
    """``python script --out out *args`` in ``nproc`` forked processes, given ``timeout_s`` to run."""

    def __init__(self, script: Path, out: Path, *args: str, nproc: int = 1, timeout_s: float = 120.0) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.log_path = out / "worker.log"
        self.timeout_s = timeout_s
        self.process = forked.start(
            script,
            ["--out", str(out), *args],
            nproc=nproc,
            env=subprocess_env(out),
            cwd=out,
            log=self.log_path,
            new_session=True,
        )
        self.command = self.process.args
        self.deadline = time.monotonic() + timeout_s

    @property
    def output(self) -> str:
        return self.process.output()

    def describe(self) -> str:
        return f"command: {' '.join(self.command)}\nexit code: {self.process.poll()}\n--- output ---\n{self.output}"

    def wait_for_line(self, marker: str) -> None:
        while marker not in self.output.splitlines():
            if self.process.poll() is not None:
                pytest.fail(f"The worker exited before printing {marker!r}.\n{self.describe()}")
            if time.monotonic() > self.deadline:
                self.kill()
                pytest.fail(
                    f"The worker did not print {marker!r} within {self.timeout_s:.0f} s.\n{self.describe()}"
                )
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the whole process group (the run and any data-loader workers)."""
        self.process.kill()
        self.process.wait(timeout=30)

    def wait(self) -> int:
        try:
            return self.process.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"The worker did not finish within {self.timeout_s:.0f} s.\n{self.describe()}")
