"""How the processes save a file or a training state together: which process writes what, and
agreeing on the outcome, so that a save that fails on one process raises on every process and
leaves nothing half-written behind.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._internal.distributed import ranks_where
from . import torch_files
from .directories import temporary_dir_for


def attempt(action: Callable[..., Any], *args: Any) -> Exception | None:
    """Run one step of a save; return its error instead of raising it, so that every process
    can agree on the outcome (an interrupt is raised at once)."""
    try:
        action(*args)
    except Exception as error:
        return error
    return None


@dataclass(frozen=True)
class CollectiveSave:
    """One save that every process takes part in: ``what`` (e.g. "the checkpoint") written to
    ``target``. ``kept`` says what a failed save leaves as it was; ``clean_up`` removes what a
    failed step left behind."""

    accelerator: Any
    what: str
    target: Path
    kept: str
    clean_up: Callable[[], None] | None = None

    def agree(self, error: Exception | None) -> None:
        """Raise on every process if this step of the save failed on any.

        The process that failed raises its own error, as a :class:`.torch_files.CheckpointWriteError`
        naming the target and the OS error when there was one; the others say which process failed.
        """
        failed = ranks_where(self.accelerator, error is not None)
        if not failed:
            return
        if self.clean_up is not None:
            self.clean_up()
        if error is None:
            raise torch_files.CheckpointWriteError(
                None,
                f"Could not save {self.what} to {self.target}: process {', '.join(map(str, failed))} failed to "
                f"write it (its output says why). {_left_behind(self.target)}; {self.kept}.",
                self.target,
            )
        if isinstance(error, torch_files.CheckpointWriteError) and not error.message.startswith(
            "Could not save"
        ):
            raise torch_files.CheckpointWriteError(
                error.errno,
                f"Could not save {self.what} to {self.target}: {error.message}. {_left_behind(self.target)}; "
                f"{self.kept}. {torch_files.write_hint(error, self.target)}",
                self.target,
            ) from error
        raise error


def _left_behind(target: Path) -> str:
    """What a failed save left: nothing, or a hidden directory that its clean-up could not remove
    (a folder that turned read-only or immutable)."""
    hidden = temporary_dir_for(target)
    return (
        f"Nothing was published, but the hidden directory {hidden} could not be removed (is {target.parent} "
        f"read-only?): remove it once the folder is writable again (it is never taken for a state)"
        if hidden.exists()
        else "Nothing was written"
    )


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


def unshared_directory_error(
    accelerator: Any, temporary: Path, error: Exception | None = None
) -> Exception | None:
    """``error``; or, when this process cannot see the hidden directory ``temporary`` that the
    main process created (a folder that looked shared when the run started), an error that says so:
    a background save's publisher would otherwise wait for this process's files there until the
    collective timeout."""
    if temporary.is_dir() or saves_on_each_node(accelerator):
        return error
    return torch_files.CheckpointWriteError(
        getattr(error, "errno", None) or errno.ENOENT,
        f"process {accelerator.process_index} cannot see the directory {temporary} that the main process "
        f"created, though it saw the folder's lock there (a file system shared with a delay?). Give each "
        f"machine a folder of its own (states are then saved on each machine), or a folder that every "
        f"machine sees at once (see 'Several machines' in docs/launching.md)",
        temporary,
    )
