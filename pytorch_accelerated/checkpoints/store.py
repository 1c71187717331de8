"""The Trainer's training states: :class:`TrainingStateStore` saves one (now, or in the
background), waits for it, loads one, and resumes a run from one.

The processes agree after every step of a save or a load, so a step that fails on one process
raises on every process and leaves nothing half-written. Which files a state holds, and how
they are checked and loaded, is its layout's (:mod:`.layouts`), chosen once per save or load.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from accelerate.utils import gather_object

from .._internal.argument_checks import nothing_left_to_train
from .._internal.distributed import per_process, print_once_per_node, ranks_where
from .._internal.hangs import signal_grace_s
from .._internal.process_group import collective_timeout_s
from . import changed_settings, finite, folder_lock, resume, sharded, torch_files, trainable
from .background import BackgroundStateWrite, to_host
from .collective_saves import (
    CollectiveSave,
    attempt,
    saves_on_each_node,
    unshared_directory_error,
    writes_shared_files,
)
from .directories import (
    list_files,
    make_temporary_dir,
    publish,
    remove_leftover_temporaries,
    remove_temporary,
    temporary_dir_for,
    write_files,
    write_manifest,
)
from .layouts import LoadedState, PlainLayout, layout_for_saving, layout_of
from .resume import Resumed, ResumePlan
from .training_objects import TrainingObjects

if TYPE_CHECKING:
    pass


class TrainingStateStore:
    """Saves, waits for, loads and resumes training states (the Trainer's ``state_store``).

    It owns what lives between those calls: the state being written in the background (at most
    one, with the update step it was saved at) and the host memory that the next background copy
    reuses. Each call is given the run's objects (:class:`~.training_objects.TrainingObjects`);
    every process must make it.

    It also holds the folders that states are saved into (:meth:`hold`), one run per folder, until
    the end of the run (or of the save, outside a run).
    """

    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator
        self._background: tuple[BackgroundStateWrite, int] | None = None
        self._host_buffers: dict[tuple[int, str, int], Any] = {}
        self._shared: bool | None = None  # whether the machines share the folders (None: not known yet)
        self._told_synchronous = False
        self._held: dict[Path, dict[str, Any] | None] = {}  # folder -> its lock's record (writing process)
        self._runs = 0  # runs under way (an evaluate() inside a training run is a second)

    # ------------------------------------------------------------------ one run per folder

    def hold(self, folder: str | os.PathLike, run_id: str) -> None:
        """Take the lock of ``folder`` for the run ``run_id`` (see :mod:`.folder_lock`), unless held
        already; the process that writes the shared files takes it (and removes the hidden
        directories of killed saves there, saying so), and every process agrees.

        The first folder held with several processes also tells whether the machines share it
        (:meth:`_check_shared`); when they do not, states are saved on each machine from then on.
        A folder that cannot be written (e.g. its parent is a file) gets no lock: the save there
        fails with its own error.

        Raises:
            folder_lock.FolderInUseError: on every process, naming the holder, when another run holds it.
        """
        folder = Path(os.path.abspath(folder))
        if folder in self._held:
            return
        record, token = self._lock(folder, run_id, writes_shared_files(self._accelerator))
        if token and self._shared is None and not saves_on_each_node(self._accelerator):
            try:
                self._check_shared(folder, token)
            except ValueError:
                if record is not None:
                    folder_lock.release(folder, record)
                raise
            if self._shared is False:  # each machine's main process holds its own folder too
                record = self._lock(folder, run_id, not self._accelerator.is_main_process)[0] or record
        self._held[folder] = record

    def _lock(self, folder: Path, run_id: str, takes: bool) -> tuple[dict[str, Any] | None, str]:
        """Take the lock of ``folder`` on the processes where ``takes`` (each node's main process at
        most); return this process's record and the main process's lock token ("" without one)."""
        accelerator, record, error = self._accelerator, None, None
        if takes and accelerator.is_local_main_process:
            try:
                record = folder_lock.acquire(folder, run_id)
                if leftovers := remove_leftover_temporaries(folder):
                    print(
                        f"Removed the half-written states of killed saves in {folder}: {', '.join(leftovers)}"
                    )
            except folder_lock.FolderInUseError as failure:
                error = failure
            except OSError:  # a folder that cannot be written: no lock; the save says why
                pass
        # Every process's error, and the main process's lock token ("" without one).
        token = record["token"] if record is not None and accelerator.is_main_process else ""
        outcomes = gather_object([(str(error) if error is not None else "", token)])
        errors = [message for message, _ in outcomes if message]
        if errors:
            if record is not None:
                folder_lock.release(folder, record)
            raise error if error is not None else folder_lock.FolderInUseError(errors[0])
        return record, outcomes[0][1]

    def _check_shared(self, folder: Path, token: str) -> None:
        """Whether every process sees the lock that the main process took in ``folder`` (its
        ``token``); decided once for the store (one collective). When the other machines' folders
        are their own, states are saved on each machine from now on (accelerate's
        ``save_on_each_node``), and each machine's main process prints one line saying so.

        Raises:
            ValueError: when some machines share the folder and others do not, or the processes of
                one machine do not all see it.
        """
        accelerator = self._accelerator
        # Whether this process sees the main process's lock (token: never ""), and is its node's first.
        rows = per_process(
            accelerator,
            [(folder_lock.read(folder) or {}).get("token") == token, accelerator.is_local_main_process],
        )
        nodes = list(itertools.accumulate(int(local) for _, local in rows))  # node of each rank, from 1
        blind = [rank for rank, (saw, _) in enumerate(rows) if not saw]
        unseen = sorted({nodes[rank] - 1 for rank in blind})
        seen = sorted({node - 1 for node, (saw, _) in zip(nodes, rows, strict=True) if saw})
        self._shared = not blind
        if not blind:
            return
        if seen != [0] or 0 in unseen:
            raise ValueError(
                f"The folder {folder} is seen by some processes of this run and not by others: process "
                f"{', '.join(map(str, blind))} ({_nodes(unseen)}) cannot see what the main process writes there, though "
                f"processes on {_nodes(seen)} can. Give every machine the same shared folder, or each machine "
                f"a folder of its own that all its processes see (training states are then saved on each machine)."
            )
        accelerator.project_configuration.save_on_each_node = True
        print_once_per_node(
            accelerator,
            f"Saving training states on each machine: {folder} is not shared ({_nodes(unseen)} of {nodes[-1]} "
            f"cannot see what the main process writes there), so each machine keeps its own copy of every "
            f"state in its own folder; resume each machine from its own folder (the same resume_from on each).",
        )

    def release(self) -> None:
        """Release every folder held (on every exit path of a run)."""
        held, self._held = self._held, {}
        for folder, record in held.items():
            if record is not None:
                folder_lock.release(folder, record)

    # ------------------------------------------------------------------ saving

    def save(
        self,
        objects: TrainingObjects,
        output_dir: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None,
        asynchronous: bool = False,
    ) -> None:
        """What ``Trainer.save_training_state`` does: save everything that decides the rest of the run
        into the directory ``output_dir`` (first waiting for a state still being written in the
        background, and raising its error if it failed).

        Model, optimizer, scheduler, gradient scaler, every process's RNG states, the run
        history, every stateful callback's ``state_dict()`` (by its ``state_key``), and the
        exact position (epoch, optimizer step, batch). The directory appears only once
        complete. Every process must call this, between optimizer updates (not inside an
        accumulation window). Continue a run with ``train(..., resume_from=output_dir)``.
        A save that fails (disk full, a parent that is a file) removes what it wrote and raises
        ``CheckpointWriteError`` on every process, naming the directory and the OS error.

        ``asynchronous=True`` copies the state to host memory and returns; a background thread
        writes it, and publishes it only once every process's files are on disk. The next
        save, :meth:`load_training_state`, :meth:`wait_for_training_state` and the end of the
        run wait for it, and raise its ``CheckpointWriteError`` on every process if it failed.
        See docs/checkpoints.md, "Asynchronous training states".

        Under FSDP, every process writes its shards of the model and optimizer (accelerate's
        ``save_fsdp_model`` / ``save_fsdp_optimizer``), and ``asynchronous=True`` is refused;
        see docs/checkpoints.md, "Sharded models (FSDP)".
        """
        self.wait()
        output_dir = Path(output_dir)
        layout = layout_for_saving(objects.accelerator)
        layout.check_can_save(objects, output_dir, asynchronous)
        finite.check_finite_before_save(objects, objects.model, f"the training state {str(output_dir)!r}")
        extra = torch_files.to_safe_value(dict(checkpoint_kwargs or {}))
        position = resume.position_to_save(objects)
        weights = layout.weights(objects)  # on every process: collective with some engines
        try:
            self.hold(output_dir.parent, objects.run_identity.run_id)
            # Saved on each machine (found just now): synchronously (its background publication would
            # need a shared folder), not sharded.
            if self._shared is False:
                if asynchronous and not self._told_synchronous:
                    self._told_synchronous = True
                    print_once_per_node(
                        self._accelerator,
                        f"Saving {output_dir} and the later asynchronous training states synchronously: they are "
                        f"saved on each machine (see above), and a background save needs a folder every machine shares.",
                    )
                asynchronous = False
                layout.check_can_save(objects, output_dir, asynchronous)
            write = self._start_background_write if asynchronous else self._write
            write(_StateSave(layout, objects, output_dir, position, extra, weights))
        except KeyboardInterrupt:
            remove_temporary(output_dir)
            raise
        finally:
            if not self._runs and self._background is None:  # a save outside a run: its own run
                self.release()

    def _collective(self, output_dir: Path) -> CollectiveSave:
        """The save of the state ``output_dir`` that every process agrees on, step by step."""
        return CollectiveSave(
            self._accelerator,
            "the training state",
            output_dir,
            "the previous states are intact",
            functools.partial(remove_temporary, output_dir),
        )

    def _begin(self, state: _StateSave, main: bool) -> CollectiveSave:
        """Create the state's hidden directory (on ``main``); return the save every process agrees on."""
        save = self._collective(state.output_dir)
        save.agree(attempt(self._refresh_and_make_dir, state.output_dir) if main else None)
        return save

    def _refresh_and_make_dir(self, output_dir: Path) -> None:
        folder = Path(os.path.abspath(output_dir.parent))
        if (record := self._held.get(folder)) is not None:  # the folder's lock is still this run's: refreshed
            folder_lock.refresh(folder, record)
        make_temporary_dir(output_dir)

    def _write(self, state: _StateSave) -> None:
        """Write the state into its hidden directory, then publish it, agreeing after each step."""
        main = writes_shared_files(self._accelerator)
        save, temporary, contents = self._begin(state, main), temporary_dir_for(state.output_dir), {}
        error = attempt(lambda: contents.update(state.files(main))) or attempt(
            write_files, temporary, contents
        )
        save.agree(
            unshared_directory_error(self._accelerator, temporary, error) if error is not None else None
        )
        state.layout.write_collectively(state.objects, temporary, save)
        save.agree(attempt(self._publish, state, temporary) if main else None)

    @staticmethod
    def _publish(state: _StateSave, temporary: Path) -> None:
        """Write the manifest, listing every file of the state, then publish it."""
        state.layout.before_publishing(temporary)
        write_manifest(
            temporary,
            {**state.layout.manifest(state.objects, state.position), "files": list_files(temporary)},
        )
        publish(temporary, state.output_dir)

    def _start_background_write(self, state: _StateSave) -> None:
        """Copy the state to host memory (the loop may change the originals from now on) and write
        it in a background thread; :meth:`wait` waits for it."""
        accelerator = self._accelerator
        if saves_on_each_node(accelerator) and accelerator.num_processes > 1:
            raise ValueError(
                f"Cannot save {state.output_dir} asynchronously with accelerate's save_on_each_node: the "
                f"process that publishes a state in the background waits for the others' files in its folder, "
                f"which needs a shared file system. Save it synchronously (asynchronous=False), or turn "
                f"save_on_each_node off on a shared file system."
            )
        main = accelerator.is_main_process
        save, contents = self._begin(state, main), {}
        # The previous copy's memory is free again (it was waited for).
        save.agree(
            attempt(lambda: contents.update(to_host(state.files(main), self._host_buffers)))
            or unshared_directory_error(accelerator, temporary_dir_for(state.output_dir))
        )
        self._background = (
            BackgroundStateWrite(
                state.output_dir,
                contents,
                accelerator.process_index,
                accelerator.num_processes,
                state.layout.manifest(state.objects, state.position) if main else None,
                collective_timeout_s(),
            ),
            state.position["global_step"],
        )

    def wait(self) -> None:
        """What ``Trainer.wait_for_training_state`` does: wait until a state saved with
        ``asynchronous=True`` is written and published (at once when none is being written). Every
        process must call this when one is; once the write has failed on any process, its hidden
        directory is removed.

        Raises:
            CheckpointWriteError: on every process, when the background write failed on any,
                naming the state and the error; the previous states are intact.
        """
        if self._background is None:
            return
        (job, step), self._background = self._background, None
        error = job.wait()
        if not self._runs:  # saved outside a run: the folder is free once the state is
            self.release()
        try:
            self._collective(job.output_dir).agree(cast(Exception | None, error))
        except torch_files.CheckpointWriteError as failure:
            raise torch_files.CheckpointWriteError(
                failure.errno,
                f"{failure.message} (It was being written in the background, after update step {step}; "
                f"its error is raised at the next save, load or end of the run.)",
                job.output_dir,
            ) from failure

    @contextlib.contextmanager
    def finishing_run(self) -> Iterator[None]:
        """Around a run: at its end, wait for a state still being written in the background. When
        the run fails, wait without agreeing with the other processes (one may be gone), at most
        the signal grace for their files; a failure of the save is then printed, not raised. Either
        way, the folders held by the run are released."""
        self._runs += 1
        try:
            yield
        except BaseException:
            if self._background is not None:
                (job, _), self._background = self._background, None
                if (error := job.wait(grace_s=signal_grace_s())) is not None:
                    print_once_per_node(
                        self._accelerator,
                        f"The training state {job.output_dir}, written in the background, could not be saved: {error}",
                    )
            raise
        else:
            self.wait()
        finally:
            self._runs -= 1
            if not self._runs:
                self.release()

    # ------------------------------------------------------------------ loading

    def load(self, objects: TrainingObjects, input_dir: str | os.PathLike) -> dict[str, Any]:
        """What ``Trainer.load_training_state`` does: restore a state saved by ``save_training_state``;
        return ``{"current_epoch": E, **checkpoint_kwargs}``, E the epoch (counted from 1) the state was
        saved in. Given the :class:`~.resume.ResumePlan` of ``train(resume_from=...)``, it resumes the
        run (see :meth:`resume`) and returns a :class:`~.resume.Resumed`.

        ``input_dir`` may be a state directory or a folder of them (the newest good one is
        taken: a newer one that is damaged or holds non-finite weights is skipped with a
        warning), or a directory written by pytorch-accelerated 0.1.x (``trainer_metadata.pt``;
        see :mod:`pytorch_accelerated.checkpoints.original_states`). Every file is checked
        before anything is loaded, so a bad state changes nothing. A state saved sharded under
        FSDP loads only under the same FSDP configuration (on any number of processes); a plain
        state loads under FSDP too (see :mod:`pytorch_accelerated.checkpoints.sharded`). The
        callbacks' and RNGs' states are restored at once. All or nothing: a state named explicitly
        is never swapped for another.
        """
        if isinstance(input_dir, ResumePlan):
            return self.resume(objects, input_dir)
        loaded = self._load(objects, ResumePlan.of(input_dir), resuming=False)
        loaded.restore_after_start(objects.callbacks)  # at once: no run is starting
        return dict(loaded)

    def resume(self, objects: TrainingObjects, plan: ResumePlan) -> Resumed:
        """Resume the run from the first state of ``plan`` that passes every check: the run's settings
        are checked against the saved ones first (a state saved mid-epoch on other settings continues
        at the same sample of the epoch's order), the position and the run's working state restored,
        and one line printed (naming the run when ``plan`` was chosen by ``resume_from="auto"``); the
        callbacks' and RNGs' states are returned, to restore once the run's start events have fired
        (:meth:`.Resumed.restore_after_start`)."""
        resumed = self._load(objects, plan, resuming=True)
        # A finished run's state says "Nothing to train" instead (Trainer._check_something_left_to_train).
        finished = objects.run_config is not None and nothing_left_to_train(
            objects.progress, objects.run_config
        )
        if objects.accelerator.is_main_process and not finished:
            line = changed_settings.resume_line(
                objects, resumed.directory, plan.asked, resumed.state, plan.auto
            )
            print_once_per_node(objects.accelerator, line)
        return resumed

    def _load(self, objects: TrainingObjects, plan: ResumePlan, resuming: bool) -> Resumed:
        """Load the first state of ``plan`` that passes every check: the weights and the objects saved
        whole, the position, the run history and the run's working state; ``resuming``: the run's
        settings are checked against the saved ones first, and a position saved on other settings is
        mapped onto them."""
        self.wait()  # a state still being written in the background
        loaded = self._choose(objects, plan)
        state = loaded.trainer_state
        changed_settings.check_optimizer(objects, loaded.directory, state, loaded.objects.get("optimizer.pt"))
        mapped = loaded.layout.map_position(loaded, objects) if resuming else None
        loaded.layout.load(loaded, objects, resuming)
        resume.restore_position(objects, state, loaded.process_state)
        if resuming:
            resume.adopt_run_settings(objects, loaded.manifest, mapped)
        returned = {"current_epoch": loaded.saved_epoch, **state["checkpoint_kwargs"]}
        plain = objects.plain_model(keep_torch_compile=False)
        trainable_parameters = trainable.to_restore(plain, state, loaded.directory, resuming)
        return Resumed(returned, loaded.directory, state, loaded.process_state["rng"], trainable_parameters)

    def _choose(self, objects: TrainingObjects, plan: ResumePlan) -> LoadedState:
        """Read and check the first state of ``plan`` that passes every check, agreeing across processes.

        Raises:
            The plan's problem (no state to try); the error of an explicitly named state that fails
            the checks; a ValueError listing every candidate and its problem when none in a folder passes.
        """
        if plan.problem is not None:
            raise plan.problem
        problems: list[tuple[Path, Exception]] = []
        for directory in plan.states:
            loaded: LoadedState | None = None
            problem: Exception | None = None
            try:
                loaded = layout_of(directory).read(directory, objects)
            except Exception as error:  # any failure to read a state is a reason to try the next one
                problem = error
            failed = ranks_where(self._accelerator, loaded is None)
            if isinstance(problem, sharded.ShardedStateError):
                raise problem  # this run's configuration, not the state, is at fault: no fallback
            if loaded is not None and not failed:
                for bad, skipped in problems:
                    warnings.warn(
                        f"Skipped the training state {bad}: {skipped} Resuming from {directory} instead.",
                        stacklevel=5,
                    )
                return loaded
            problems.append(
                (
                    directory,
                    problem
                    or ValueError(
                        f"process {', '.join(map(str, failed))} could not read it (its output says why)."
                    ),
                )
            )
            if plan.explicit:
                raise problems[-1][1]
        raise ValueError(
            f"{plan.asked} holds no usable training state ({len(problems)} tried, newest first: "
            f"{'; '.join(f'{directory.name}: {error}' for directory, error in problems)})."
        )


@dataclass(frozen=True)
class _StateSave:
    """One training state being saved: its layout, the run's objects, where it goes, the position it
    records, the user's ``checkpoint_kwargs`` and the weights' files (the writing process's)."""

    layout: PlainLayout
    objects: TrainingObjects
    output_dir: Path
    position: dict[str, int]
    extra: dict[str, Any]
    weights: dict[str, Any]

    def files(self, writes_shared: bool) -> dict[str, Any]:
        return self.layout.files_to_write(
            self.objects, self.position, self.extra, self.weights if writes_shared else None
        )


def _nodes(nodes: list[int]) -> str:
    """``node 1`` or ``nodes 1, 2``."""
    return f"node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}"
