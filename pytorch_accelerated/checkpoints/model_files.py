"""Single-file checkpoints: the weights (and optimizer, scheduler) in one file, written by
``Trainer.save_checkpoint`` and read by ``Trainer.load_checkpoint`` (through
:class:`~pytorch_accelerated.checkpoints.trainer_io.CheckpointMethods`).

The file always holds full (unsharded) states, keyed as those of a plain model and a plain
optimizer: under FSDP, whose parameters are sharded ``DTensor``s, the model's full state comes
from ``accelerator.get_state_dict`` and the optimizer's from torch's
``get_optimizer_state_dict(full_state_dict=True)``, renumbered as ``optimizer.state_dict()``
numbers parameters; loading goes the other way (``set_model_state_dict`` /
``set_optimizer_state_dict``), so a file loads into a plain model, a DDP one or a sharded one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType
from torch import nn

from .._internal.fsdp import fsdp2_modules, is_dtensor
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
    if save_optimizer:
        _refuse_fsdp1_optimizer(trainer, "save_checkpoint", "save_optimizer")
    finite.check_finite_before_save(trainer, model, f"the checkpoint {str(save_path)!r}")
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    reserved = _RESERVED & set(extra)
    if reserved:
        raise ValueError(f"checkpoint_kwargs may not use the reserved keys {sorted(reserved)}; rename them.")
    accelerator = trainer.accelerator
    writer = accelerator.is_local_main_process if save_per_node else accelerator.is_main_process
    # Called on every process: with sharded models, collecting the state is collective.
    source = trainer.model if model is None else model
    everywhere = is_sharded(source) and _written_beyond_main_process(trainer, writer)
    # The plain model's keys, also for a torch.compile'd model (no "_orig_mod." segments).
    checkpoint: dict[str, Any] = {
        "model_state_dict": state_checks.without_compile_prefix(_model_state(trainer, source, everywhere))
    }
    if save_optimizer and trainer.optimizer is not None:
        checkpoint["optimizer_state_dict"] = optimizer_state_dict(trainer, everywhere)
    if save_scheduler and trainer.scheduler is not None:
        checkpoint["scheduler_state_dict"] = trainer.scheduler.state_dict()
    checkpoint.update(extra)
    error = collective_saves.attempt(files.atomic_torch_save, checkpoint, save_path) if writer else None
    collective_saves.agree_on_save(trainer, error, "the checkpoint", Path(save_path))


def load_checkpoint(
    trainer: Trainer,
    checkpoint_path: str | os.PathLike,
    load_optimizer: bool,
    load_scheduler: bool,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    if load_optimizer:
        _refuse_fsdp1_optimizer(trainer, "load_checkpoint", "load_optimizer")
    checkpoint = files.safe_torch_load(checkpoint_path)
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(
            f"{str(checkpoint_path)!r} is not a checkpoint written by save_checkpoint (no 'model_state_dict')."
        )
    target = trainer.get_model() if model is None else model
    # Everything is checked before anything is loaded, so a bad file changes nothing.
    model_state = state_checks.match_model_keys(target, checkpoint["model_state_dict"])
    state_checks.check_model_state(target, model_state, str(checkpoint_path))
    # Absent states, and objects the trainer does not have (an evaluation-only Trainer), are skipped.
    optimizer_state = (
        checkpoint.get("optimizer_state_dict") if load_optimizer and trainer.optimizer is not None else None
    )
    scheduler_state = (
        checkpoint.get("scheduler_state_dict") if load_scheduler and trainer.scheduler is not None else None
    )
    if optimizer_state is not None:
        state_checks.check_object_state(
            trainer.optimizer, optimizer_state, f"{checkpoint_path} (optimizer_state_dict)"
        )
    if scheduler_state is not None:
        state_checks.check_object_state(
            trainer.scheduler, scheduler_state, f"{checkpoint_path} (scheduler_state_dict)"
        )
    load_full_model_state(target, model_state)
    if optimizer_state is not None:
        load_optimizer_state(trainer, optimizer_state)
    if scheduler_state is not None:
        cast(Any, trainer.scheduler).load_state_dict(scheduler_state)
    return checkpoint


def load_model_state(model: nn.Module, state: dict[str, Any], source: str) -> None:
    """Load ``state`` into ``model`` (unwrapped), or explain exactly how it does not fit."""
    state = state_checks.match_model_keys(model, state)
    state_checks.check_model_state(model, state, source)
    load_full_model_state(model, state)


def is_sharded(module: nn.Module) -> bool:
    """True when ``module`` is sharded by FSDP2 (``fully_shard``) or its parameters are sharded
    ``DTensor``s (tensor parallelism)."""
    return bool(fsdp2_modules(module)) or any(is_dtensor(parameter) for parameter in module.parameters())


def registered_shards(module: nn.Module) -> nn.Module:
    """``module``, with FSDP2's sharded parameters registered on it again.

    FSDP2 leaves the root module's parameters gathered (whole, plain tensors) after a forward
    pass that no backward pass follows, as in an evaluation, until its next forward pass: its
    parameters are then not those that the optimizer holds. Resharding is local to each process.
    """
    for part in fsdp2_modules(module):
        part.reshard()
    return module


def _torch_optimizer(optimizer: Any) -> Any:
    return optimizer.optimizer if isinstance(optimizer, AcceleratedOptimizer) else optimizer


def _sharded_optimizer(trainer: Trainer) -> bool:
    parameters = (
        parameter
        for group in _torch_optimizer(trainer.optimizer).param_groups
        for parameter in group["params"]
    )
    return any(is_dtensor(parameter) for parameter in parameters)


def _refuse_fsdp1_optimizer(trainer: Trainer, method: str, argument: str) -> None:
    """Refuse, before anything is read or written, to move a whole optimizer state in or out of
    FSDP version 1, whose optimizer holds flattened shards: only FSDP2's is gathered here."""
    accelerator = trainer.accelerator
    if (
        trainer.optimizer is None
        or accelerator.distributed_type != DistributedType.FSDP
        or accelerator.is_fsdp2
    ):
        return
    raise ValueError(
        f"{method} cannot move the whole optimizer state under FSDP version 1 (accelerate's "
        f"fsdp_version=1), whose optimizer holds flattened shards; only FSDP2's is supported. Use FSDP2 "
        f"(FullyShardedDataParallelPlugin(fsdp_version=2), or `accelerate launch --use_fsdp --fsdp_version 2`), "
        f"or pass {method}(..., {argument}=False); save_training_state saves the sharded optimizer state."
    )


def _written_beyond_main_process(trainer: Trainer, writer: bool) -> bool:
    """Whether a process other than the main one writes the file (one per node, with
    ``save_per_node`` on several machines). A collective."""
    if trainer.accelerator.num_processes == 1:
        return False
    flags = trainer.accelerator.gather(torch.tensor([float(writer)], device=trainer.device)).tolist()
    return any(flag > 0 for flag in flags[1:])


def _model_state(trainer: Trainer, model: nn.Module, everywhere: bool) -> dict[str, Any]:
    """``model``'s full state dict, on the CPU: on the main process only (accelerate's
    ``get_state_dict``), or on every process when ``everywhere`` (each node's writer needs it)."""
    if not everywhere:
        return cast(dict[str, Any], trainer.accelerator.get_state_dict(model))
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    plain = registered_shards(trainer.accelerator.unwrap_model(model, keep_torch_compile=False))
    return _on_cpu(get_model_state_dict(plain, options=StateDictOptions(full_state_dict=True)))


def _on_cpu(value: Any) -> Any:
    """``value`` (a state dict, nested) with its tensors copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {key: _on_cpu(item) for key, item in value.items()}
    return value


def optimizer_state_dict(trainer: Trainer, everywhere: bool = False) -> dict[str, Any]:
    """The trainer's optimizer's whole state, as a plain optimizer's ``state_dict()``.

    Over sharded parameters it is gathered (a collective: every process must call this), on
    the CPU, by the main process only (the others get an empty dict) unless ``everywhere``.
    """
    if not _sharded_optimizer(trainer):
        return cast(dict[str, Any], trainer.optimizer.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    state = get_optimizer_state_dict(
        _plain_model(trainer), _torch_optimizer(trainer.optimizer), options=options
    )
    return _numbered(_on_cpu(state) if everywhere else cast(dict[str, Any], state))


def _numbered(state: dict[str, Any]) -> dict[str, Any]:
    """A state keyed by parameter names renumbered as ``optimizer.state_dict()`` numbers the
    parameters: 0, 1, ... through the parameter groups in order."""
    if "param_groups" not in state:
        return state  # not the main process: nothing gathered here
    numbers: dict[str, int] = {}
    for group in state["param_groups"]:
        for name in group["params"]:
            numbers.setdefault(name, len(numbers))
    groups = [
        {**group, "params": [numbers[name] for name in group["params"]]} for group in state["param_groups"]
    ]
    return {"state": {numbers[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _plain_model(trainer: Trainer) -> nn.Module:
    """The trainer's model without wrappers (FSDP2 shards the module in place), its parameters
    those that the optimizer holds."""
    return registered_shards(trainer.get_model(keep_torch_compile=False))


def load_optimizer_state(trainer: Trainer, state: dict[str, Any]) -> None:
    """Load a plain optimizer's ``state_dict()`` (checked) into the trainer's optimizer; over
    sharded parameters each process keeps its shards of it (every process must call this)."""
    if not _sharded_optimizer(trainer):
        cast(Any, trainer.optimizer).load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    model, optimizer = _plain_model(trainer), _torch_optimizer(trainer.optimizer)
    names_of = {id(parameter): name for name, parameter in model.named_parameters()}
    names = [names_of[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    named: dict[str, Any] = {
        "state": {names[number]: value for number, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[number] for number in group["params"]]}
            for group in state["param_groups"]
        ],
    }
    set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))
    # The groups' settings exactly as saved, as load_state_dict leaves them (torch's loader
    # turns tuples, such as AdamW's betas, into lists).
    for group, saved in zip(optimizer.param_groups, state["param_groups"], strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def load_full_model_state(model: nn.Module, state: dict[str, Any]) -> None:
    """Load a full (checked) state dict into ``model``; a sharded model keeps its shards of it
    (every process must call this then)."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(registered_shards(model), state, options=StateDictOptions(full_state_dict=True))
