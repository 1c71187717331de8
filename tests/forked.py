"""Scripts run in processes forked from one interpreter that has already imported torch.

Importing torch, accelerate and the package costs a new interpreter 5 CPU seconds or more, and a
2-process ``torchrun`` launch three of them (the agent and two workers) before any training: most
of the time of a test that trains a few updates. Here a fork server (the standard library's
``multiprocessing`` "forkserver", started once per pytest process) imports them once, and each
launch forks its processes from it. Every process of a launch is still a new process, with its own
memory, environment, working directory and output, running the script as ``python script args``
would (``__main__``, ``sys.argv``, the script's folder first on ``sys.path``, ``atexit`` handlers
at the end, the exit code of ``SystemExit`` or 1 for an exception, with its traceback). A launch of
several processes gets the environment ``torchrun`` gives its workers (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ``TORCHELASTIC_*``), with this process holding the
TCP store that torchrun's agent would hold, so the processes form a real gloo group exactly as
under torchrun.

What this does not do is what torchrun's agent does beyond that: restarts, signals to the agent,
elastic membership, its exit codes and its own messages. The tests of those start ``torchrun``
itself (:func:`tests.launch.start_workers` with ``torchrun=True``).
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: What the fork server imports once: what the scripts of the suite import that is slow to import
#: (an optional package that is missing, or fails to import, is left out).
PRELOAD = (
    "numpy",
    "torch",
    "torch.distributed",
    "torch.distributed.checkpoint",
    "accelerate",
    "pytorch_accelerated",
    "pytorch_accelerated.callbacks",
    "tests.helpers",
    "tests.forked",
    "torchmetrics",
    "sklearn.datasets",
    "sklearn.model_selection",
    "matplotlib.figure",
    "timm",
    "optuna",
)


def preload() -> None:
    """What the fork server runs before its first fork (its preload module is this one)."""
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: S112 (an optional package: the script imports it itself, and fails there)
            continue


#: The environment the fork server itself starts with (read when torch is imported).
SERVER_ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1"}

_context: Any = None


def _fork_context() -> Any:
    """The forkserver context, its server started (once) with :data:`SERVER_ENV`."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["tests._forkserver_preload"])
        saved = {name: os.environ.get(name) for name in SERVER_ENV}
        os.environ.update(SERVER_ENV)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        _context = context
        atexit.register(_kill_the_ones_left)
    return _context


def _kill_the_ones_left() -> None:
    """At the test process's exit, kills the forked processes a failed test left running (otherwise
    ``multiprocessing`` would wait for them)."""
    for process in multiprocessing.active_children():
        if process.exitcode is None:
            process.kill()
            process.join(10)


def run_script_here(
    script: str, argv: list[str], env: dict[str, str], cwd: str, out: str, err: str, new_session: bool
) -> None:
    """The body of one forked process: ``python script *argv`` in ``cwd`` with environment ``env``,
    its standard output (file descriptor 1) appended to ``out`` and its standard error to ``err``
    (the same file, for one stream in the order written; a terminal's device, ``/dev/pts/N``, is its
    standard input too); with ``new_session``, in a session and process group of its own
    (``subprocess``'s ``start_new_session``)."""
    if new_session:
        os.setsid()
    terminal = out.startswith("/dev/")
    for fd_number, path in ((1, out), (2, err), *(((0, out),) if terminal else ())):
        fd = os.open(path, os.O_RDWR if terminal else os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, fd_number)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(write_through=True)  # type: ignore[attr-defined]
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # TMPDIR is read again
    if "PYTHONWARNINGS" in env:  # read by a new interpreter at its start
        warnings.resetwarnings()
        for option in env["PYTHONWARNINGS"].split(","):
            warnings._setoption(option)  # type: ignore[attr-defined]
    os.chdir(cwd)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code: Any = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does: threads first
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    raise SystemExit(code)


def torchrun_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun's agent gives worker ``rank`` of ``nproc`` on one machine, its store
    at 127.0.0.1:``port``."""
    return {
        "LOCAL_RANK": str(rank),
        "RANK": str(rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(nproc),
        "WORLD_SIZE": str(nproc),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": "forked",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }


class ForkedLaunch:
    """The forked processes of one launch, used as a ``subprocess.Popen`` of the whole launch is:
    ``poll``, ``wait``, ``send_signal``, ``kill``, ``returncode``, ``pid`` (rank 0's); the output
    is read from the log files with :meth:`stdout`, :meth:`stderr`, :meth:`output`.

    The launch's exit code is 0 when every process exited 0, else the first other one, a signal
    as its negative number (as ``subprocess`` gives it for a process)."""

    def __init__(
        self,
        args: list[str],
        processes: list[Any],
        outs: list[Path],
        errs: list[Path],
        store: Any,
        new_session: bool,
    ) -> None:
        self.args, self.processes, self.outs, self.errs = args, processes, outs, errs
        self.store, self.new_session = store, new_session  # the store lives as long as the launch
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.processes[0].pid

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def poll(self) -> int | None:
        if self.returncode is None and all(process.exitcode is not None for process in self.processes):
            self.returncode = next((p.exitcode for p in self.processes if p.exitcode != 0), 0)
            self.store = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            process.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0, self.stdout(), self.stderr())
        return code

    def send_signal(self, sig: int) -> None:
        """Sends ``sig`` to every process of the launch that runs (not to their children)."""
        self._signal(os.kill, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILLs every process, with its whole process group if it has a session of its own."""
        self._signal(os.killpg if self.new_session else os.kill, signal.SIGKILL)

    def _signal(self, send: Callable[[int, int], None], sig: int) -> None:
        for process in self.processes:
            if process.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    send(process.pid, sig)

    def kill_and_wait(self) -> None:
        self.kill()
        for process in self.processes:
            process.join(10)
        self.poll()

    @staticmethod
    def _read(paths: list[Path]) -> str:
        return "".join(
            path.read_text(errors="replace") if path.exists() else "" for path in dict.fromkeys(paths)
        )

    def stdout(self) -> str:
        """What the processes wrote to their standard output, rank 0 first."""
        return self._read(self.outs)

    def stderr(self) -> str:
        """What they wrote to their standard error (nothing if it went with the output)."""
        return "" if self.errs == self.outs else self._read(self.errs)

    def output(self) -> str:
        """Everything each process wrote, rank 0 first."""
        return self._read([path for pair in zip(self.outs, self.errs, strict=True) for path in pair])


def start(
    script: str | Path,
    argv: list[str] | tuple[str, ...] = (),
    *,
    env: dict[str, str],
    cwd: Path,
    nproc: int = 1,
    log: Path | None = None,
    merge_stderr: bool = True,
    new_session: bool = False,
    terminal: str | None = None,
) -> ForkedLaunch:
    """Starts ``python script *argv`` in ``nproc`` forked processes (a torchrun-like group when more
    than one), each with ``env`` and its rank's variables. Each process's output goes to ``log``
    (or a temporary file under ``env["TMPDIR"]``), with ``.rank{R}`` before the suffix when there are
    several, and its standard error to the same file, or with ``merge_stderr=False`` to one named
    ``*.err``. With ``terminal`` (a pseudo-terminal's device, ``os.ttyname(follower)``) every process
    has that terminal as its standard input, output and error instead."""
    context = _fork_context()
    script = str(script)
    store, rank_env = None, [{} for _ in range(nproc)]
    if nproc > 1:
        from torch.distributed import TCPStore

        # The store torchrun's agent would hold: the workers join it as clients.
        store = TCPStore("127.0.0.1", 0, nproc, True, wait_for_workers=False)
        rank_env = [torchrun_env(rank, nproc, store.port) for rank in range(nproc)]
    if log is None:
        log = Path(tempfile.mkdtemp(prefix="forked-", dir=env.get("TMPDIR"))) / "output.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    outs = [log if nproc == 1 else log.with_suffix(f".rank{rank}{log.suffix}") for rank in range(nproc)]
    errs = outs if merge_stderr else [out.with_suffix(".err") for out in outs]
    if terminal is not None:
        outs = errs = [Path(terminal)] * nproc
    processes = []
    for rank in range(nproc):
        process = context.Process(
            target=run_script_here,
            args=(
                script,
                list(argv),
                {**env, **rank_env[rank]},
                str(cwd),
                str(outs[rank]),
                str(errs[rank]),
                new_session,
            ),
            name=f"{Path(script).name}[{rank}]",
        )
        process.start()
        processes.append(process)
    command = [f"(forked, {nproc} process{'es' if nproc > 1 else ''})", "python", script, *argv]
    return ForkedLaunch(command, processes, outs, errs, store, new_session)


def run(
    script: str | Path, argv: list[str] | tuple[str, ...] = (), *, timeout: float, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """What ``subprocess.run([python, script, *argv], capture_output=True, text=True, timeout=...)``
    gives, from forked processes (``kwargs`` as for :func:`start`; with several processes their
    outputs come one after the other, rank 0 first); raises ``subprocess.TimeoutExpired`` on a
    timeout, after killing them."""
    launch = start(script, argv, merge_stderr=False, **kwargs)
    try:
        returncode = launch.wait(timeout)
    except subprocess.TimeoutExpired:
        launch.kill_and_wait()
        raise
    return subprocess.CompletedProcess(launch.args, returncode, launch.stdout(), launch.stderr())


def run_code(code: str, *, cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """:func:`run` for ``python -c code`` (the code is written to a script under ``cwd``, then removed)."""
    fd, name = tempfile.mkstemp(prefix="code-", suffix=".py", dir=cwd)
    os.close(fd)
    script = Path(name)
    script.write_text(code)
    try:
        return run(script, cwd=cwd, **kwargs)
    finally:
        script.unlink()
