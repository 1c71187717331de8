"""Finding training states: the state a path names, or the complete ones in a folder, newest first.

Knows nothing of the Trainer. A folder's states are ordered by the run's update step (over its
``train()`` calls), then by when they were written; a state is complete once its manifest says so
(see :mod:`.directories`). A folder resume continues the run that wrote the folder's newest state:
when the folder holds the states of several runs (run ids), only that run's are candidates.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from .directories import MANIFEST, manifest_problem, read_manifest, temporary_dir_for
from .original_states import is_original_state


def resolve_state_dir(path: str | os.PathLike) -> Path:
    """Return the training state at ``path``, or the first to try inside it (see :func:`candidate_states`).

    Raises:
        FileNotFoundError / ValueError: with what was found, when there is no complete state.
    """
    return candidate_states(path)[0][0]


def candidate_states(path: str | os.PathLike, warn: bool = True) -> tuple[list[Path], bool]:
    """The training states to try for ``path``, newest first, and whether ``path`` names one.

    A state directory (or the one recovered from a save killed between its two renames) is the
    only candidate, and True says so (a caller must not fall back from it); a folder gives its
    states whose manifest is damaged (which cannot be ordered), then the complete states of the run
    that wrote its newest one, newest (highest update step of the run, then latest written) first,
    and False; a state that lost its manifest is never tried (a warning names it). ``warn``: warn when the folder holds the states of several runs (see
    :func:`_newest_run`).

    Raises:
        FileNotFoundError / ValueError: with what was found, when there is no complete state.
        NotADirectoryError: ``path`` is a file (a checkpoint file is not a training state).
    """
    path = Path(path)
    if path.is_file():
        raise NotADirectoryError(
            f"resume_from={str(path)!r} is a file, not a training state: a training state is a directory "
            f"(written by save_training_state or SaveTrainingStateCallback), while one file, as "
            f"save_checkpoint writes, is a checkpoint file: weights (and optimizer) without the run's "
            f"position. To start from a checkpoint file, call trainer.load_checkpoint({str(path)!r}) "
            f"before trainer.train(...), without resume_from; to continue a run, pass resume_from a "
            f"state directory or a folder of them."
        )
    if not path.is_dir():
        # A save that replaced a state of the same name may have been killed between its two
        # renames: the complete new state, or else the old one, is still there under a hidden name.
        for hidden in (temporary_dir_for(path), path.parent / f".{path.name}.replaced"):
            if read_manifest(hidden) is not None:
                return [hidden], True
        raise _no_such_directory(path)
    if read_manifest(path) is not None or is_original_state(path) or manifest_problem(path):
        return [path], True  # a damaged manifest: its layout's read says so
    _refuse_incomplete_state(path)
    return _states_of_folder(path, warn), False


def _no_such_directory(path: Path) -> FileNotFoundError:
    """The error for a ``resume_from`` that names nothing: where it was looked for, the states its
    folder holds (a typo, a state rotated away), and how to start a new run or let ``"auto"`` choose."""
    where = (
        ""
        if path.is_absolute()
        else f" ({path.absolute()}; a relative path is read from the working directory, {os.getcwd()})"
    )
    names = [state.name for _, state in list_complete_states(path.parent)]
    if len(names) > 6:
        names = [*names[:2], "...", *names[-3:]]
    held = f" {path.parent} holds the training states {', '.join(names)}." if names else ""
    return FileNotFoundError(
        f"resume_from={str(path)!r}: no such directory{where}.{held} Pass the path of a training state (a "
        f"directory written by save_training_state or SaveTrainingStateCallback) or of a folder of them. To "
        f"start a new run, pass resume_from=None; to resume from the newest state in the folder your "
        f"SaveTrainingStateCallback saves into, or start a new run when it holds none (one script for the "
        f'first launch and every relaunch), pass resume_from="auto".'
    )


def _refuse_incomplete_state(path: Path) -> None:
    """Raise a ValueError saying why the directory ``path`` holds the files of a training state (or a
    manifest) but is no complete one; nothing when it is a folder (of states, or of nothing)."""
    if lost_manifest(path):
        raise ValueError(
            f"resume_from={str(path)!r} holds the files of a training state but has lost its {MANIFEST} "
            f"(deleted, or the state copied without it: a save publishes a state only with its manifest), so "
            f"its files cannot be checked. Put its {MANIFEST} back first, or resume from another state, or "
            f"from the parent folder to pick its newest complete one."
        )
    if (path / MANIFEST).exists():
        raise ValueError(
            f"resume_from={str(path)!r} is not a complete training state: its {MANIFEST} does not say "
            f"complete (it was not written by this library). Resume from another state, or from the parent "
            f"folder to pick its newest complete one."
        )


def _states_of_folder(folder: Path, warn: bool) -> list[Path]:
    """The states of ``folder`` to try (see :func:`candidate_states`); a warning names those that lost
    their manifest, which are never tried.

    Raises:
        ValueError: naming what was found, when the folder holds no state to try.
    """
    candidates = _manifests_in(folder)
    complete = [(manifest, _written(child), child) for manifest, child in candidates if manifest]
    damaged = sorted(child for manifest, child in candidates if manifest is None and manifest_problem(child))
    lost = sorted(child.name for manifest, child in candidates if manifest is None and lost_manifest(child))
    if not complete and not damaged:
        raise _no_complete_state(folder, lost)
    if lost:
        these = "these states are" if len(lost) > 1 else "this state is"
        warnings.warn(
            f"{folder}: {MANIFEST} is missing from {', '.join(lost)} (deleted, or the state copied without it: "
            f"a save publishes a state only with its manifest), so {these} never resumed from (its files "
            f"cannot be checked); a save of the same name replaces such a state. To resume from one, put its "
            f"{MANIFEST} back first.",
            stacklevel=4,
        )
    return damaged + (_newest_run(folder, complete, warn) if complete else [])


def lost_manifest(directory: Path) -> bool:
    """Whether ``directory`` holds the files of a training state of this library without its manifest
    (deleted, or the state copied without it: a save publishes a state only once its manifest is written)."""
    return not (directory / MANIFEST).exists() and (
        any((directory / name).exists() for name in ("trainer_state.pt", "model.pt"))
        or any(directory.glob("rng_state_*.pt"))
    )


def _no_complete_state(folder: Path, lost: list[str]) -> ValueError:
    """The error for a folder without any training state to resume (0.1.x's are resumed only when named;
    ``lost``: the states that lost their manifest)."""
    if lost:
        return ValueError(
            f"{folder} holds no training state that can be read: {', '.join(lost)} hold the files of a training "
            f"state but have lost their {MANIFEST} (deleted, or copied without it), so their files cannot be "
            f"checked. Put their {MANIFEST} back (from a backup, say) to resume from them, or move them out of "
            f'{folder} to start a new run there: resume_from="auto" never starts a new run over states it '
            f"cannot read."
        )
    found = sorted(child.name for child in folder.iterdir())
    original = sorted(child.name for child in folder.iterdir() if (child / "trainer_metadata.pt").is_file())
    return ValueError(
        f"resume_from={str(folder)!r} holds no complete training state (found: {found or 'nothing'}). "
        f"Pass a directory written by save_training_state or SaveTrainingStateCallback"
        + (
            f", or name one of the states written by pytorch-accelerated 0.1.x ({', '.join(original)}) "
            f"explicitly, e.g. {str(folder / original[-1])!r}."
            if original
            else "."
        )
    )


def _manifests_in(folder: Path) -> list[tuple[dict[str, Any] | None, Path]]:
    """Each directory directly inside ``folder`` but the hidden ones, with its manifest if it is
    a complete training state (else None)."""
    return [
        (read_manifest(child), child)
        for child in folder.iterdir()
        if child.is_dir() and not child.name.startswith(".")
    ]


def _newest_run(folder: Path, complete: list[tuple[dict[str, Any], int, Path]], warn: bool) -> list[Path]:
    """The states of the run that wrote the newest of ``complete`` (manifest, time written, directory),
    newest first; a warning names the run when the folder holds several."""
    run_id = max(complete, key=lambda state: state[1])[0].get("run_id")
    run_of = {child: manifest.get("run_id") for manifest, _, child in complete}
    ordered = [child for _, _, child in sorted(((run_step(m), w, c) for m, w, c in complete), reverse=True)]
    ours = [child for child in ordered if run_of[child] == run_id]
    runs = len(set(run_of.values()))
    if runs > 1 and warn:
        others = [child.name for child in reversed(ordered) if run_of[child] != run_id]
        warnings.warn(
            f"{folder} holds the training states of {runs} runs: continuing run {run_id}, which wrote "
            f"its newest state ({ours[0].name}); the other runs' states ({', '.join(others)}) are not "
            f"considered. To resume one of those, name it: resume_from={str(folder / others[-1])!r}.",
            stacklevel=4,
        )
    return ours


def run_step(manifest: dict[str, Any]) -> int:
    """A state's update step over its run's ``train()`` calls (the global step in older states)."""
    return int(manifest.get("run_step", manifest.get("global_step", 0)))


def save_order(state: Path) -> tuple[int, int]:
    """A complete state's place among its run's saves: its update step, then when it was written."""
    return run_step(read_manifest(state) or {}), _written(state)


def _written(state: Path) -> int:
    """When the state's manifest was written (ns), 0 if it cannot be told."""
    try:
        return (state / MANIFEST).stat().st_mtime_ns
    except OSError:
        return 0


def list_complete_states(save_dir: Path) -> list[tuple[int, Path]]:
    """Complete training states directly inside ``save_dir``, oldest first (by the run's update step)."""
    if not save_dir.is_dir():
        return []
    return sorted((run_step(manifest), child) for manifest, child in _manifests_in(save_dir) if manifest)
