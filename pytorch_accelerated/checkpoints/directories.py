"""Training-state directories on disk: their layout, the manifest, and atomic publication.

Knows nothing of the Trainer. A training state is a directory, e.g. ``training_states/step_120``::

    step_120/
        manifest.json        written last: says the state is complete, lists its files with the
                             CRC-32 of each, and records the position and settings of the run when
                             it was saved; it ends with the CRC-32 of its own content
        model.pt             the unwrapped model's state dict
        optimizer.pt         optimizer state (absent when the run has none)
        scheduler.pt         scheduler state (absent when the run has none)
        scaler.pt            the gradient scaler's state (fp16 runs)
        trainer_state.pt     progress, run history, callback states, ...
        rng_state_<rank>.pt  every RNG of each process, and its share of the epoch's loss so far

Which files hold the model and optimizer depends on the state's layout (:mod:`.layouts`: under FSDP
they are written in shards). The directory is written under a hidden temporary name beside its
final one and renamed into place only once the manifest is written, so a process killed mid-save
leaves either the previous state or the new one, never a half-written directory that looks
complete. A save that fails removes its temporary directory (see :func:`remove_temporary`).

A name in the folder may be a symbolic link (a state moved to another disk, say): a save of that name
replaces the link, never what it points to, and says so; rotation and the removal of leftovers
remove links, never their targets. A regular file of a state's name is never replaced.

Before anything is loaded, every file read is checked against the CRC-32 in the manifest (see
:func:`.files.checked`), and the manifest against its own (:func:`manifest_problem`): a byte
changed anywhere in a state is found. Manifests of version 1 (0.1.61-era and earlier versions
of this library) have no checksums and are read unchecked.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

from .files import CheckpointWriteError, Checksum, file_crc32, write_failure, write_torch_file

MANIFEST = "manifest.json"
FORMAT = "pytorch-accelerated-training-state"
VERSION = 2  # 2: the CRC-32 of every file ("crc32") and of the manifest itself ("manifest_crc32")
SEAL = "manifest_crc32"
DAMAGED_STATE_FIX = (
    "Resume from another state: name it (train(resume_from=<its directory>) or "
    "load_training_state(<its directory>)), or pass the folder of states to resume_from, which "
    "skips a damaged one with a warning."
)


def temporary_dir_for(output_dir: Path) -> Path:
    return output_dir.parent / f".{output_dir.name}.incomplete"


def remove_entry(path: Path, ignore_errors: bool = False) -> None:
    """Remove ``path`` whatever it is: a directory with everything in it, or a file, or a symbolic
    link (the link only, never what it points to); nothing when there is nothing there.
    ``ignore_errors``: remove what can be removed and say nothing (as ``shutil.rmtree`` does), for
    clean-ups that several processes may run at once.

    Raises:
        OSError: when it cannot be removed (unless ``ignore_errors``).
    """
    if path.is_symlink() or path.is_file():
        try:
            path.unlink(missing_ok=True)
        except OSError:
            if not ignore_errors:
                raise
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=ignore_errors)


def _reason(error: OSError) -> str:
    """The OS error's reason and number, without the path that ``shutil.rmtree`` gives relative."""
    return f"{error.strerror} (errno {error.errno})" if error.strerror else str(error)


def make_temporary_dir(output_dir: Path) -> Path:
    """Create the empty hidden directory that a state for ``output_dir`` is written into.

    Raises:
        files.CheckpointWriteError: naming the directory and the OS error (e.g. a parent is a file),
            or ``output_dir`` when it is a regular file, which a save would replace.
    """
    if output_dir.is_file():  # a link to a file too: a user's file, never replaced by a state
        raise CheckpointWriteError(
            errno.EEXIST,
            f"{output_dir} is a file, not a training state, and publishing the state there would replace "
            f"it; move it away, or save the state under another name",
            output_dir,
        )
    temporary = temporary_dir_for(output_dir)
    try:
        remove_entry(temporary)  # left by a save that was killed
        temporary.mkdir(parents=True)
    except OSError as error:
        raise write_failure(error, temporary, "creating") from error
    return temporary


def remove_leftover_temporaries(folder: Path) -> list[str]:
    """Remove the hidden directories of saves into ``folder`` that were killed, and whatever else
    has their names (a link: the link only); call it only while holding the folder's lock, when
    no other run writes there. Return the names of those removed; one that cannot be removed gets
    a warning naming it and why (it is never taken for a state)."""
    removed = []
    for leftover in sorted(folder.glob(".*.incomplete")) if folder.is_dir() else []:
        try:
            remove_entry(leftover)
        except OSError as error:
            warnings.warn(
                f"Could not remove {leftover}, the half-written state of a killed save: {_reason(error)}. "
                f"Remove it by hand; it is never taken for a state.",
                stacklevel=2,
            )
            continue
        removed.append(leftover.name)
    return removed


def remove_temporary(output_dir: Path) -> None:
    """Remove what a failed save of ``output_dir`` left behind (nothing if it left nothing)."""
    # Every process may run this at once; what cannot be removed is said by the save's error.
    remove_entry(temporary_dir_for(output_dir), ignore_errors=True)


def write_file(obj: Any, path: Path) -> None:
    """``torch.save`` ``obj`` to ``path``, flushed to disk (see :func:`.files.write_torch_file`)."""
    write_torch_file(obj, path)


def write_files(directory: Path, contents: dict[str, Any]) -> None:
    """Write each object of ``contents`` to the file of its name in ``directory``, flushed to disk."""
    for name, obj in contents.items():
        write_file(obj, directory / name)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, then flush ``directory`` itself, so that every file's name in it is
    on disk too before the state can be published."""
    manifest = {"format": FORMAT, "version": VERSION, "complete": True, **manifest}
    manifest["crc32"] = {name: f"{file_crc32(directory / name):08x}" for name in manifest.get("files", ())}
    try:
        with open(directory / MANIFEST, "w") as file:
            file.write(_sealed(manifest))
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        raise write_failure(error, directory / MANIFEST) from error
    _fsync_dir(directory)


def publish(temporary: Path, output_dir: Path) -> None:
    """Move a complete temporary directory to ``output_dir``, replacing any earlier state there.

    The earlier state is moved aside first and deleted only after the new one is in place. An
    earlier state that is a symbolic link is replaced as a link: what it points to is left as it
    was, and a warning says so.
    """
    aside = output_dir.parent / f".{output_dir.name}.replaced"
    try:
        remove_entry(aside)  # left by a save killed between its renames
    except OSError as error:
        raise CheckpointWriteError(
            error.errno,
            f"{_reason(error)} while removing {aside}, an earlier state of that name that an earlier save "
            f"moved aside; remove it by hand",
            output_dir,
        ) from error
    linked = output_dir.parent / os.readlink(output_dir) if output_dir.is_symlink() else None
    if os.path.lexists(output_dir):
        os.replace(output_dir, aside)
    try:
        os.replace(temporary, output_dir)
    except OSError as error:
        if os.path.lexists(aside):  # put the earlier state back
            os.replace(aside, output_dir)
        raise write_failure(error, output_dir, "publishing") from error
    _fsync_dir(output_dir.parent)
    try:
        remove_entry(aside)
    except OSError as error:  # published: the new state is in place, only the old one is left
        warnings.warn(
            f"Published {output_dir}, but the state it replaced, moved aside to {aside}, could not be "
            f"removed: {_reason(error)}. Remove it by hand (it is never taken for a state while "
            f"{output_dir} exists); the next save of that name fails until then.",
            stacklevel=2,
        )
    if linked is not None:
        warnings.warn(
            f"{output_dir} was a symbolic link to {linked}: the new training state replaces the link, and "
            f"the state it pointed to is left as it was, at {linked}.",
            stacklevel=2,
        )


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # best effort: not every file system flushes a directory
        _fsync(directory)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sealed(manifest: dict[str, Any]) -> str:
    """The text of ``manifest`` ending with the CRC-32 of the rest (its canonical JSON)."""
    content = {key: value for key, value in manifest.items() if key != SEAL}
    crc = zlib.crc32(json.dumps(content, indent=2, sort_keys=True).encode())
    return json.dumps({**content, SEAL: f"{crc:08x}"}, indent=2, sort_keys=True)


def _load_manifest(directory: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest in ``directory`` (None when absent or damaged) and what is wrong with it
    (None when intact or absent)."""
    try:
        text = (directory / MANIFEST).read_bytes()
    except OSError:
        return None, None
    try:
        manifest = json.loads(text)
    except ValueError:  # a damaged byte (invalid UTF-8 too)
        return None, "is not valid JSON"
    if not isinstance(manifest, dict):
        return None, "is not a JSON object"
    # Written by version 2 or later: its text must be exactly what was written, seal included.
    sealed = SEAL in manifest or (manifest.get("format") == FORMAT and manifest.get("version") != 1)
    if sealed and text != _sealed(manifest).encode():
        return None, "does not match its own checksum"
    return manifest, None


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a complete training state, or None if ``directory`` is not one (or its
    manifest is damaged: see :func:`manifest_problem`)."""
    manifest = _load_manifest(directory)[0] or {}
    return manifest if manifest.get("format") == FORMAT and manifest.get("complete") else None


def manifest_problem(directory: Path) -> str | None:
    """Why the manifest of ``directory`` was changed after it was written (a damaged byte), or
    None when it is intact, absent, or of an older version (unchecked)."""
    problem = _load_manifest(directory)[1]
    return (
        f"{directory / MANIFEST} is damaged: it {problem}, so it was changed after it was saved. {DAMAGED_STATE_FIX}"
        if problem is not None
        else None
    )


def file_checksum(manifest: dict[str, Any], name: str) -> Checksum | None:
    """The CRC-32 that ``manifest`` records for the state's file ``name`` (None: none recorded)."""
    crc = manifest.get("crc32", {}).get(name)
    return None if crc is None else Checksum(int(crc, 16), "the manifest", DAMAGED_STATE_FIX)


def list_files(directory: Path) -> list[str]:
    """The files of the state being written in ``directory``, as paths relative to it: every file
    but the hidden markers at its top (a sharded layout's ``.metadata`` files are listed)."""
    relative = (path.relative_to(directory) for path in directory.rglob("*") if path.is_file())
    return sorted(path.as_posix() for path in relative if not path.parts[0].startswith("."))


def sync_files(directory: Path) -> None:
    """Flush every file under ``directory`` (and the directories) to disk: accelerate writes
    ``FULL_STATE_DICT`` files with a plain ``torch.save``; DCP flushes its own."""
    for path in sorted(directory.rglob("*"), reverse=True):
        _fsync(path)
