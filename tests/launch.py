"""The one place a test starts a multi-process run: :func:`start_workers` / :func:`launch_workers`
run the worker scripts of ``tests/distributed/workers/`` as real process groups and read back
their results.

By default a group's processes are forked from the suite's one interpreter that has imported torch
(:mod:`tests.forked`), with the environment torchrun gives its workers and the store its agent
holds: a real gloo group, without the 5 CPU seconds of imports per process. A test where the
launcher itself is under test (torchrun's agent, its restarts and signals, launch checks) passes
``torchrun=True`` (or ``torchrun_args``) and gets ``python -m torch.distributed.run`` on loopback
(:func:`launcher` builds that command: plain ``python`` for one process).

A worker group is started with a timeout, with every file it writes (results, logs, temporary
files) under a pytest temporary folder. Each rank writes ``rank{RANK}.json`` to the output folder
it is given; :func:`launch_workers` returns them by rank. When something goes wrong the assertion
message holds the whole output of the group, so a failure in CI can be read without a rerun. The
environment of every launched process is :func:`tests.helpers.subprocess_env`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests import forked
from tests.helpers import free_port, subprocess_env

WORKERS_DIR = Path(__file__).parent / "distributed" / "workers"
DEFAULT_TIMEOUT_S = 120.0


def launcher(
    nproc: int = 1, *, nnodes: int = 1, node_rank: int = 0, master_port: int | None = None
) -> list[str]:
    """The command that starts a script on ``nproc`` processes per machine (``nnodes`` machines):
    ``[python]`` for a single process, else ``[python, -m, torch.distributed.run, ...]`` (torchrun)
    on 127.0.0.1, on ``master_port`` (a free port when not given). Append the script and its
    arguments. Several machines are several launches, one per ``node_rank``, on the same port."""
    if nproc == 1 and nnodes == 1:
        return [sys.executable]
    command = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        command += ["--nnodes", str(nnodes), "--node_rank", str(node_rank)]
    port = free_port() if master_port is None else master_port
    return [
        *command,
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
    ]


@dataclass
class WorkerRun:
    """What a launched group left behind."""

    command: list[str]
    returncode: int
    output: str
    elapsed_s: float
    out_dir: Path
    results: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.command)}\nexit code: {self.returncode}, "
            f"{self.elapsed_s:.1f} s\n----- output -----\n{self.output}"
        )


class RunningGroup:
    """A launched worker group; :meth:`wait` collects it. Start two to overlap their start-up."""

    def __init__(
        self,
        script: str,
        out_dir: Path,
        args: tuple[str, ...],
        nproc: int,
        timeout_s: float,
        expect_success: bool,
        torchrun_args: tuple[str, ...] = (),
        torchrun: bool = False,
    ) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp_dir = out_dir / "tmp"
        tmp_dir.mkdir(exist_ok=True)
        script_path = str(WORKERS_DIR / script)
        self.out_dir, self.nproc, self.timeout_s, self.expect_success = (
            out_dir,
            nproc,
            timeout_s,
            expect_success,
        )
        self.start = time.monotonic()
        self.forked: forked.ForkedLaunch | None = None
        if not (torchrun or torchrun_args):
            argv = ["--out", str(out_dir), *args]
            env = subprocess_env(tmp_dir)
            self.forked = forked.start(
                script_path, argv, nproc=nproc, env=env, cwd=out_dir, log=tmp_dir / "output.log"
            )
            self.command = self.forked.args
            return
        command = [*launcher(nproc), *torchrun_args, script_path]
        self.command = [*command, "--out", str(out_dir), *args]
        self.process = subprocess.Popen(
            self.command,
            cwd=out_dir,
            env=subprocess_env(tmp_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, so a hang can be killed whole
        )

    def _stop(self) -> str:
        # torchrun puts its workers in sessions of their own, out of reach of killpg: SIGTERM
        # makes torchrun stop them itself; SIGKILL the group only if that does not work.
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            try:
                return self.process.communicate(timeout=10)[0]
            except subprocess.TimeoutExpired:
                return "(no output: the workers kept the pipe open after SIGKILL)"

    def running(self) -> bool:
        """True while a process of the group has not ended."""
        return (self.forked or self.process).poll() is None

    def _communicate(self) -> tuple[int | None, str]:
        """Waits for the group to end: (its exit code, or None on a timeout after killing it; its output)."""
        if self.forked is not None:
            try:
                return self.forked.wait(
                    max(1.0, self.timeout_s - (time.monotonic() - self.start))
                ), self.forked.output()
            except subprocess.TimeoutExpired:
                self.forked.kill_and_wait()
                return None, self.forked.output()
        remaining = max(1.0, self.timeout_s - (time.monotonic() - self.start))
        try:
            output, _ = self.process.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            return None, self._stop()
        return self.process.returncode, output

    def wait(self) -> WorkerRun:
        returncode, output = self._communicate()
        if returncode is None:
            run = WorkerRun(self.command, -9, output, time.monotonic() - self.start, self.out_dir)
            pytest.fail(
                f"The worker group did not finish within {self.timeout_s:.0f} s (a hang?).\n{run.describe()}"
            )
        run = WorkerRun(self.command, returncode, output, time.monotonic() - self.start, self.out_dir)
        run.results = [_read_json(self.out_dir / f"rank{rank}.json") for rank in range(self.nproc)]
        if self.expect_success:
            missing = [rank for rank, result in enumerate(run.results) if result is None]
            assert run.returncode == 0 and not missing, (
                f"The worker group failed (ranks without a result file: {missing}).\n{run.describe()}"
            )
        return run


def start_workers(
    script: str,
    out_dir: Path,
    *args: str,
    nproc: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    expect_success: bool = True,
    torchrun_args: tuple[str, ...] = (),
    torchrun: bool = False,
) -> RunningGroup:
    """Start ``workers/<script>`` in ``nproc`` processes, forked (see the module's text), or with
    ``torchrun`` (as plain ``python`` if 1) when ``torchrun`` or ``torchrun_args`` is given.

    The script is called as ``script --out OUT_DIR *args``. On a timeout the whole process
    group is killed and the test fails with the output seen so far. With ``expect_success``
    the run must exit 0 and every rank must have written its result file. ``torchrun_args``
    (e.g. ``("--max-restarts", "3")``) go to torchrun, before the script.
    """
    return RunningGroup(script, out_dir, args, nproc, timeout_s, expect_success, torchrun_args, torchrun)


def launch_workers(script: str, out_dir: Path, *args: str, **kwargs: Any) -> WorkerRun:
    """:func:`start_workers`, then wait for the group to finish."""
    return start_workers(script, out_dir, *args, **kwargs).wait()


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    return json.loads(path.read_text())


def load_worker_module(name: str) -> ModuleType:
    """Import ``workers/<name>.py`` (the helpers the workers share) without touching sys.path."""
    spec = importlib.util.spec_from_file_location(f"_distributed_workers_{name}", WORKERS_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    writes_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # no __pycache__ beside the worker scripts
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes_bytecode
    return module
