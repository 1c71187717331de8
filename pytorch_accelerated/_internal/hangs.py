"""Hangs become errors: what a failed collective operation was doing, and a watchdog that ends a
process a stop signal finds stuck outside Python (in a collective whose peer died, typically).

The collective timeout itself is set where the process group is created
(:func:`.process_group.accelerator_with_collective_timeout`); the wait for the processes of a launch to
join it, in :mod:`.launch_checks`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from .errors import add_note
from .process_group import COLLECTIVE_TIMEOUT_ENV, collective_timeout_s, seconds_from_env

#: How long the watchdog lets a process that received a stop signal go without running any
#: Python before it ends it, unless ``PT_ACC_SIGNAL_GRACE`` says otherwise.
DEFAULT_SIGNAL_GRACE_S = 10.0
SIGNAL_GRACE_ENV = "PT_ACC_SIGNAL_GRACE"

# What gloo, NCCL and torch say when a collective fails because another process left it.
_NOTE_MARK = "collective operation"
_COLLECTIVE_FAILURES = (
    "/gloo/",
    "NCCL",
    "Connection closed by peer",
    "Connection reset by peer",
    "Timed out waiting",
)


def describe_position(handler: Any, progress: Any) -> str:
    """Where the run is (``handler``'s last event, ``progress``'s epoch and batch), for messages:
    ``after on_train_step_start of epoch 2 (training batch 3)``."""
    current, last = getattr(handler, "current_event", None), getattr(handler, "last_event", None)
    return (
        f"{f'during {current}' if current else f'after {last}' if last else 'before the first event'} "
        f"of epoch {progress.epoch + 1} (training batch {progress.batch_index})"
    )


def is_collective_failure(error: BaseException) -> bool:
    """True for the errors torch raises when a collective operation times out or loses a peer."""
    dist_error = getattr(torch.distributed, "DistError", None)
    return (dist_error is not None and isinstance(error, dist_error)) or (
        isinstance(error, RuntimeError) and any(marker in str(error) for marker in _COLLECTIVE_FAILURES)
    )


def explain_collective_failure(accelerator: Any, where: str, error: BaseException) -> None:
    """Add a note to ``error``, a failed collective of several processes, saying which process
    failed ``where`` (see :func:`describe_position`), and that the real error is probably another
    process's."""
    if (
        accelerator.num_processes == 1
        or not is_collective_failure(error)
        or any(_NOTE_MARK in n for n in getattr(error, "__notes__", []))
    ):
        return
    rank, processes = accelerator.process_index, accelerator.num_processes
    if "Timed out" in str(error) or "timed out" in str(error):
        timeout = collective_timeout_s()
        # Which process is late is not known here, unless there is only one other.
        note = (
            f"rank {rank} waited {timeout:g} s in a {_NOTE_MARK} {where}, but "
            + (
                f"rank {1 - rank}"
                if processes == 2
                else f"at least one of the other {processes - 1} processes"
            )
            + " did not reach "
            f"it in that time: it is slow (a long callback, save or data loading on that process "
            f"alone), stuck, or has failed; its output above says which. If it is only slow, shorten "
            f"that work or raise {COLLECTIVE_TIMEOUT_ENV} (now {timeout:g} seconds)."
        )
    else:
        note = (
            f"rank {rank}: a {_NOTE_MARK} failed {where} because another process left it: that "
            f"process failed, or gave up waiting for this one (a collective timeout); see its output above."
        )
    add_note(error, note)


def signal_grace_s() -> float:
    return seconds_from_env(SIGNAL_GRACE_ENV, DEFAULT_SIGNAL_GRACE_S)


class SignalWatchdog:
    """End the process when one of ``signals`` has arrived and the main thread then runs no
    Python for ``grace_s`` seconds before the stop is agreed (:meth:`settle`): it is blocked in
    C, e.g. in a collective whose peer died, where no Python signal handler can run.

    It watches through :func:`signal.set_wakeup_fd`, which the interpreter writes the signal
    number to even while the main thread is blocked, then samples the main thread's Python
    frame: a frame that does not move for ``grace_s`` means stuck. It then prints what the
    process was doing (``describe()``) and exits with ``128 + signum``, as the signal would
    have. While paused (:meth:`pause`, e.g. a save, whose barriers may legitimately take long)
    the clock waits. :meth:`stop` puts the previous wakeup fd back.
    """

    def __init__(self, signals: Iterable[int], grace_s: float, describe: Callable[[], str]) -> None:
        self.signals = frozenset(int(signum) for signum in signals)
        self.grace_s = grace_s
        self.describe = describe
        self._main_thread = threading.main_thread().ident or 0
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous_fd = -1
        self._thread: threading.Thread | None = None
        self._paused = 0
        self._stopping = threading.Event()
        self._settled = threading.Event()

    def start(self) -> None:
        """Start watching (main thread only: signal.set_wakeup_fd raises ValueError elsewhere)."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        try:
            self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            reader.close()
            writer.close()
            raise
        self._reader, self._writer = reader, writer
        self._thread = threading.Thread(
            target=self._watch, name="pytorch_accelerated-signal-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and put the previous wakeup fd back."""
        if self._writer is None:
            return
        self._stopping.set()
        signal.set_wakeup_fd(self._previous_fd)
        # Wake the watching thread. Closing the writer would not: forked data-loader workers
        # hold copies of it. Shutting the reader down does, even if the buffer is full.
        assert self._reader is not None and self._thread is not None
        self._reader.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=2)
        self._reader.close()
        self._writer.close()
        self._reader = self._writer = self._thread = None

    def settle(self) -> None:
        """The stop is agreed: from now on the run ends by itself, so stop timing it."""
        self._settled.set()

    def pause(self) -> None:
        """Hold the clock until :meth:`resume` (calls nest)."""
        self._paused += 1

    def resume(self) -> None:
        self._paused -= 1

    def _watch(self) -> None:
        assert self._reader is not None
        while not self._stopping.is_set():
            try:
                received = self._reader.recv(64)
            except OSError:
                return
            if not received:
                return
            handled = [signum for signum in received if signum in self.signals]
            if handled and not self._settled.is_set() and self._stuck():
                self._exit(handled[0])

    def _stuck(self) -> bool:
        """True when, before the stop is settled, the main thread's Python frame stays exactly
        where it is for ``grace_s`` (not counting paused time)."""
        last, moved_at = self._main_position(), time.monotonic()
        while not self._stopping.wait(0.05) and not self._settled.is_set():
            position = self._main_position()
            if position is None:  # the main thread has ended
                return False
            if position != last or self._paused:
                last, moved_at = position, time.monotonic()
            elif time.monotonic() - moved_at >= self.grace_s:
                return True
        return False

    def _main_position(self) -> tuple[int, int] | None:
        frame = sys._current_frames().get(self._main_thread)  # noqa: SLF001 (documented, for debugging)
        return None if frame is None else (id(frame), frame.f_lasti)

    def _exit(self, signum: int) -> None:
        message = (
            f"[rank {os.environ.get('RANK', '0')}] Received {signal.Signals(signum).name}, but this "
            f"process has run no Python for "
            f"{self.grace_s:g} s: it is stuck, probably in a collective operation that another "
            f"process no longer takes part in (did one fail?). It was {self._describe()}. "
            f"Exiting with code {128 + signum} without saving; training states saved earlier are "
            f"intact. ({SIGNAL_GRACE_ENV} sets how long to wait.)"
        )
        for stream, text in ((sys.stdout, ""), (sys.stderr, message + "\n")):
            with contextlib.suppress(Exception):  # a closed or broken stream must not keep the process alive
                stream.write(text)
                stream.flush()
        os._exit(128 + signum)

    def _describe(self) -> str:
        try:
            return self.describe()
        except Exception as error:  # the message matters more than the details
            return f"an unknown place ({error!r})"
