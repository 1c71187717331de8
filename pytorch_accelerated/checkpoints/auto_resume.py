"""What ``train(..., resume_from="auto")`` decides, the same on every process: the training state to
resume from in the folder of the run's states, or a new run; and whether the relaunch would only
repeat the failure that ended the launches before it.

Knows nothing of the Trainer: it is given the accelerator and the folder. One collective call decides:
the local main process of each machine lists the states of its own folder (the folders of several
machines need not be one shared folder), the failure records there and whether another run holds
the folder, every process gathers the lists and takes the same decision. A run started with
``"auto"`` that fails with an exception once training has begun records it, per process, in
``<folder>/.failures/rank{R}.json``, with the script and code it came from (the entry script's
path and SHA-256, the package's version); the same failure again, of the same code, after
resuming from the same state marks the record repeated, and the next ``"auto"`` launch of that
code that would resume from that state again ends before training. A run refused before training
(the folder's lock, its arguments, settings or state checks) records nothing. See
docs/checkpoints.md, "One script for every launch" and "No endless restart loop".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object

from .._internal.errors import add_note
from .._internal.hangs import is_collective_failure
from . import folder_lock
from .directories import read_manifest
from .discovery import candidate_states, lost_manifest, run_step
from .original_states import is_original_state
from .resume import ResumePlan

#: The value of ``resume_from`` that chooses by itself.
AUTO = "auto"
#: The folder, inside the folder of states, that holds every process's failure record.
FAILURES = ".failures"
#: The file a process of an ``"auto"`` run records its failure in, inside :data:`FAILURES`.
FAILURE_RECORD = "rank{rank}.json"
#: What a record says of the code it came from: two records of the same code agree on all of these.
CODE_KEYS = ("script", "script_sha256", "version")


class RepeatedFailureError(RuntimeError):
    """A ``resume_from="auto"`` launch would resume from the state after which the same failure
    happened at least twice: it ends before training (its message says where and what to do)."""


class AutoResume:
    """The choice of ``resume_from="auto"`` for a run whose states are saved into ``folder``."""

    def __init__(self, accelerator: Any, folder: Path, stage: int = 1) -> None:
        self.accelerator = accelerator
        self.folder = folder
        self.stage = stage  # which train() call of the Trainer this is (its states record it)
        self.failures: list[dict[str, Any]] = []  # the records every machine's folder holds
        # The state the run resumed from, or the state of an earlier stage this stage starts after
        # (None: a new run).
        self.origin: dict[str, Any] | None = None
        self.stage_finished = False  # the folder's newest state is of a later stage: nothing to do
        self.code = code_identity()

    def choose(self) -> ResumePlan | None:
        """The plan of the resume (the states to try), or None for a new run; every process must call
        this, and every process gets the same answer. The folder is listed once, here.

        When every machine sees the same states, the folder's: its newest complete, verified state is
        taken, as with ``resume_from=folder``. When their folders differ, the newest state that every
        machine has. None when no machine has any (then one line says a new run starts).

        Each ``train()`` call of a script is a stage (:attr:`stage`), and states record theirs: when the
        newest state is of an earlier stage, this stage starts after it (None, said in one line: the
        model is as the earlier call left it); when it is of a later stage, this stage finished in an
        earlier launch: :attr:`stage_finished` is set (None, said in one line), and the call trains
        nothing, for the later stage resumes its own state.

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
        # Refused now, before the line of a resume or a new run: a folder another run holds, or the
        # failure that the state to resume (the first one a resume tries) would repeat.
        if held := next((node["held"] for node in nodes if node["held"]), None):
            raise folder_lock.FolderInUseError(held)
        name, origin = _first_state(nodes[0], chosen)
        if not self._this_stage(name, origin):
            return None
        self.check_not_repeating(origin)
        if chosen is None:
            self._say(f"no training state in {self.folder}, starting a new run")
            return None
        if origin is not None and origin["stage"] < self.stage:
            self._say(
                f"stage {self.stage} (train() call {self.stage} of the script) starts here, from the model "
                f"as stage {origin['stage']} left it (its newest state in {self.folder}: {name})"
            )
            return None
        if chosen != self.folder:  # the newest state every machine has
            return ResumePlan(chosen, (chosen,), explicit=True, auto=True)
        names = nodes[0]["states"]  # the folder itself ("."), or its states, in the order to try them
        return ResumePlan(self.folder, tuple(self.folder / name for name in names), names == ["."], auto=True)

    def _this_stage(self, name: str | None, origin: dict[str, Any] | None) -> bool:
        """False, said in one line, when the newest state (``name``, where it starts: ``origin``) is
        of a later stage than this one: this stage finished in an earlier launch."""
        if origin is None or origin["stage"] <= self.stage:
            return True
        self.stage_finished = True
        self._say(
            f"stage {self.stage} (train() call {self.stage} of the script) finished in an earlier launch: "
            f"the newest state in {self.folder}, {name}, was saved by stage {origin['stage']}, which "
            f"resumes it. Nothing to train in this call."
        )
        return False

    def _say(self, line: str) -> None:
        if self.accelerator.is_main_process:
            print(f'resume_from="auto": {line}')

    def check_not_repeating(self, origin: dict[str, Any] | None) -> None:
        """Before training: note where the run starts (``origin``: the ``run_id`` and ``update`` of
        the state it resumes, None for a new run), and end the launch when a repeated failure of this
        very code (the same entry script, byte for byte, and package version) was recorded after
        starting there; on every process alike: they share the records.

        Raises:
            RepeatedFailureError: naming the failure, where, how many times, every record, and how
                to clear them.
        """
        self.origin = origin
        repeated = [
            record
            for record in self.failures
            if record.get("repeated")
            and record.get("resumed_from") == origin
            and same_code(record, self.code)
        ]
        if repeated:
            raise RepeatedFailureError(_repeated_message(self.folder, repeated, origin))

    def record_failure(self, error: BaseException, position: dict[str, int], began: bool = True) -> None:
        """The run failed on this process with ``error`` at ``position`` (``update``, ``epoch``,
        ``batch``, counted from 1, 1, 0) after starting at :attr:`origin`: record it in this
        process's file, with the code it came from; when it is the same failure as the one recorded
        there before (the same exception type raised by the same line at the same update, of the
        same code: no progress past it), count it, mark it repeated and add a note to ``error``
        saying so; a failed collective operation (a peer lost) never repeats. ``began``: False for a
        run refused before training began (see :func:`training_began`), which records nothing.
        Never raises: a failure to record is a note on ``error``."""
        if not began:
            return
        path = failures_folder(self.folder) / FAILURE_RECORD.format(rank=self.accelerator.process_index)
        frames = traceback.extract_tb(error.__traceback__)
        record = {
            "exception": type(error).__qualname__,
            "message": str(error),
            "raised_at": f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "unknown",
            **position,
            "resumed_from": self.origin,
            "rank": self.accelerator.process_index,
            **self.code,
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "count": 1,
            "repeated": False,
        }
        before = _read_record(path)
        # A lost peer (killed, preempted) is not this process's failure: it never counts as repeated.
        if (
            before is not None
            and all(
                before.get(key) == record[key] for key in ("exception", "raised_at", "update", *CODE_KEYS)
            )
            and not is_collective_failure(error)
        ):
            record.update(count=int(before.get("count", 1)) + 1, repeated=True)
            add_note(
                error,
                f'resume_from="auto": the same failure as before, {record["count"]} times at update '
                f"{record['update']}, this time after {_describe_origin(self.origin)}, with the same "
                f"script and code (recorded in {path.parent}): the next launch of this code with "
                f'resume_from="auto" that would start there again ends before training.',
            )
        _write_record(path, record, error)

    def clear_failure(self) -> None:
        """The run ended without an exception: remove this process's failure record (and the
        folder of records once it is empty)."""
        records = failures_folder(self.folder)
        # A folder that turned read-only: the record stays, cleared by the newer states.
        with contextlib.suppress(OSError):
            (records / FAILURE_RECORD.format(rank=self.accelerator.process_index)).unlink(missing_ok=True)
            records.rmdir()  # not empty: another process's record stays until that process clears it


def _write_record(path: Path, record: dict[str, Any], error: BaseException) -> None:
    """Write ``record`` to ``path`` atomically; a failure to is a note on ``error``."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(record, indent=1))
        os.replace(temporary, path)
    except OSError as failure:
        add_note(error, f"(This failure could not be recorded in {path}: {failure}.)")


def training_began(callback_handler: Any) -> bool:
    """Whether a run that failed had begun training: an event after ``on_training_run_start`` had
    fired. Before that, a failure is a refusal (the folder's lock, a check of the resumed state in
    the run's start events) or a callback's failure to start, which a relaunch does not repeat at
    any cost."""
    return (callback_handler.current_event or callback_handler.last_event) not in (
        None,
        "on_training_run_start",
    )


def code_identity() -> dict[str, Any]:
    """The code a run comes from: its entry script (``__main__``'s file, None in a notebook or an
    interactive session), the SHA-256 of that file's bytes, and this package's version."""
    # The package is imported by the time a run asks (this module is one of its parts); importing it
    # here would make the package and this module import each other.
    version = sys.modules[__name__.split(".")[0]].__version__
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    digest = None
    if script:
        with contextlib.suppress(OSError):
            digest = hashlib.sha256(Path(script).read_bytes()).hexdigest()
    return {
        "script": os.path.abspath(script) if script else None,
        "script_sha256": digest,
        "version": version,
    }


def same_code(record: dict[str, Any], code: dict[str, Any]) -> bool:
    """Whether ``record`` came from the code ``code`` (a record of an older version, without
    them, never does)."""
    return all(record.get(key, "unknown") == code[key] for key in CODE_KEYS)


def failures_folder(folder: Path) -> Path:
    """Where every process's failure record of the run saving into ``folder`` lives."""
    return folder / FAILURES


def clear_records_command(folder: Path) -> str:
    return f"rm -r {failures_folder(folder)}"


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


def _describe_code(record: dict[str, Any]) -> str:
    script = record.get("script")
    digest = str(record.get("script_sha256"))[:12]
    return (
        f"the script {script} (SHA-256 {digest}...) with pytorch-accelerated {record.get('version')}"
        if script
        else f"code without an entry script (a notebook?) with pytorch-accelerated {record.get('version')}"
    )


def _repeated_message(folder: Path, repeated: list[dict[str, Any]], origin: dict[str, Any] | None) -> str:
    first = repeated[0]
    processes = ", ".join(str(record.get("rank", "?")) for record in repeated)
    return (
        f'resume_from="auto": the same failure as before. {_describe(first)}, {first["count"]} times, '
        f"the last after {_describe_origin(origin)}, on process {processes}, each time with "
        f"{_describe_code(first)} (recorded in {failures_folder(folder)}: "
        f"{', '.join(Path(record['file']).name for record in repeated)}). This launch ends here instead "
        f"of training up to it again. Once the cause is fixed in the script, launch again: a changed "
        f"script is not held back. If the fix is elsewhere (a module it imports, the data, the "
        f"environment), clear the records of every process first: {clear_records_command(folder)} "
        f"(a newer state in {folder} clears them too); or pass resume_from an earlier state of "
        f"{folder} to try from there."
    )


def _first_state(node: dict[str, Any], chosen: Path | None) -> tuple[str | None, dict[str, Any] | None]:
    """The first state a resume of ``chosen`` tries whose manifest reads, as the main process's
    machine sees it, and where a resume of it starts: its run, update and stage ((None, None) for a
    new run, or when no state's manifest reads)."""
    if chosen is None:
        return None, None
    names = node["states"] if chosen == node.get("folder") else [chosen.name]
    return next(((name, node["origins"][name]) for name in names if node["origins"].get(name)), (None, None))


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _failures_in(folder: Path) -> list[dict[str, Any]]:
    """The failure records of the run saving into ``folder`` (each with the ``file`` it was read from)."""
    paths = sorted(failures_folder(folder).glob(FAILURE_RECORD.format(rank="*")))
    records = [(path, _read_record(path)) for path in paths]
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
    """What this machine sees in ``folder``: the states a resume would try, in order, with the run
    and update each starts from; the failure records; why another run's lock refuses this run
    (None: free); or the problem met."""
    view: dict[str, Any] = {"rank": rank, "folder": folder, "states": [], "origins": {}, "failures": []}
    try:
        view["held"] = folder_lock.refusal(folder)
        view["states"] = _states_in(folder)
        view["origins"] = {name: _origin_of(folder / name) for name in view["states"]}
        view["failures"] = _failures_in(folder)
        view["problem"] = None
    except Exception as error:  # said on every process, by choose()
        view.update(held=None, problem=str(error))
    return view


def _origin_of(state: Path) -> dict[str, Any] | None:
    manifest = read_manifest(state)
    if manifest is None:
        return None
    # A state of an older version, which had no stages, is of stage 1.
    return {
        "run_id": manifest.get("run_id"),
        "update": run_step(manifest),
        "stage": int(manifest.get("stage", 1)),
    }


def _states_in(folder: Path) -> list[str]:
    """The names of the states a resume from ``folder`` tries, in order; [] when it holds none."""
    if not folder.is_dir():
        return []
    try:
        candidates, _ = candidate_states(folder)  # warns of other runs' states, and of lost manifests
    except ValueError:
        children = [child for child in folder.iterdir() if child.is_dir() and not child.name.startswith(".")]
        if any(is_original_state(child) or lost_manifest(child) for child in children):
            raise  # states of 0.1.x (resumed only when named), or states it cannot read: never written over
        return []  # nothing that is a training state
    return [child.name if child != folder else "." for child in candidates]
