"""One run per folder: the lock file that a run writing training states holds on their folder.

Knows nothing of the Trainer. The lock is ``<folder>/.run.lock``, a small JSON record of its
holder (host, process id, run id, since when, and a token of its own). It is taken atomically
(the record is written under a private name, then hard-linked to the lock's name, which fails
if the lock exists), so a reader never sees half a record. A lock whose holder is gone is taken
over: on the same host (and pid namespace) when the process no longer exists; from another host when the lock has
not been refreshed (every save refreshes it) for ``PT_ACC_LOCK_EXPIRY`` seconds (default 3600).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

from .._internal.process_group import seconds_from_env

LOCK_NAME = ".run.lock"
EXPIRY_ENV = "PT_ACC_LOCK_EXPIRY"


class FolderInUseError(RuntimeError):
    """The folder of training states is held by another run (its message names the holder and the fix)."""


def acquire(folder: Path, run_id: str) -> dict[str, Any]:
    """Take the lock of ``folder`` (created if missing) for the run ``run_id``; return the record
    that :func:`refresh` and :func:`release` need.

    Raises:
        FolderInUseError: naming the holder, when another live run holds it.
        OSError: when the lock cannot be written (e.g. the folder cannot be created).
    """
    lock = folder / LOCK_NAME
    record = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_namespace": _pid_namespace(),
        "run_id": run_id,
        "since": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "token": uuid.uuid4().hex,
    }
    folder.mkdir(parents=True, exist_ok=True)
    for _ in range(3):  # a stale lock taken over by another run meanwhile: look again
        if _create(lock, record):
            return record
        holder = read(folder)
        if holder is not None and not _is_stale(lock, holder):
            raise FolderInUseError(_in_use_message(folder, holder, run_id))
        if holder is not None:
            _remove_stale(lock, holder)
    raise FolderInUseError(_in_use_message(folder, read(folder) or {}))


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
            f"This run's lock on {folder} was taken over by another run ({_describe(holder)}): "
            f"it seemed gone (no save for {EXPIRY_ENV}={_expiry_s():g} seconds, or its process ended). "
            f"Nothing more is saved there, so the two runs' states do not mix; save into another folder."
        )
    with contextlib.suppress(OSError):  # a folder that turned read-only: the save itself says so
        os.utime(lock)


def release(folder: Path, record: dict[str, Any]) -> None:
    """Remove the lock of ``folder`` if it is still ``record``'s; never raises, since it runs on
    every exit path of a run, where it must not hide the error that ended the run."""
    lock = folder / LOCK_NAME
    if (read(folder) or {}).get("token") == record["token"]:
        try:
            lock.unlink(missing_ok=True)
        except OSError as error:  # e.g. a folder that turned read-only during the run
            warnings.warn(
                f"Could not remove this run's lock {lock} ({error.strerror or error}). It is left "
                f"behind, and the next run into {folder} on this host takes it over, since its "
                f"holder has ended (from another host: once {EXPIRY_ENV}={_expiry_s():g} seconds have "
                f"passed, or delete it by hand).",
                stacklevel=2,
            )


def _create(lock: Path, record: dict[str, Any]) -> bool:
    """Create ``lock`` holding ``record`` if it does not exist, atomically; return whether it did."""
    private = lock.with_name(f"{lock.name}.{record['token']}")
    private.write_text(json.dumps(record))
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
            file.write(json.dumps(record))
    finally:
        private.unlink(missing_ok=True)
    return True


def read(folder: Path, name: str = LOCK_NAME) -> dict[str, Any] | None:
    """The record of ``folder``'s lock (or of the lock file ``name`` there); None when there is no
    lock; {} when it cannot be read (being written)."""
    try:
        record = json.loads((folder / name).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _is_stale(lock: Path, holder: dict[str, Any]) -> bool:
    """Whether the holder is gone: its process ended (same host), or the lock expired (any host)."""
    same_host = holder.get("host") == socket.gethostname() and holder.get("pid_namespace") == _pid_namespace()
    if same_host and isinstance(holder.get("pid"), int):
        return not _process_exists(holder["pid"])
    try:
        return time.time() - lock.stat().st_mtime > _expiry_s()
    except FileNotFoundError:
        return False


def _pid_namespace() -> str | None:
    """This process's pid namespace (containers that share a host name may have their own)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:  # a zombie (killed, not yet reaped) is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _remove_stale(lock: Path, holder: dict[str, Any]) -> None:
    """Remove the stale lock ``holder`` (unless another run replaced it meanwhile: then put that back)."""
    aside = lock.with_name(f"{lock.name}.stale.{uuid.uuid4().hex}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:  # another run removed it first
        return
    moved = read(aside.parent, aside.name)
    if moved is not None and moved.get("token") != holder.get("token"):
        with contextlib.suppress(FileExistsError):  # a fresh lock, taken since we read the stale one
            os.link(aside, lock)
    aside.unlink(missing_ok=True)


def _expiry_s() -> float:
    return seconds_from_env(EXPIRY_ENV, 3600.0)


def _describe(holder: dict[str, Any]) -> str:
    return (
        f"run {holder.get('run_id')}, process {holder.get('pid')} on host {holder.get('host')}, "
        f"since {holder.get('since')}"
        if holder
        else "a holder whose lock file is being written or unreadable"
    )


def _in_use_message(folder: Path, holder: dict[str, Any], run_id: str = "") -> str:
    if holder.get("run_id") == run_id:  # another machine of this run (see TrainingStateStore.hold)
        return (
            f"{folder} is held by this very run ({_describe(holder)}; lock file {folder / LOCK_NAME}): "
            f"either the machines share this folder although one of them did not see it when the run "
            f"started (a shared file system that shows new files late), so each machine was to save its "
            f"own states there; or an earlier launch of this run still runs. Launch again once it has "
            f"ended (the check runs again), or make the file system show new files at once."
        )
    return (
        f"{folder} is in use by another run that writes training states there: {_describe(holder)} "
        f"(lock file {folder / LOCK_NAME}). Two runs saving into one folder would mix their states. "
        f"Save this run's states into another folder (e.g. SaveTrainingStateCallback(save_dir=...)), "
        f"or wait for that run to end or stop it. A lock whose process has ended is taken over "
        f"automatically; from another host, once it is {_expiry_s():g} s old ({EXPIRY_ENV})."
    )
