"""Training-state directories: layout, manifest, atomic publication, discovery, RNG capture.

Knows nothing of the Trainer. A training state is a directory::

    step-00000120/
        manifest.json        written last: says the state is complete, what it holds, and the
                             position and settings of the run when it was saved
        model.pt             the unwrapped model's state dict
        optimizer.pt         optimizer state (absent when the run has none)
        scheduler.pt         scheduler state (absent when the run has none)
        trainer_state.pt     progress, run history, callback states, partial epoch loss, ...
        rng_state_<rank>.pt  every RNG of each process

(Under FSDP the model and optimizer are saved in shards instead of ``model.pt`` and
``optimizer.pt``; see :mod:`.sharded`.)
The directory is written under a hidden temporary name beside its final one and renamed into
place only once the manifest is written, so a process killed mid-save leaves either the
previous state or the new one, never a half-written directory that looks complete. A save
that fails removes its temporary directory (see :func:`remove_temporary`). Every file is
loaded with ``weights_only=True``.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import sys
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .files import CheckpointWriteError, safe_torch_load, write_failure, write_torch_file

MANIFEST = "manifest.json"
FORMAT = "pytorch-accelerated-training-state"
VERSION = 1


def temporary_dir_for(output_dir: Path) -> Path:
    return output_dir.parent / f".{output_dir.name}.incomplete"


def make_temporary_dir(output_dir: Path) -> Path:
    """Create the empty hidden directory that a state for ``output_dir`` is written into.

    Raises:
        files.CheckpointWriteError: naming the directory and the OS error (e.g. a parent is a file).
    """
    temporary = temporary_dir_for(output_dir)
    try:
        if temporary.exists():  # left by a save that was killed
            shutil.rmtree(temporary)
        temporary.mkdir(parents=True)
    except OSError as error:
        raise write_failure(error, temporary, "creating") from error
    return temporary


def remove_temporary(output_dir: Path) -> None:
    """Remove what a failed save of ``output_dir`` left behind (nothing if it left nothing)."""
    shutil.rmtree(temporary_dir_for(output_dir), ignore_errors=True)


def write_file(obj: Any, path: Path) -> None:
    """``torch.save`` ``obj`` to ``path``, flushed to disk (see :func:`files.write_torch_file`)."""
    write_torch_file(obj, path)


def write_files(directory: Path, contents: dict[str, Any]) -> None:
    """Write each object of ``contents`` to the file of its name in ``directory``, flushed to disk."""
    for name, obj in contents.items():
        write_file(obj, directory / name)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest, then flush ``directory`` itself, so that every file's name in it is
    on disk too before the state can be published."""
    manifest = {"format": FORMAT, "version": VERSION, "complete": True, **manifest}
    try:
        with open(directory / MANIFEST, "w") as file:
            json.dump(manifest, file, indent=2, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        raise write_failure(error, directory / MANIFEST) from error
    _fsync_dir(directory)


def publish(temporary: Path, output_dir: Path) -> None:
    """Move a complete temporary directory to ``output_dir``, replacing any earlier state there.

    The earlier state is moved aside first and deleted only after the new one is in place.
    """
    aside = output_dir.parent / f".{output_dir.name}.replaced"
    if aside.exists():
        shutil.rmtree(aside)
    if output_dir.exists():
        os.replace(output_dir, aside)
    try:
        os.replace(temporary, output_dir)
    except OSError as error:
        if aside.exists():  # put the earlier state back
            os.replace(aside, output_dir)
        raise write_failure(error, output_dir, "publishing") from error
    _fsync_dir(output_dir.parent)
    if aside.exists():
        shutil.rmtree(aside)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_manifest(directory: Path) -> dict[str, Any] | None:
    """The manifest of a complete training state, or None if ``directory`` is not one."""
    try:
        with open(directory / MANIFEST) as file:
            manifest = json.load(file)
    except (OSError, ValueError):
        return None
    if manifest.get("format") != FORMAT or not manifest.get("complete"):
        return None
    return manifest


def resolve_state_dir(path: str | os.PathLike) -> Path:
    """Return the training state at ``path``, or the newest complete one inside it.

    Raises:
        FileNotFoundError / ValueError: with what was found, when there is no complete state.
    """
    return candidate_states(path)[0][0]


def candidate_states(path: str | os.PathLike) -> tuple[list[Path], bool]:
    """The training states to try for ``path``, newest first, and whether ``path`` names one.

    A state directory (or the one recovered from a save killed between its two renames) is the
    only candidate, and True says so (a caller must not fall back from it); a folder gives its
    complete states, newest (highest global step, then latest written) first, and False.

    Raises:
        FileNotFoundError / ValueError: with what was found, when there is no complete state.
    """
    path = Path(path)
    if not path.is_dir():
        # A save that replaced a state of the same name may have been killed between its two
        # renames: the complete new state, or else the old one, is still there under a hidden name.
        for hidden in (temporary_dir_for(path), path.parent / f".{path.name}.replaced"):
            if read_manifest(hidden) is not None:
                return [hidden], True
        raise FileNotFoundError(f"resume_from={str(path)!r}: no such directory.")
    if read_manifest(path) is not None:
        return [path], True
    if (path / MANIFEST).exists() or (path / "model.pt").exists():
        raise ValueError(
            f"resume_from={str(path)!r} is an incomplete training state (its manifest is missing or "
            f"does not say complete): the save that wrote it was interrupted. Resume from an earlier "
            f"state, or from the parent folder to pick the newest complete one."
        )
    candidates = [
        (read_manifest(child), child)
        for child in path.iterdir()
        if child.is_dir() and not child.name.startswith(".")
    ]
    complete = [
        (manifest["global_step"], child.stat().st_mtime, child) for manifest, child in candidates if manifest
    ]
    if not complete:
        found = sorted(child.name for child in path.iterdir())
        original = sorted(child.name for child in path.iterdir() if (child / "trainer_metadata.pt").is_file())
        raise ValueError(
            f"resume_from={str(path)!r} holds no complete training state (found: {found or 'nothing'}). "
            f"Pass a directory written by save_training_state or SaveTrainingStateCallback"
            + (
                f", or name one of the states written by pytorch-accelerated 0.1.x ({', '.join(original)}) "
                f"explicitly, e.g. {str(path / original[-1])!r}."
                if original
                else "."
            )
        )
    return [child for _, _, child in sorted(complete, reverse=True)], False


def list_complete_states(save_dir: Path) -> list[tuple[int, Path]]:
    """Complete training states directly inside ``save_dir``, oldest first (by global step)."""
    if not save_dir.is_dir():
        return []
    states = []
    for child in save_dir.iterdir():
        manifest = read_manifest(child) if child.is_dir() and not child.name.startswith(".") else None
        if manifest is not None:
            states.append((manifest["global_step"], child))
    return sorted(states)


def load_file(directory: Path, name: str) -> Any:
    return safe_torch_load(directory / name)


# ---------------------------------------------------------------------------- background writes


def to_host(value: Any, buffers: dict[tuple[int, str, int], Any] | None = None) -> Any:
    """A copy of ``value`` in host memory that training cannot change: every tensor copied to
    a new CPU tensor (tensors that shared a storage share the copy of it, as in ``torch.save``),
    dicts (an ``OrderedDict``'s ``_metadata`` too), lists and tuples copied; other values kept.

    ``buffers`` (host storages of an earlier copy, by the source storage they copied) are
    overwritten instead of allocating new memory where a source storage of the same address
    and size is met again (allocating is the slower half of a copy), and are replaced by this
    copy's storages. They must no longer be in use (the earlier copy written to disk).
    """
    storages: dict[tuple[int, str, int], Any] = {}
    copied = _to_host(value, storages, buffers or {})
    if buffers is not None:
        buffers.clear()
        buffers.update(storages)
    return copied


def _to_host(
    value: Any, storages: dict[tuple[int, str, int], Any], buffers: dict[tuple[int, str, int], Any]
) -> Any:
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value.detach(), storages, buffers)
    if isinstance(value, OrderedDict):
        copied: Any = OrderedDict((key, _to_host(item, storages, buffers)) for key, item in value.items())
        if hasattr(value, "_metadata"):  # the module versions that load_state_dict reads
            copied._metadata = _to_host(value._metadata, storages, buffers)
        return copied
    if isinstance(value, dict):
        return {key: _to_host(item, storages, buffers) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_to_host(item, storages, buffers) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _copy_tensor(
    tensor: torch.Tensor, storages: dict[tuple[int, str, int], Any], buffers: dict[tuple[int, str, int], Any]
) -> torch.Tensor:
    if tensor.layout != torch.strided or type(tensor) is not torch.Tensor:  # sparse, subclasses: copied alone
        return tensor.to("cpu", copy=True)
    storage = tensor.untyped_storage()
    key = (storage.data_ptr(), str(storage.device), storage.nbytes())
    if key not in storages:
        buffer = buffers.get(key)
        if buffer is not None:
            storages[key] = buffer.copy_(storage)
        else:
            storages[key] = storage.clone() if storage.device.type == "cpu" else storage.cpu()
    copy = torch.empty(0, dtype=tensor.dtype)
    return copy.set_(storages[key], tensor.storage_offset(), tensor.size(), tensor.stride())


_RUNNING: set[BackgroundStateWrite] = set()


class BackgroundStateWrite:
    """One process's part of a training state written in a background thread.

    Every process writes its files (``contents``, copies in host memory, see :func:`to_host`)
    into the hidden directory of ``output_dir``, which must exist. The publishing process (the
    one given the ``manifest``) then waits until every other process has marked its files as
    written and flushed (a ``.done_<rank>`` file; ``.failed_<rank>`` holds a failure), for at
    most ``timeout_s`` seconds, and only then writes the manifest and publishes the state (see
    :func:`publish`). A process killed meanwhile leaves the hidden directory, never a state that
    looks complete. :meth:`wait` returns the error of the write, if any; the thread never raises.
    """

    def __init__(
        self,
        output_dir: Path,
        contents: dict[str, Any],
        rank: int,
        num_processes: int,
        manifest: dict[str, Any] | None,
        timeout_s: float,
    ) -> None:
        self.output_dir, self.temporary = output_dir, temporary_dir_for(output_dir)
        self.error: BaseException | None = None
        self._contents, self._rank, self._manifest = contents, rank, manifest
        self._others = [other for other in range(num_processes) if other != rank]
        self._timeout_s = timeout_s
        self._deadline = time.monotonic() + timeout_s
        self._thread = threading.Thread(target=self._run, name=f"save {output_dir.name}", daemon=False)
        _RUNNING.add(self)
        self._thread.start()

    def _run(self) -> None:
        try:
            write_files(self.temporary, self._contents)
            self._contents = {}  # free the copies as soon as they are on disk
            if self._manifest is None:
                _mark(self.temporary / f".done_{self._rank}", "")
                return
            self._wait_for_other_processes()
            write_manifest(self.temporary, self._manifest)
            publish(self.temporary, self.output_dir)
        except BaseException as error:  # kept for wait(), which raises it in the training thread
            self.error = write_failure(error, self.temporary)
            if self._manifest is None:
                _mark(self.temporary / f".failed_{self._rank}", str(self.error))
        finally:
            self._contents = {}

    def _wait_for_other_processes(self) -> None:
        waiting = set(self._others)
        while waiting:
            for rank in sorted(waiting):
                failed = self.temporary / f".failed_{rank}"
                if failed.exists():
                    raise CheckpointWriteError(
                        None,
                        f"process {rank} could not write its files ({failed.read_text()})",
                        self.output_dir,
                    )
                if (self.temporary / f".done_{rank}").exists():
                    waiting.discard(rank)
            if waiting and time.monotonic() > self._deadline:
                raise CheckpointWriteError(
                    None,
                    f"process {', '.join(map(str, sorted(waiting)))} did not finish writing its files "
                    f"within {self._timeout_s:g} s (did it stop?), so the state was not published",
                    self.output_dir,
                )
            time.sleep(0.01)
        for rank in self._others:
            (self.temporary / f".done_{rank}").unlink(missing_ok=True)

    def wait(self, grace_s: float | None = None) -> BaseException | None:
        """Wait for the write to end; return its error, or None once it is published (or, on a
        process that does not publish, once its files are written). ``grace_s`` shortens the
        wait for the other processes (when one of them may have failed)."""
        if grace_s is not None:
            self._deadline = min(self._deadline, time.monotonic() + grace_s)
        self._thread.join()
        _RUNNING.discard(self)
        return self.error


def _mark(path: Path, text: str) -> None:
    """Create the marker ``path`` holding ``text`` in one step (written aside, then renamed)."""
    aside = path.with_name(path.name + ".tmp")
    try:
        aside.write_text(text)
        os.replace(aside, path)
    except OSError:
        pass  # the publisher then waits until its timeout, and says which process did not finish


@atexit.register
def _report_unfinished_writes() -> None:
    """At interpreter exit (after its threads have ended): say which background writes failed
    without anyone waiting for them."""
    for job in list(_RUNNING):
        error = job.wait()
        if error is not None:
            print(
                f"pytorch_accelerated: the training state {job.output_dir}, written in the background, "
                f"could not be saved: {error}",
                file=sys.stderr,
            )


# ---------------------------------------------------------------------------- RNG states


def capture_rng_states() -> dict[str, Any]:
    """Every RNG of this process, as values that load with ``weights_only=True``."""
    states: dict[str, Any] = {"python": _to_lists(random.getstate()), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        return states
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    states["numpy"] = {
        "kind": kind,
        "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(_to_tuples(states["python"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        import numpy as np

        numpy_state = states["numpy"]
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["position"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )


def _to_lists(value: Any) -> Any:
    return [_to_lists(item) for item in value] if isinstance(value, tuple) else value


def _to_tuples(value: Any) -> Any:
    return tuple(_to_tuples(item) for item in value) if isinstance(value, list) else value
