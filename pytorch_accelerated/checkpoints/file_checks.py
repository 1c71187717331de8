"""All-or-nothing loads: every file of a state is read and checked before anything is changed.

A training state (or a single-file checkpoint) is first read whole and checked against the
objects it is meant for: each file present and loadable, the model's keys and shapes, the
optimizer's parameter groups, the keys that each file must hold, finite weights, and each file's
bytes against the CRC-32 recorded when it was saved (see :mod:`.directories`). Only a
state that passes every check is loaded, so a truncated optimizer or RNG file fails before the
model's weights are replaced. Knows nothing of the Trainer: it is given the objects to check
against.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import nn

from . import directories, reshard, torch_files


class StateMismatchError(RuntimeError):
    """A saved state that does not fit the object it would be loaded into (another model or
    optimizer); the message lists what differs."""


class UnusableStateError(ValueError):
    """A training state that cannot be resumed from: a file that lacks what it must hold, or
    NaN or infinite weights."""


def read_process_state(
    directory: Path, manifest: dict[str, Any], rank: int, num_processes: int | None
) -> dict[str, Any]:
    """Process ``rank``'s own state: its ``rng_state_<rank>.pt`` or, saved by another number of
    processes, the saved ones mapped onto ``num_processes`` (see :func:`.reshard.remap_process_states`)."""
    saved_processes = manifest.get("num_processes")
    if num_processes is None or saved_processes in (None, num_processes):
        return _read_rank_file(directory, f"rng_state_{rank}.pt", manifest)
    return reshard.remap_process_states(
        [
            _read_rank_file(directory, f"rng_state_{index}.pt", manifest)
            for index in range(int(saved_processes))
        ],
        rank,
        num_processes,
    )


def _read_rank_file(directory: Path, name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    process_state = read_file(directory, name, manifest)
    require_keys(process_state, ("rng", "train_loss"), directory / name)
    require_keys(process_state["rng"], ("python", "torch"), directory / name, "rng")
    return dict(process_state)


def read_file(directory: Path, name: str, manifest: dict[str, Any]) -> Any:
    """The file ``name`` of the state ``directory``, loaded safely and checked against the CRC-32
    that ``manifest`` records for it (FileNotFoundError naming it if missing)."""
    path = directory / name
    if not path.exists():
        raise FileNotFoundError(f"{directory} is missing {name}: the state was changed after it was saved.")
    return torch_files.safe_torch_load(path, checksum=directories.file_checksum(manifest, name))


def require_keys(value: Any, keys: tuple[str, ...], source: Path | str, part: str | None = None) -> None:
    """Raise :class:`UnusableStateError` unless ``value`` is a dict holding every key of ``keys``."""
    where = f"{source}" + (f" (its {part!r})" if part else "")
    if not isinstance(value, Mapping):
        raise UnusableStateError(
            f"{where} holds a {type(value).__name__} where a dict with {list(keys)} belongs: it was not written by this library."
        )
    missing = [key for key in keys if key not in value]
    if missing:
        raise UnusableStateError(
            f"{where} lacks {missing}: it was not written by this version of the library, or was changed."
        )


#: The position a state records (``trainer_state.pt``'s ``progress``, repeated in the manifest).
POSITION_KEYS = ("epoch", "global_step", "batch_index", "epoch_step")
#: The batch settings a manifest records: 1 or more (None: saved outside a training run).
SETTING_KEYS = ("num_processes", "per_device_batch_size", "gradient_accumulation_steps")


def check_saved_settings(directory: Path, manifest: dict[str, Any]) -> None:
    """Refuse a manifest whose batch settings no run has (0 processes, say), before they divide anything.

    Raises:
        UnusableStateError: naming the file, the setting and its value.
    """
    for key in SETTING_KEYS:
        value = manifest.get(key)
        if value is not None and not _whole(value, at_least=1):
            raise _cannot_be_right(
                directory / directories.MANIFEST, key, value, "a setting of the run, 1 or more"
            )


def check_position(directory: Path, manifest: dict[str, Any], state: dict[str, Any]) -> None:
    """Refuse a position that no run reaches: a negative or fractional count, a manifest and a
    ``trainer_state.pt`` (``state``) that disagree, more updates in the epoch than in the run, or a
    batch beyond the epoch; before anything is loaded.

    Raises:
        UnusableStateError: naming the file, the value and why it cannot be right.
    """
    where, progress = directory / "trainer_state.pt", state["progress"]
    for key in (key for key in POSITION_KEYS if key in progress):
        if not _whole(progress[key], at_least=0):
            raise _cannot_be_right(where, key, progress[key], "positions count from 0")
        if key in manifest and manifest[key] != progress[key]:
            why = (
                f"its {directories.MANIFEST} records {key}={manifest[key]!r}, and the two were saved together"
            )
            raise _cannot_be_right(where, key, progress[key], why)
    if progress.get("epoch_step", 0) > progress["global_step"]:
        why = f"it is more than global_step={progress['global_step']}"
        raise _cannot_be_right(where, "epoch_step", progress["epoch_step"], why)
    batches = manifest.get("num_batches_per_epoch")
    if _whole(batches, at_least=0) and progress["batch_index"] > batches:
        why = f"its {directories.MANIFEST} records {batches} batches per epoch"
        raise _cannot_be_right(where, "batch_index", progress["batch_index"], why)
    before = state.get("steps_before", 0)
    if not _whole(before, at_least=0):
        raise _cannot_be_right(where, "steps_before", before, "updates of earlier train() calls count from 0")
    if "run_step" in manifest and manifest["run_step"] != before + progress["global_step"]:
        why = (
            f"its trainer_state.pt records {before} updates of earlier train() calls and "
            f"global_step={progress['global_step']}"
        )
        raise _cannot_be_right(directory / directories.MANIFEST, "run_step", manifest["run_step"], why)


def _whole(value: Any, at_least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= at_least


def _cannot_be_right(where: Path, key: str, value: Any, why: str) -> UnusableStateError:
    return UnusableStateError(
        f"{where} records {key}={value!r}, which cannot be right: {why}. The state was changed after it was "
        f"saved, or was not written by this library. {directories.DAMAGED_STATE_FIX}"
    )


COMPILE_PREFIX = "_orig_mod."


def without_compile_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with the ``_orig_mod.`` segments that ``torch.compile`` adds removed from its
    keys: the state dict of the plain (uncompiled) model, which is what is saved."""
    if not any(COMPILE_PREFIX in key for key in state):
        return state
    return {key.replace(COMPILE_PREFIX, ""): value for key, value in state.items()}


def match_model_keys(model: nn.Module, state: Any) -> Any:
    """``state`` with each key renamed to ``model``'s key when the two differ only by
    ``torch.compile``'s ``_orig_mod.`` segments, so a state saved from a compiled model loads
    into the plain one and the reverse. Other keys are left for :func:`check_model_state`."""
    if not isinstance(state, Mapping):
        return state
    expected = list(model.state_dict())
    if set(state) == set(expected):
        return state
    plain = {key.replace(COMPILE_PREFIX, ""): key for key in expected}
    return {plain.get(key.replace(COMPILE_PREFIX, ""), key): value for key, value in state.items()}


def check_model_state(model: nn.Module, state: Any, source: str) -> None:
    """Raise :class:`StateMismatchError` naming the missing, unexpected and mismatched keys
    unless ``state`` fits ``model`` (unwrapped) exactly."""
    if not isinstance(state, Mapping) or not all(hasattr(value, "shape") for value in state.values()):
        raise StateMismatchError(f"The checkpoint {source!r} holds no model state dict (a dict of tensors).")
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in state.items()}
    mismatched = [
        f"{name}: {found[name]} in the file, {expected[name]} in the model"
        for name in sorted(set(found) & set(expected))
        if found[name] != expected[name]
    ]
    problems = [
        f"{what} {few(names)}"
        for what, names in (
            ("missing keys", sorted(set(expected) - set(found))),
            ("unexpected keys", sorted(set(found) - set(expected))),
            ("size mismatch for", mismatched),
        )
        if names
    ]
    if problems:
        raise StateMismatchError(
            f"The checkpoint {source!r} does not fit this model ({type(model).__name__}): "
            + "; ".join(problems)
            + ". Was it saved from a different model?"
        )


def check_object_state(target: Any, state: Any, source: str) -> None:
    """Raise unless ``state`` could be loaded into ``target`` (an optimizer: the same parameter
    groups with the same numbers of parameters; anything else: a dict)."""
    if not isinstance(state, Mapping):
        raise UnusableStateError(
            f"{source} holds a {type(state).__name__}, not the state dict of a {type(target).__name__}."
        )
    groups = getattr(target, "param_groups", None)
    if groups is None:
        return
    if not isinstance(state.get("param_groups"), list) or "state" not in state:
        raise UnusableStateError(
            f"{source} is not an optimizer state (it has no 'state' and 'param_groups')."
        )
    saved = [len(group.get("params", ())) for group in state["param_groups"]]
    now = [len(group["params"]) for group in groups]
    if saved != now:
        raise StateMismatchError(
            f"{source} does not fit this optimizer: it holds {len(saved)} parameter group(s) of {saved} "
            f"parameters, the optimizer has {len(now)} of {now}. Was it saved with another model or optimizer?"
        )


def few(items: list[str], limit: int = 5) -> str:
    """The first ``limit`` of ``items``, and how many more there are: ``a, b and 3 more``."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")
