"""What ``train(..., resume_from="auto")`` decides, the same on every process: the training state to
resume from in the folder of the run's states, or a new run; and whether the relaunch would only
repeat the failure that ended the launches before it.

Knows nothing of the Trainer: it is given the accelerator and the folder. One collective call decides:
the local main process of each machine lists the states of its own folder (the folders of several
machines need not be one shared folder) and the failure records there, every process gathers the
lists and takes the same decision. A run started with ``"auto"`` that ends with an exception records
it, per process, in ``<folder>/failure_rank{R}.json``; the same failure again after resuming from
the same state marks the record repeated, and the next ``"auto"`` launch that would resume from that
state again ends before training. See docs/checkpoints.md, "One script for every launch" and
"No endless restart loop".
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object

from .._internal.errors import add_note
from .._internal.hangs import is_collective_failure
from .discovery import candidate_states
from .original_states import is_original_state
from .resume import ResumePlan

#: The value of ``resume_from`` that chooses by itself.
AUTO = "auto"
#: The file a process of an ``"auto"`` run records its failure in, inside the folder of states.
FAILURE_RECORD = "failure_rank{rank}.json"


class RepeatedFailureError(RuntimeError):
    """A ``resume_from="auto"`` launch would resume from the state after which the same failure
    happened at least twice: it ends before training (its message says where and what to do)."""


class AutoResume:
    """The choice of ``resume_from="auto"`` for a run whose states are saved into ``folder``."""

    def __init__(self, accelerator: Any, folder: Path) -> None:
        self.accelerator = accelerator
        self.folder = folder
        self.failures: list[dict[str, Any]] = []  # the records every machine's folder holds
        self.origin: dict[str, Any] | None = None  # the state the run resumed from (None: new)

    def choose(self) -> ResumePlan | None:
        """The plan of the resume (the states to try), or None for a new run; every process must call
        this, and every process gets the same answer. The folder is listed once, here.

        When every machine sees the same states, the folder's: its newest complete, verified state is
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
        nodes = [node for node in views if node is not None]
        self.failures = [record for node in nodes for record in node["failures"]]
        chosen = decide(self.folder, nodes)
        if chosen is None:
            if accelerator.is_main_process:
                print(f'resume_from="auto": no training state in {self.folder}, starting a new run')
            return None
        if chosen != self.folder:  # the newest state every machine has
            return ResumePlan(chosen, (chosen,), explicit=True, auto=True)
        names = nodes[0]["states"]  # the folder itself ("."), or its states, in the order to try them
        return ResumePlan(self.folder, tuple(self.folder / name for name in names), names == ["."], auto=True)

    def check_not_repeating(self, origin: dict[str, Any] | None) -> None:
        """Before training: note where the run starts (``origin``: the ``run_id`` and ``update`` of
        the state it resumed, None for a new run), and end the launch when a repeated failure was
        recorded after starting there (on every process alike: they share the records).

        Raises:
            RepeatedFailureError: naming the failure, where, how many times, and what to do.
        """
        self.origin = origin
        for record in self.failures:
            if record.get("repeated") and record.get("resumed_from") == origin:
                raise RepeatedFailureError(
                    f'resume_from="auto": the same failure as before. {_describe(record)}, '
                    f"{record['count']} times, the last after {_describe_origin(origin)} (recorded in "
                    f"{record['file']}). "
                    f"This launch ends here instead of training up to it again. Fix the cause, then delete "
                    f"{record['file']} and launch again (a newer state in {self.folder} clears it too); or "
                    f"pass resume_from an earlier state of {self.folder} to try from there."
                )

    def record_failure(self, error: BaseException, position: dict[str, int]) -> None:
        """The run failed on this process with ``error`` at ``position`` (``update``, ``epoch``,
        ``batch``, counted from 1, 1, 0) after starting at :attr:`origin`: record it in this
        process's file; when it is the same failure as the one recorded there before (the same
        exception type raised by the same line at the same update: no progress past it), count it,
        mark it repeated and add a note to ``error`` saying so; a failed collective operation (a peer
        lost) never repeats. Never raises: a failure to record is a note on ``error``."""
        path = self.folder / FAILURE_RECORD.format(rank=self.accelerator.process_index)
        frames = traceback.extract_tb(error.__traceback__)
        record = {
            "exception": type(error).__qualname__,
            "message": str(error),
            "raised_at": f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown",
            **position,
            "resumed_from": self.origin,
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "count": 1,
            "repeated": False,
        }
        before = _read_record(path)
        # A lost peer (killed, preempted) is not this process's failure: it never counts as repeated.
        if (
            before is not None
            and all(before.get(key) == record[key] for key in ("exception", "raised_at", "update"))
            and not is_collective_failure(error)
        ):
            record.update(count=int(before.get("count", 1)) + 1, repeated=True)
            add_note(
                error,
                f'resume_from="auto": the same failure as before, {record["count"]} times at update '
                f"{record['update']}, this time after {_describe_origin(self.origin)} (recorded in {path}): "
                f'the next launch with resume_from="auto" that would start there again ends before training.',
            )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{os.getpid()}")
            temporary.write_text(json.dumps(record, indent=1))
            os.replace(temporary, path)
        except OSError as failure:
            add_note(error, f"(This failure could not be recorded in {path}: {failure}.)")

    def clear_failure(self) -> None:
        """The run ended without an exception: remove this process's failure record."""
        path = self.folder / FAILURE_RECORD.format(rank=self.accelerator.process_index)
        # A folder that turned read-only: the record stays, cleared by the newer states.
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def _describe(record: dict[str, Any]) -> str:
    return (
        f"{record['exception']}: {record['message']!r} at update {record['update']} (epoch {record['epoch']}, "
        f"batch {record['batch']}), raised at {record['raised_at']}"
    )


def _describe_origin(origin: dict[str, Any] | None) -> str:
    return (
        "starting a new run"
        if origin is None
        else f"resuming from update {origin['update']} of run {origin['run_id']}"
    )


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _failures_in(folder: Path) -> list[dict[str, Any]]:
    """The failure records in ``folder`` (each with the ``file`` it was read from)."""
    records = [(path, _read_record(path)) for path in sorted(folder.glob(FAILURE_RECORD.format(rank="*")))]
    return [{**record, "file": str(path)} for path, record in records if record is not None]


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
        return {"rank": rank, "states": _states_in(folder), "failures": _failures_in(folder), "problem": None}
    except Exception as error:  # said on every process, by choose()
        return {"rank": rank, "states": [], "failures": [], "problem": str(error)}


def _states_in(folder: Path) -> list[str]:
    """The names of the states a resume from ``folder`` tries, in order; [] when it holds none."""
    if not folder.is_dir():
        return []
    try:
        candidates, _ = candidate_states(folder)  # warns when the folder holds other runs' states
    except ValueError:
        if any(is_original_state(child) for child in folder.iterdir() if child.is_dir()):
            raise  # states of 0.1.x: they are resumed only when named
        return []  # nothing that is a training state
    return [child.name if child != folder else "." for child in candidates]
