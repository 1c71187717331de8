"""How the processes save a file or a training state together: which process writes what, and
agreeing on the outcome, so that a save that fails on one process raises on every process and
leaves nothing half-written behind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from . import files, state_dirs

if TYPE_CHECKING:
    from ..trainer import Trainer


def attempt(action: Callable[..., Any], *args: Any) -> Exception | None:
    """Run one step of a save; return its error instead of raising it, so that every process
    can agree on the outcome (an interrupt is raised at once)."""
    try:
        action(*args)
    except Exception as error:
        return error
    return None


def failed_ranks(trainer: Trainer, failed: bool) -> list[int]:
    """The processes on which ``failed`` is true, known on every process (a collective)."""
    accelerator = trainer.accelerator
    if accelerator.num_processes == 1:
        return [0] if failed else []
    flags = accelerator.gather(torch.tensor([float(failed)], device=trainer.device))
    return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def agree_on_save(trainer: Trainer, error: Exception | None, what: str, target: Path) -> None:
    """Raise on every process if a step of saving ``what`` to ``target`` failed on any.

    The process that failed raises its own error, as a :class:`files.CheckpointWriteError`
    naming ``target`` and the OS error when there was one; the others say which process failed.
    """
    failed = failed_ranks(trainer, error is not None)
    if not failed:
        return
    if what == "the training state":
        state_dirs.remove_temporary(target)
    intact = (
        "the previous states are intact"
        if what == "the training state"
        else "an earlier file there is unchanged"
    )
    if error is None:
        raise files.CheckpointWriteError(
            None,
            f"Could not save {what} to {target}: process {', '.join(map(str, failed))} failed to "
            f"write it (its output says why). Nothing was written; {intact}.",
            target,
        )
    if isinstance(error, files.CheckpointWriteError) and not error.message.startswith("Could not save"):
        raise files.CheckpointWriteError(
            error.errno,
            f"Could not save {what} to {target}: {error.message}. Nothing was written; "
            f"{intact}. {files.write_hint(error, target)}",
            target,
        ) from error
    raise error


def saves_on_each_node(accelerator: Any) -> bool:
    """Whether training states are written on every node (accelerate's
    ``ProjectConfiguration.save_on_each_node``), for nodes that share no file system: each
    node's main process then writes the whole state, with its node's per-process files."""
    return bool(accelerator.project_configuration.save_on_each_node)


def writes_shared_files(accelerator: Any) -> bool:
    """Whether this process writes a state's shared files (model, optimizer, ...) and publishes it."""
    return bool(
        accelerator.is_local_main_process if saves_on_each_node(accelerator) else accelerator.is_main_process
    )
