"""One run per folder: the lock file that a run writing training states holds on their folder.

Knows nothing of the Trainer. The lock is ``<folder>/.run.lock``, a small JSON record of its
holder (host, process id and start time, pid namespace, run id, since when, a token of its own,
its heartbeat interval). It is taken atomically (the record is written under a private name, then
hard-linked to the lock's name, which fails if the lock exists), so a reader never sees half a
record. While it holds the lock, the holder's heartbeat thread touches the lock every
:data:`HEARTBEAT_INTERVAL_S` seconds.

A lock whose holder is gone is taken over, with a line saying how the holder was judged gone:

- on the same host and in the same pid namespace, by its process: gone when no process has its
  id, or the process with its id started at another time (the id was reused), at once;
- anywhere else (another host, or another pid namespace of this host: a container, or the same
  container restarted, where the new run may even have the same process id 1), by its heartbeat:
  gone when the lock's modification time does not advance for :data:`HEARTBEAT_TIMEOUT_S` seconds
  (watched from here, so the clocks of the hosts need not agree);
- a lock written by a version without a heartbeat, by its age: gone once it has not been
  refreshed (every save refreshes it) for ``PT_ACC_LOCK_EXPIRY`` seconds (default 3600).

A lock held by a live run, and a lock file that cannot be read, refuse the run with a
:class:`FolderInUseError` that says who holds it, how that was judged, how to check, and how to
clear it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._internal.process_group import seconds_from_env

LOCK_NAME = ".run.lock"
EXPIRY_ENV = "PT_ACC_LOCK_EXPIRY"
#: How often a holder touches its lock.
HEARTBEAT_INTERVAL_S = 2.0
#: How long a lock's heartbeat may stand still before its holder (seen from another host or pid
#: namespace) is judged gone: many beats, so that a holder slowed down (a busy machine, a long
#: operation holding the GIL) is not taken for dead.
HEARTBEAT_TIMEOUT_S = 20.0
_WATCH_STEP_S = 0.25
_HEARTBEAT = "_heartbeat"  # the record's key for this process's heartbeat thread (not written)


class FolderInUseError(RuntimeError):
    """The folder of training states is held by another run, or its lock cannot be read (the
    message names the holder, how it was judged alive, how to check and how to clear it)."""


@dataclass(frozen=True)
class Judgement:
    """Whether a lock's holder is alive, and how that was judged (for messages)."""

    alive: bool
    how: str


def acquire(folder: Path, run_id: str) -> dict[str, Any]:
    """Take the lock of ``folder`` (created if missing) for the run ``run_id``, taking over the
    lock of a holder that is gone (printing how it was judged gone); start its heartbeat; return
    the record that :func:`refresh` and :func:`release` need.

    Raises:
        FolderInUseError: when a live run holds it, or its lock file cannot be read.
        OSError: when the lock cannot be written (e.g. the folder cannot be created).
    """
    lock, token = folder / LOCK_NAME, uuid.uuid4().hex
    record: dict[str, Any] = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": _process_start(os.getpid()),
        "pid_namespace": _pid_namespace(),
        "run_id": run_id,
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "token": token,
        "heartbeat_s": HEARTBEAT_INTERVAL_S,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a stale lock taken over by another run meanwhile: look again
        if _create(lock, record):
            record[_HEARTBEAT] = _Heartbeat(lock, token)
            return record
        if (refused := refusal(folder, run_id)) is not None:
            raise FolderInUseError(refused)
    raise FolderInUseError(refusal(folder, run_id) or _garbage_message(folder, "it keeps changing"))


def refusal(folder: Path, run_id: str = "") -> str | None:
    """Why the lock of ``folder`` refuses a run (``run_id``: the run it would continue, if known),
    or None when there is no lock or its holder was judged gone: then that lock is removed (unless
    another run replaced it meanwhile) and a line says how its holder was judged gone."""
    lock = folder / LOCK_NAME
    holder = _read_settled(folder)
    if holder is None:
        return None
    if not holder:
        return _garbage_message(folder, _describe_garbage(lock))
    judgement = judge(lock, holder)
    if judgement.alive:
        return _in_use_message(folder, holder, judgement, run_id)
    if _remove_stale(lock, holder):
        print(f"Took over the lock of {folder} from {_describe(holder)}: {judgement.how}.")
    return None


def refresh(folder: Path, record: dict[str, Any]) -> None:
    """Before a save into ``folder``: check the lock is still ``record``'s and mark it fresh.

    Raises:
        FolderInUseError: when another run took it over (its holder seemed gone).
    """
    lock = folder / LOCK_NAME
    if read(folder) is None and _create(lock, record):  # removed by hand: taken again
        return
    holder = read(folder) or {}
    if holder.get("token") != record["token"]:
        raise FolderInUseError(
            f"This run's lock on {folder} was taken over by another run ({_describe(holder)}): it judged "
            f"this run gone (no heartbeat for {HEARTBEAT_TIMEOUT_S:g} s, or its process ended). Nothing more is "
            f"saved there, so the two runs' states do not mix; save into another folder. To check which run "
            f"holds the folder now: cat {lock}."
        )
    with contextlib.suppress(OSError):  # a folder that turned read-only: the save itself says so
        os.utime(lock)


def release(folder: Path, record: dict[str, Any]) -> None:
    """Stop the heartbeat and remove the lock of ``folder`` if it is still ``record``'s; never
    raises, since it runs on every exit path of a run, where it must not hide the error that ended
    the run."""
    if (heartbeat := record.get(_HEARTBEAT)) is not None:
        heartbeat.stop()
    lock = folder / LOCK_NAME
    if (read(folder) or {}).get("token") == record["token"]:
        try:
            lock.unlink(missing_ok=True)
        except OSError as error:  # e.g. a folder that turned read-only during the run
            warnings.warn(
                f"Could not remove this run's lock {lock} ({error.strerror or error}). It is left "
                f"behind; the next run into {folder} takes it over, since its holder has ended (on "
                f"this host at once; elsewhere once its heartbeat has stood still for "
                f"{HEARTBEAT_TIMEOUT_S:g} s). Or, once no run uses the folder, remove it: rm {lock}",
                stacklevel=2,
            )


def read(folder: Path, name: str = LOCK_NAME) -> dict[str, Any] | None:
    """The record of ``folder``'s lock (or of the lock file ``name`` there); None when there is no
    lock; {} when it cannot be read (being written, or not a lock record)."""
    try:
        record = json.loads((folder / name).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def judge(lock: Path, holder: dict[str, Any]) -> Judgement:
    """Whether the holder of ``lock`` (its record ``holder``) is alive: see the module's text."""
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and holder.get("pid_namespace") == _pid_namespace():
        if isinstance(pid, int):
            return _judge_by_process(pid, holder.get("process_start"))
    if isinstance(holder.get("heartbeat_s"), (int, float)):
        return _judge_by_heartbeat(lock, holder)
    return _judge_by_age(lock)


def _judge_by_process(pid: int, started: Any) -> Judgement:
    start = _process_start(pid)
    if start is None:
        return Judgement(False, f"no process {pid} runs on this host")
    if isinstance(started, int) and start != started:
        return Judgement(
            False, f"process {pid} on this host started after the lock was taken (its id was reused)"
        )
    return Judgement(True, f"its process {pid} runs on this host")


def _judge_by_heartbeat(lock: Path, holder: dict[str, Any]) -> Judgement:
    """Watch the lock's modification time for up to :data:`HEARTBEAT_TIMEOUT_S`: alive at its first
    advance, gone if it stands still (or alive if another run replaced the lock meanwhile: judged
    again by the caller's next look)."""
    where = (
        "another pid namespace of this host" if holder.get("host") == socket.gethostname() else "another host"
    )
    first, started = _beat(lock), time.monotonic()
    while (waited := time.monotonic() - started) < HEARTBEAT_TIMEOUT_S:
        time.sleep(_WATCH_STEP_S)
        now = _beat(lock)
        if now != first:
            return Judgement(True, f"it runs in {where}: its heartbeat advanced within {waited:.1f} s")
    return Judgement(False, f"it ran in {where}, and its heartbeat stood still for {HEARTBEAT_TIMEOUT_S:g} s")


def _judge_by_age(lock: Path) -> Judgement:
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return Judgement(True, "its lock was removed meanwhile")  # looked at again by the caller
    if age > _expiry_s():
        return Judgement(
            False, f"its lock, without a heartbeat, was not refreshed for {age:.0f} s ({EXPIRY_ENV})"
        )
    return Judgement(
        True,
        f"its lock, written by a version without a heartbeat, was refreshed {age:.0f} s ago, less than "
        f"{EXPIRY_ENV}={_expiry_s():g} s",
    )


def _beat(lock: Path) -> tuple[int, int] | None:
    """The lock's file and modification time, read through an open file: a network file system
    checks them with its server on open, so they are not an old cached copy."""
    try:
        with open(lock, "rb") as file:
            status = os.fstat(file.fileno())
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns


class _Heartbeat:
    """Touches ``lock`` every :data:`HEARTBEAT_INTERVAL_S` seconds while it holds ``token``."""

    def __init__(self, lock: Path, token: str) -> None:
        self._lock, self._token, self._stopped = lock, token, threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="pytorch-accelerated-lock-heartbeat", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(HEARTBEAT_INTERVAL_S):
            holder = read(self._lock.parent)
            if holder is not None and holder.get("token") != self._token:
                return  # taken over: the next save says so (a lock removed by hand is taken again there)
            with contextlib.suppress(OSError):  # removed, or a folder turned read-only
                os.utime(self._lock)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=HEARTBEAT_INTERVAL_S * 2)


def _create(lock: Path, record: dict[str, Any]) -> bool:
    """Create ``lock`` holding ``record`` if it does not exist, atomically; return whether it did."""
    text = json.dumps({key: value for key, value in record.items() if key != _HEARTBEAT})
    private = lock.with_name(f"{lock.name}.{record['token']}")
    private.write_text(text)
    try:
        os.link(private, lock)
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links: exclusive creation (a reader may see it empty)
        try:
            descriptor = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
    finally:
        private.unlink(missing_ok=True)
    return True


def _read_settled(folder: Path) -> dict[str, Any] | None:
    """:func:`read`, read again after a moment when the lock cannot be read: on a file system
    without hard links a new lock is empty until its holder has written it."""
    holder = read(folder)
    if holder == {}:
        time.sleep(0.5)
        holder = read(folder)
    return holder


def _pid_namespace() -> str | None:
    """This process's pid namespace (containers that share a host name may have their own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """When process ``pid`` of this pid namespace started (clock ticks since boot); None when no
    such process runs (or has ended, not yet reaped). Without /proc: 0 for a process that exists."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return _exists_without_proc(pid)
    return None if fields[0] == "Z" else int(fields[19])  # state, ..., starttime (field 22)


def _exists_without_proc(pid: int) -> int | None:
    if Path("/proc/self/stat").exists():
        return None  # /proc is there, and has no such process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process
        return 0
    return 0


def _remove_stale(lock: Path, holder: dict[str, Any]) -> bool:
    """Remove the stale lock ``holder`` (unless another run replaced it meanwhile: then put that
    back); return whether it was removed."""
    aside = lock.with_name(f"{lock.name}.stale.{uuid.uuid4().hex}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:  # another run removed it first
        return False
    moved = read(aside.parent, aside.name)
    replaced = moved is not None and moved.get("token") != holder.get("token")
    if replaced:
        with contextlib.suppress(FileExistsError):  # a fresh lock, taken since we read the stale one
            os.link(aside, lock)
    aside.unlink(missing_ok=True)
    return not replaced


def _expiry_s() -> float:
    return seconds_from_env(EXPIRY_ENV, 3600.0)


def _describe(holder: dict[str, Any]) -> str:
    return (
        f"run {holder.get('run_id')}, process {holder.get('pid')} on host {holder.get('host')}, "
        f"since {holder.get('since')}"
    )


def _describe_garbage(lock: Path) -> str:
    try:
        text = lock.read_bytes()
    except OSError as error:
        return f"reading it fails: {error.strerror or error}"
    return "it is empty" if not text.strip() else f"it holds {text[:60]!r}, not a lock record"


def _in_use_message(folder: Path, holder: dict[str, Any], judgement: Judgement, run_id: str) -> str:
    lock, pid, host = folder / LOCK_NAME, holder.get("pid"), holder.get("host")
    mine = (
        host == socket.gethostname()
        and holder.get("pid_namespace") == _pid_namespace()
        and pid == os.getpid()
    )
    if mine:
        return (
            f"{folder} is held by this process itself (process {pid}): by run {holder.get('run_id')}, since "
            f"{holder.get('since')}, which has not released it: another Trainer saving into the same folder, "
            f"or a train() call still running. Two runs saving into one folder would mix their states. Give "
            f"each Trainer a folder of its own (SaveTrainingStateCallback(save_dir=...)), or let the first run "
            f"end first (a run releases the folder when its train() returns). To check: {lock} names run "
            f"{holder.get('run_id')}; only if no run of this process uses the folder, clear it: rm {lock}"
        )
    same_host = host == socket.gethostname()
    check = f"ps -o pid,lstart,args -p {pid}" + ("" if same_host else f" on host {host}")
    if same_host and holder.get("pid_namespace") != _pid_namespace():
        check += " in that process's container"
    resumed = (
        f" It is the run that this launch continues: an earlier launch of this job still runs (or, with "
        f"machines that share {folder}, another machine of this run took the folder first)."
        if run_id and holder.get("run_id") == run_id
        else ""
    )
    return (
        f"{folder} is in use by another run that saves training states there: {_describe(holder)}; "
        f"{judgement.how}, so it is taken to be alive. Two runs saving into one folder would mix their "
        f"states. Save this run's states into another folder (SaveTrainingStateCallback(save_dir=...)), or "
        f"wait for that run to end.{resumed} To check: {check}; if that is not a run saving into {folder}, "
        f"clear the lock: rm {lock}"
    )


def _garbage_message(folder: Path, what: str) -> str:
    lock = folder / LOCK_NAME
    return (
        f"The lock file {lock} cannot be read ({what}), so no run can be judged to hold {folder} or not; "
        f"nothing was written there. To check that no run uses the folder: on every machine that sees it, "
        f"lsof +D {folder} (or look for a training job saving there). If none does, clear the lock: rm {lock} "
        f"and launch again; if one does, save this run's states into another folder "
        f"(SaveTrainingStateCallback(save_dir=...))."
    )
