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

The directory is written under a hidden temporary name beside its final one and renamed into
place only once the manifest is written, so a process killed mid-save leaves either the
previous state or the new one, never a half-written directory that looks complete. A save
that fails removes its temporary directory (see :func:`remove_temporary`). Every file is
loaded with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from .files import safe_torch_load, write_failure, write_torch_file

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


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    manifest = {"format": FORMAT, "version": VERSION, "complete": True, **manifest}
    try:
        with open(directory / MANIFEST, "w") as file:
            json.dump(manifest, file, indent=2, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
    except OSError as error:
        raise write_failure(error, directory / MANIFEST) from error


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
    candidates = [(read_manifest(child), child) for child in path.iterdir() if child.is_dir() and not child.name.startswith(".")]
    complete = [(manifest["global_step"], child.stat().st_mtime, child) for manifest, child in candidates if manifest]
    if not complete:
        found = sorted(child.name for child in path.iterdir())
        original = sorted(child.name for child in path.iterdir() if (child / "trainer_metadata.pt").is_file())
        raise ValueError(
            f"resume_from={str(path)!r} holds no complete training state (found: {found or 'nothing'}). "
            f"Pass a directory written by save_training_state or SaveTrainingStateCallback"
            + (f", or name one of the states written by pytorch-accelerated 0.1.x ({', '.join(original)}) "
               f"explicitly, e.g. {str(path / original[-1])!r}." if original else ".")
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
