"""Single-file checkpoints: the weights (and optimizer, scheduler) in one file, written by
``Trainer.save_checkpoint`` and read by ``Trainer.load_checkpoint``.

The file always holds whole (unsharded) states, keyed as those of a plain model and a plain
optimizer (see :mod:`.sharded` for how a sharded model's are gathered and scattered), so a file
loads into a plain model, a DDP one or a sharded one. Knows nothing of the Trainer: it is given
the run's objects.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from torch import nn

from .._internal.distributed import ranks_where
from . import collective_saves, files, finite, sharded, state_checks
from .training_objects import TrainingObjects

_RESERVED = {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}
_FIX = (
    "Load another checkpoint with load_checkpoint, or save it again. If you replaced the file on "
    "purpose, delete its .crc32 file beside it."
)


def save_checkpoint(
    objects: TrainingObjects,
    save_path: str | os.PathLike,
    checkpoint_kwargs: dict[str, Any] | None,
    options: tuple[bool, bool, bool],
    model: nn.Module | None = None,
) -> None:
    """What ``Trainer.save_checkpoint`` does: save the model (and optimizer, scheduler) state with
    ``checkpoint_kwargs`` to one file. ``options`` are its ``save_optimizer``, ``save_scheduler`` and
    ``save_per_node``.

    The file is written by each node's main process when ``save_per_node`` (for nodes that
    do not share a file system), else by the main process only; it is written to a
    temporary name first, so an interrupted save never leaves a truncated file. Numpy
    values and paths in ``checkpoint_kwargs`` are stored as safe equivalents (numbers,
    tensors, strings). ``model`` saves the weights of another model (e.g. an EMA copy) in
    the same layout. Every process must call this. The file's CRC-32 is written beside it, to
    ``<save_path>.crc32``, and checked by :func:`load_checkpoint` before anything is loaded.

    Raises:
        CheckpointWriteError: (an ``OSError``, from :mod:`pytorch_accelerated.checkpoints.files`)
            on every process when the file could not be written, naming it and the OS
            error; an earlier file at ``save_path`` is kept and no temporary file is left.
    """
    save_optimizer, save_scheduler, save_per_node = options
    accelerator = objects.accelerator
    if save_optimizer:
        sharded.refuse_fsdp1_optimizer(accelerator, objects.optimizer, "save_checkpoint", "save_optimizer")
    source = objects.model if model is None else model
    finite.check_finite_before_save(objects, source, f"the checkpoint {str(save_path)!r}")
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    if reserved := _RESERVED & set(extra):
        raise ValueError(f"checkpoint_kwargs may not use the reserved keys {sorted(reserved)}; rename them.")
    writer = accelerator.is_local_main_process if save_per_node else accelerator.is_main_process
    # Called on every process: with sharded models, collecting the state is collective. With
    # save_per_node on several machines, every node's writer needs the whole state.
    everywhere = sharded.is_sharded(source) and any(rank > 0 for rank in ranks_where(accelerator, writer))
    # The plain model's keys, also for a torch.compile'd model (no "_orig_mod." segments).
    checkpoint: dict[str, Any] = {
        "model_state_dict": state_checks.without_compile_prefix(
            sharded.full_model_state(accelerator, source, everywhere)
        )
    }
    if save_optimizer and objects.optimizer is not None:
        checkpoint["optimizer_state_dict"] = sharded.full_optimizer_state(
            objects.plain_model(keep_torch_compile=False), objects.optimizer, everywhere
        )
    if save_scheduler and objects.scheduler is not None:
        checkpoint["scheduler_state_dict"] = objects.scheduler.state_dict()
    checkpoint.update(extra)
    collective_saves.CollectiveSave(
        accelerator, "the checkpoint", Path(save_path), "an earlier file there is unchanged"
    ).agree(collective_saves.attempt(files.atomic_torch_save, checkpoint, save_path) if writer else None)


def load_checkpoint(
    objects: TrainingObjects,
    checkpoint_path: str | os.PathLike,
    options: tuple[bool, bool],
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """What ``Trainer.load_checkpoint`` does (``options`` are its ``load_optimizer`` and
    ``load_scheduler``): load a file written by ``save_checkpoint`` (never running code from it) and
    return its whole dictionary: ``model_state_dict``, ``optimizer_state_dict`` and
    ``scheduler_state_dict`` when saved, and the ``checkpoint_kwargs``. ``model`` loads the
    weights into another model.

    A state the file lacks, or that the trainer has no object for (an evaluation-only
    Trainer has no optimizer, a fresh one no scheduler), is skipped. Weights saved from a
    ``torch.compile``'d model load into the plain one and the reverse. Everything is checked
    (the file, its bytes against the CRC-32 in ``<file>.crc32`` where there is one, the model's
    keys and shapes, the optimizer's parameter groups) before
    anything is loaded, so a file that does not fit changes nothing. A file without its ``.crc32``
    loads unchecked, with a warning saying so (once per machine).
    """
    load_optimizer, load_scheduler = options
    optimizer, scheduler = objects.optimizer, objects.scheduler
    if load_optimizer:
        sharded.refuse_fsdp1_optimizer(objects.accelerator, optimizer, "load_checkpoint", "load_optimizer")
    checkpoint, verified = _read(checkpoint_path)
    target = objects.plain_model() if model is None else model
    # Everything is checked before anything is loaded, so a bad file changes nothing.
    model_state = state_checks.match_model_keys(target, checkpoint["model_state_dict"])
    state_checks.check_model_state(target, model_state, str(checkpoint_path))
    # Absent states, and objects the trainer does not have (an evaluation-only Trainer), are skipped.
    wanted = {
        "optimizer_state_dict": (load_optimizer, optimizer),
        "scheduler_state_dict": (load_scheduler, scheduler),
    }
    states = {
        key: checkpoint[key]
        for key, (load, obj) in wanted.items()
        if load and obj is not None and checkpoint.get(key) is not None
    }
    for key, state in states.items():
        state_checks.check_object_state(wanted[key][1], state, f"{checkpoint_path} ({key})")
    sharded.load_full_model_state(target, model_state)
    if "optimizer_state_dict" in states:
        sharded.load_full_optimizer_state(
            objects.plain_model(keep_torch_compile=False), optimizer, states["optimizer_state_dict"]
        )
    if "scheduler_state_dict" in states:
        scheduler.load_state_dict(states["scheduler_state_dict"])
    if not verified and objects.accelerator.is_local_main_process:  # once per machine
        warnings.warn(_unverified(Path(checkpoint_path)), stacklevel=3)
    return checkpoint


def _read(checkpoint_path: str | os.PathLike) -> tuple[dict[str, Any], bool]:
    """The dict of a file written by ``save_checkpoint``, and whether its bytes were checked (against
    the CRC-32 in its ``.crc32``: a file without one is read unchecked)."""
    checksum = files.recorded_checksum(checkpoint_path, _FIX)
    checkpoint = files.safe_torch_load(checkpoint_path, checksum)
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(
            f"{str(checkpoint_path)!r} is not a checkpoint written by save_checkpoint (no 'model_state_dict')."
        )
    return checkpoint, checksum is not None


def _unverified(path: Path) -> str:
    sidecar = files.checksum_file(path)
    return (
        f"Loaded {path} without checking its bytes: there is no {sidecar} beside it (save_checkpoint writes "
        f"one), so damage that still loads, such as a changed byte in a tensor's data, would go unnoticed. "
        f"Files written by torch.save, by pytorch-accelerated 0.1.x or by earlier versions of this library "
        f"have none; a copy may have left it behind. Copy {sidecar.name} with the file, or save it again "
        f"with save_checkpoint."
    )
