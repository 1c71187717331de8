"""What ``train(..., resume_from="auto")`` decides, the same on every process: the training state to
resume from in the folder of the run's states, or a new run.

Knows nothing of the Trainer: it is given the accelerator and the folder. One collective call decides:
the local main process of each machine lists the states of its own folder (the folders of several
machines need not be one shared folder), every process gathers the lists and takes the same decision.
See docs/checkpoints.md, "One script for every launch".
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object

from .discovery import candidate_states
from .original_states import is_original_state

#: The value of ``resume_from`` that chooses by itself.
AUTO = "auto"


class AutoResume:
    """The choice of ``resume_from="auto"`` for a run whose states are saved into ``folder``."""

    def __init__(self, accelerator: Any, folder: Path) -> None:
        self.accelerator = accelerator
        self.folder = folder

    def choose(self) -> Path | None:
        """The state (or folder of states) to resume from, or None for a new run; every process
        must call this, and every process gets the same answer.

        When every machine sees the same states, the folder: its newest complete, verified state is
        taken, as with ``resume_from=folder``. When their folders differ, the newest state that every
        machine has. None when no machine has any (then one line says a new run starts).

        Raises:
            ValueError: on every process, when a folder cannot be read or holds only states of
                pytorch-accelerated 0.1.x, or when some machines have states and others none (or
                none in common).
        """
        accelerator = self.accelerator
        view = _view(self.folder, accelerator.process_index) if accelerator.local_process_index == 0 else None
        views = [view] if accelerator.num_processes == 1 else gather_object([view])
        chosen = decide(self.folder, [node for node in views if node is not None])
        if chosen is None and accelerator.is_main_process:
            print(f'resume_from="auto": no training state in {self.folder}, starting a new run')
        return chosen


def decide(folder: Path, nodes: list[dict[str, Any]]) -> Path | None:
    """What :meth:`AutoResume.choose` returns, given what the local main process of each machine
    sees in its ``folder`` (``rank``, the names of its ``states`` in the order a resume tries them,
    and the ``problem`` met listing them, if any), the main process's machine first."""
    for node in nodes:
        if node["problem"] is not None:
            raise ValueError(
                f'resume_from="auto" cannot choose a training state in {folder} (seen by process '
                f"{node['rank']}): {node['problem']}"
            )
    names = nodes[0]["states"]
    if all(node["states"] == names for node in nodes):
        return folder if names else None
    common = [name for name in names if all(name in node["states"] for node in nodes)]
    if common:
        return folder / common[0]
    seen = "; ".join(
        f"process {node['rank']}'s machine: {', '.join(node['states']) or 'none'}" for node in nodes
    )
    raise ValueError(
        f'resume_from="auto" found training states in {folder} on some machines but none that every '
        f"machine has ({seen}). The machines would continue from different positions, so the run cannot "
        f"go on as it is. Copy the newest state into the folder of the machines that lack it, or start a "
        f"new run into an empty folder on every machine."
    )


def _view(folder: Path, rank: int) -> dict[str, Any]:
    """What this machine sees in ``folder``: the states a resume would try, in order, or the problem."""
    try:
        return {"rank": rank, "states": _states_in(folder), "problem": None}
    except Exception as error:  # said on every process, by choose()
        return {"rank": rank, "states": [], "problem": str(error)}


def _states_in(folder: Path) -> list[str]:
    """The names of the states a resume from ``folder`` tries, in order; [] when it holds none."""
    if not folder.is_dir():
        return []
    try:
        with warnings.catch_warnings():  # the resume itself warns about other runs' states
            warnings.simplefilter("ignore")
            candidates, _ = candidate_states(folder)
    except ValueError:
        if any(is_original_state(child) for child in folder.iterdir() if child.is_dir()):
            raise  # states of 0.1.x: they are resumed only when named
        return []  # nothing that is a training state
    return [child.name if child != folder else "." for child in candidates]
