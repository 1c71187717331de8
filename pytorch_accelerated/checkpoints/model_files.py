"""Single-file checkpoints: the weights (and optimizer, scheduler) in one file, written by
``Trainer.save_checkpoint`` and read by ``Trainer.load_checkpoint`` (through
:class:`~pytorch_accelerated.checkpoints.trainer_io.CheckpointMethods`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from . import collective_saves, files, finite, state_checks

if TYPE_CHECKING:
    from ..trainer import Trainer

_RESERVED = {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}


def save_checkpoint(
    trainer: Trainer,
    save_path: str | os.PathLike,
    checkpoint_kwargs: dict[str, Any] | None,
    save_optimizer: bool,
    save_scheduler: bool,
    save_per_node: bool,
    model: nn.Module | None = None,
) -> None:
    finite.check_finite_before_save(trainer, model, f"the checkpoint {str(save_path)!r}")
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    reserved = _RESERVED & set(extra)
    if reserved:
        raise ValueError(f"checkpoint_kwargs may not use the reserved keys {sorted(reserved)}; rename them.")
    accelerator = trainer.accelerator
    # Called on every process: with sharded models, collecting the state is collective.
    source = trainer.model if model is None else model
    # The plain model's keys, also for a torch.compile'd model (no "_orig_mod." segments).
    checkpoint: dict[str, Any] = {"model_state_dict": state_checks.without_compile_prefix(accelerator.get_state_dict(source))}
    if save_optimizer and trainer.optimizer is not None:
        checkpoint["optimizer_state_dict"] = trainer.optimizer.state_dict()
    if save_scheduler and trainer.scheduler is not None:
        checkpoint["scheduler_state_dict"] = trainer.scheduler.state_dict()
    checkpoint.update(extra)
    writer = accelerator.is_local_main_process if save_per_node else accelerator.is_main_process
    error = collective_saves.attempt(files.atomic_torch_save, checkpoint, save_path) if writer else None
    collective_saves.agree_on_save(trainer, error, "the checkpoint", Path(save_path))


def load_checkpoint(
    trainer: Trainer,
    checkpoint_path: str | os.PathLike,
    load_optimizer: bool,
    load_scheduler: bool,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    checkpoint = files.safe_torch_load(checkpoint_path)
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(f"{str(checkpoint_path)!r} is not a checkpoint written by save_checkpoint (no 'model_state_dict').")
    target = trainer.get_model() if model is None else model
    # Everything is checked before anything is loaded, so a bad file changes nothing.
    model_state = state_checks.match_model_keys(target, checkpoint["model_state_dict"])
    state_checks.check_model_state(target, model_state, str(checkpoint_path))
    # Absent states, and objects the trainer does not have (an evaluation-only Trainer), are skipped.
    optimizer_state = checkpoint.get("optimizer_state_dict") if load_optimizer and trainer.optimizer is not None else None
    scheduler_state = checkpoint.get("scheduler_state_dict") if load_scheduler and trainer.scheduler is not None else None
    if optimizer_state is not None:
        state_checks.check_object_state(trainer.optimizer, optimizer_state, f"{checkpoint_path} (optimizer_state_dict)")
    if scheduler_state is not None:
        state_checks.check_object_state(trainer.scheduler, scheduler_state, f"{checkpoint_path} (scheduler_state_dict)")
    target.load_state_dict(model_state)
    if optimizer_state is not None:
        cast(Any, trainer.optimizer).load_state_dict(optimizer_state)
    if scheduler_state is not None:
        cast(Any, trainer.scheduler).load_state_dict(scheduler_state)
    return checkpoint


def load_model_state(model: nn.Module, state: dict[str, Any], source: str) -> None:
    """Load ``state`` into ``model`` (unwrapped), or explain exactly how it does not fit."""
    state = state_checks.match_model_keys(model, state)
    state_checks.check_model_state(model, state, source)
    model.load_state_dict(state)
