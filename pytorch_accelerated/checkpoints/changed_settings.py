"""The run's settings that a training state records, compared with a resumed run's.

A state records (``trainer_state.pt``'s ``run_settings``) the training set's length, the seed, the
optimizer's class and the shapes of the parameters in each of its groups; the manifest records
the batch settings (see :mod:`.resume` and :mod:`.reshard`). Before anything is loaded, a change
is refused, naming the saved and the new value and the fix, or announced in one line, as the
table "Changed settings" of docs/checkpoints.md says. A state that lacks a record (an older one)
skips that comparison. Knows nothing of the Trainer: it is given the objects to compare.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from .._internal.fsdp import uses_fsdp
from ..data import is_map_style
from .training_objects import TrainingObjects

#: Parameter-group keys that a scheduler adds or that follow the schedule: not the user's settings.
SCHEDULE_KEYS = ("params", "initial_lr")


def run_settings(objects: TrainingObjects) -> dict[str, Any]:
    """What a state records of the run's settings, for :func:`check_optimizer` and :func:`changes`."""
    optimizer = plain_optimizer(objects.optimizer)
    config, dataset = objects.run_config, objects.train_dataset
    sharded = uses_fsdp(objects.accelerator)  # sharded parameters: their shapes depend on the processes
    return {
        "train_samples": len(dataset) if is_map_style(dataset) else None,
        "seed": config.seed if config is not None else None,
        "optimizer": class_name(optimizer) if optimizer is not None else None,
        "param_shapes": None if optimizer is None or sharded else param_shapes(optimizer),
    }


def plain_optimizer(optimizer: Any) -> Any:
    """The user's optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)


def class_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def param_shapes(optimizer: Any) -> list[list[list[int]]]:
    return [[list(param.shape) for param in group["params"]] for group in optimizer.param_groups]


def check_optimizer(objects: TrainingObjects, directory: Path, state: dict[str, Any], saved: Any) -> None:
    """Refuse, before anything is loaded, a state whose optimizer is of another class or holds
    parameters of other shapes per group than this run's, or whose parameter groups lack a
    setting this run's optimizer needs (``saved``: its optimizer state, None if not read whole).

    Raises:
        ValueError: naming the saved and the new optimizer and the fix.
    """
    optimizer = plain_optimizer(objects.optimizer)
    if optimizer is None:
        return
    recorded = state.get("run_settings") or {}
    fix = (
        f"Resume with the optimizer the state was saved with, or start a new run from its weights only "
        f"(model.load_state_dict(torch.load('{directory / 'model.pt'}')) before train(), without resume_from)."
    )
    saved_class, now_class = recorded.get("optimizer"), class_name(optimizer)
    if saved_class is not None and saved_class != now_class:
        raise ValueError(
            f"{directory} holds the state of a {saved_class} optimizer, but this run's optimizer is a {now_class}: "
            f"its parameter groups would replace this optimizer's settings. {fix}"
        )
    saved_shapes, now_shapes = recorded.get("param_shapes"), param_shapes(optimizer)
    if saved_shapes not in (None, now_shapes) and not uses_fsdp(objects.accelerator):
        raise ValueError(
            f"{directory} holds an optimizer state for parameters of shapes {_describe(saved_shapes)} per "
            f"group, but this run's optimizer has {_describe(now_shapes)}: the groups hold other "
            f"parameters. {fix}"
        )
    lacking = (
        _lacking_after_load(optimizer, saved["param_groups"])
        if isinstance(saved, dict) and saved.get("param_groups")
        else []
    )
    if lacking:
        raise ValueError(
            f"{directory} holds an optimizer state whose parameter groups lack {lacking}, which this run's "
            f"{now_class} needs: it was saved with another optimizer. {fix}"
        )


def _lacking_after_load(optimizer: Any, saved_groups: list[dict[str, Any]]) -> list[str]:
    """The settings of ``optimizer``'s groups that the saved groups lack even after the defaults
    torch fills in on load (its ``__setstate__``: settings added by newer torch versions)."""
    groups = [dict(group) for group in saved_groups]
    probe = object.__new__(type(optimizer))
    try:
        probe.__setstate__({"defaults": dict(optimizer.defaults), "state": {}, "param_groups": groups})
    except Exception:  # an optimizer whose __setstate__ needs more: torch's own load decides
        return []
    return sorted(set(optimizer.param_groups[0]) - set(groups[0]) - set(SCHEDULE_KEYS))


def _describe(shapes: list[list[list[int]]]) -> str:
    return "; ".join(
        f"group {index}: {[tuple(shape) for shape in group]}" for index, group in enumerate(shapes)
    )


def check_training_set(
    objects: TrainingObjects, directory: Path, state: dict[str, Any], mid_epoch: bool
) -> list[str]:
    """Refuse a state saved mid-epoch over a training set of another length; return the notice
    for one saved at an epoch boundary (the next epoch goes over the new set).

    Raises:
        ValueError: naming both lengths and the fix.
    """
    saved = (state.get("run_settings") or {}).get("train_samples", state.get("train_samples"))
    now = run_settings(objects)["train_samples"]  # None: not known (as ``saved``)
    if saved is None or now is None or int(saved) == now:
        return []
    if mid_epoch:
        raise ValueError(
            f"{directory} was saved mid-epoch over a training set of {saved} samples, but this run's has {now}: "
            f"the epoch's order and position mean nothing for another data set. Resume with the same training "
            f"set, or from a state saved at the end of an epoch (SaveTrainingStateCallback's epoch_<E> states)."
        )
    return [
        f"the training set has {now} samples, not the {saved} it was saved with (the next epochs use the new set)"
    ]


def changes(objects: TrainingObjects, state: dict[str, Any], saved_optimizer: Any) -> list[str]:
    """What this run sets otherwise than the state and the state's value wins for: the seed and
    the optimizer's settings (learning rate, weight decay, ...), one phrase each."""
    found = []
    config = objects.run_config
    recorded = state.get("run_settings") or {}
    if recorded.get("seed") is not None and config is not None and recorded["seed"] != config.seed:
        found.append(
            f"seed={config.seed} is not used: the saved seed {recorded['seed']} orders the epochs, and the RNGs "
            f"continue from their saved states"
        )
    optimizer = plain_optimizer(objects.optimizer)
    if optimizer is None or not isinstance(saved_optimizer, dict):
        return found
    where = " (group {})" if len(optimizer.param_groups) > 1 else ""
    groups = zip(saved_optimizer.get("param_groups", ()), optimizer.param_groups, strict=True)
    differing = [
        f"{key} {saved[key]!r}{where.format(index)}, not this run's {now[key]!r}"
        for index, (saved, now) in enumerate((_settings(saved), _settings(now)) for saved, now in groups)
        for key in sorted(set(saved) & set(now))
        if not _same(saved[key], now[key])
    ]
    if differing:
        found.append(
            "the optimizer continues with its saved settings: "
            + "; ".join(differing)
            + " (docs: 'Changed settings')"
        )
    return found


def _settings(group: dict[str, Any]) -> dict[str, Any]:
    """A parameter group's settings; the learning rate as set by the user (before a scheduler)."""
    settings = {
        **{key: value for key, value in group.items() if key not in SCHEDULE_KEYS},
        "lr": group.get("initial_lr", group.get("lr")),
    }
    if "max_momentum" in group:  # OneCycleLR/CyclicLR cycle the momentum (Adam's first beta): compare
        settings.pop("momentum", None)  # their bounds, max_momentum and base_momentum, instead
        if "betas" in settings:
            settings["betas"] = tuple(settings["betas"])[1:]
    return settings


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return bool(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))
    return bool(a == b)


def announce(directory: Path, notices: list[str]) -> None:
    """One warning naming the state and every change the resume applies."""
    if notices:
        warnings.warn(f"Resuming {directory}: " + "; ".join(notices) + ".", stacklevel=7)


def resume_line(
    objects: TrainingObjects, directory: Path, asked: Path, state: dict[str, Any], auto: bool = False
) -> str:
    """The line a resume prints: the state (and, for a folder, that it was chosen there), the
    epoch and update the run continues at, and what it skips; ``auto``: chosen by
    ``resume_from="auto"``, which the line says, naming the run continued."""
    progress = objects.progress
    epoch, update = objects.run_history.current_epoch, progress.global_step
    where = (
        f"{directory}, the newest usable state in {asked}" if directory.parent == asked else str(directory)
    )
    resumed = (
        f'resume_from="auto": resuming run {objects.run_identity.run_id} from {where}'
        if auto
        else f"Resumed from {where}"
    )
    if progress.batch_index == 0:
        return f"{resumed} (update {update}; training continues with epoch {epoch})"
    if state.get("epoch_trained"):
        return f"{resumed} (epoch {epoch}, update {update}; its training is done: its evaluation runs again)"
    skipped = f"{progress.batch_index} batch{'es' if progress.batch_index != 1 else ''}"
    return f"{resumed} (epoch {epoch}, update {update}; skipping {skipped} already trained this epoch)"
