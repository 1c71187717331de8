"""The Trainer's checkpoint methods (:class:`CheckpointMethods`) and its training states
(everything, to resume).

The Trainer's ``save_training_state`` and ``load_training_state`` delegate here, its
``save_checkpoint`` and ``load_checkpoint`` to :mod:`.model_files`; this module reaches the Trainer through its public
attributes only (``accelerator``, ``model``, ``optimizer``, ``scheduler``, ``progress``,
``run_state``, ``run_history``, ``callback_handler``, ...). File formats live in :mod:`.files`
and :mod:`.state_dirs`, which know nothing of the Trainer.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from accelerate.utils import set_seed
from torch import nn

from .._internal.fsdp import uses_fsdp
from .._internal.hangs import signal_grace_s
from .._internal.process_group import collective_timeout_s
from ..data import batches_per_epoch, is_map_style
from . import (
    collective_saves,
    files,
    finite,
    model_files,
    original_states,
    reshard,
    sharded,
    state_checks,
    state_dirs,
)

if TYPE_CHECKING:
    from ..trainer import Trainer



# ---------------------------------------------------------------------------- training states


def save_training_state(
    trainer: Trainer, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None, asynchronous: bool = False
) -> None:
    """Save a training state (see :meth:`CheckpointMethods.save_training_state`); first wait
    for a state still being written in the background, raising its error if it failed."""
    wait_for_training_state(trainer)
    output_dir = Path(output_dir)
    accelerator = trainer.accelerator
    if uses_fsdp(accelerator):  # every process writes its shards (see .sharded)
        sharded.check_can_save(accelerator, output_dir, asynchronous, collective_saves.saves_on_each_node(accelerator))
    finite.check_finite_before_save(trainer, None, f"the training state {str(output_dir)!r}")
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    position = _position_to_save(trainer)
    model_state: dict[str, Any] | None = None  # a sharded model: every process writes its shards instead
    if not uses_fsdp(accelerator):  # the plain model's keys, also for a torch.compile'd model
        model_state = state_checks.without_compile_prefix(accelerator.get_state_dict(trainer.model))
    write = _start_background_save if asynchronous else _write_training_state
    try:
        write(trainer, output_dir, position, model_state, extra)
    except KeyboardInterrupt:
        state_dirs.remove_temporary(output_dir)
        raise


def _write_training_state(
    trainer: Trainer, output_dir: Path, position: dict[str, int], model_state: dict[str, Any] | None, extra: dict[str, Any]
) -> None:
    """Write the state into its hidden directory, then publish it. The processes agree after
    each step, so a step that fails on one process raises on all, with nothing left behind."""
    main = collective_saves.writes_shared_files(trainer.accelerator)
    what = "the training state"
    temporary = state_dirs.temporary_dir_for(output_dir)
    collective_saves.agree_on_save(trainer, collective_saves.attempt(state_dirs.make_temporary_dir, output_dir) if main else None, what, output_dir)
    contents: dict[str, Any] = {}
    error = collective_saves.attempt(lambda: contents.update(_state_files(trainer, position, model_state, extra)))
    error = error or collective_saves.attempt(state_dirs.write_files, temporary, contents)
    error = _explain_unshared_directory(trainer.accelerator, error, temporary)
    collective_saves.agree_on_save(trainer, error, what, output_dir)
    if model_state is None:
        _write_shards(trainer, temporary, output_dir)
    if main:
        error = collective_saves.attempt(_publish, trainer, temporary, output_dir, position, contents)
    collective_saves.agree_on_save(trainer, error, what, output_dir)


def _write_shards(trainer: Trainer, temporary: Path, output_dir: Path) -> None:
    """Every process writes its shards of the model, then of the optimizer (accelerate's FSDP
    savers; collective), agreeing after each, so that a failure on one raises on all."""
    accelerator, what = trainer.accelerator, "the training state"
    model_files.registered_shards(trainer.model)  # after an evaluation, FSDP2 holds whole parameters
    error = collective_saves.attempt(sharded.save_model, accelerator, trainer.model, temporary)
    collective_saves.agree_on_save(trainer, error, what, output_dir)
    if trainer.optimizer is not None:
        error = collective_saves.attempt(sharded.save_optimizer, accelerator, trainer.optimizer, trainer.model, temporary)
        collective_saves.agree_on_save(trainer, error, what, output_dir)


def _publish(trainer: Trainer, temporary: Path, output_dir: Path, position: dict[str, int], contents: dict[str, Any]) -> None:
    """Write the manifest, listing every file of the state, then publish it (the main process)."""
    if uses_fsdp(trainer.accelerator):  # every process's shards, DCP's .metadata too
        sharded.sync_files(temporary)
        names = sharded.list_files(temporary)
    elif collective_saves.saves_on_each_node(trainer.accelerator):  # a node's own processes' files only
        names = _files_in(temporary)
    else:
        names = _file_names(trainer, contents)
    state_dirs.write_manifest(temporary, _manifest(trainer, position, names))
    state_dirs.publish(temporary, output_dir)


def _state_files(trainer: Trainer, position: dict[str, int], model_state: dict[str, Any] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """What this process writes into a training state, by file name: each process its RNGs and
    its share of the epoch's loss so far; the main process also the model, the stateful
    objects and the trainer's state (position, history, callback states). A sharded model
    (``model_state`` None) and its optimizer are written in shards instead (:mod:`.sharded`)."""
    accelerator = trainer.accelerator
    own = {"rng": state_dirs.capture_rng_states(), **trainer.run_state.process_state_dict(position["batch_index"] > 0)}
    contents: dict[str, Any] = {f"rng_state_{accelerator.process_index}.pt": own}
    if collective_saves.writes_shared_files(accelerator):
        skipped = sharded.PLAIN_FILES if model_state is None else ()
        if model_state is not None:
            contents["model.pt"] = model_state
        contents.update((name, obj.state_dict()) for name, obj in _stateful_objects(trainer) if obj is not None and name not in skipped)
        contents["trainer_state.pt"] = _trainer_state(trainer, position, extra)
    return contents


def _file_names(trainer: Trainer, contents: dict[str, Any]) -> list[str]:
    """The files of the whole state: the main process's, and every process's RNG file."""
    rank_files = {f"rng_state_{rank}.pt" for rank in range(trainer.accelerator.num_processes)}
    return sorted(set(contents) | rank_files)



def _files_in(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.is_file() and not path.name.startswith("."))


def _explain_unshared_directory(accelerator: Any, error: Exception | None, temporary: Path) -> Exception | None:
    """``error``, or, when this process cannot see the directory the main process created (the
    nodes share no file system), an error that says so and how to save on each node."""
    if error is None or temporary.is_dir() or collective_saves.saves_on_each_node(accelerator):
        return error
    return files.CheckpointWriteError(
        getattr(error, "errno", None),
        f"process {accelerator.process_index} cannot see the directory {temporary} that the main process "
        f"created: this node does not share the main process's file system. Save on each node: set "
        f"accelerator.project_configuration.save_on_each_node = True in the Trainer's _create_accelerator "
        f"(see 'Several machines' in docs/launching.md)",
        temporary,
    )

def _unseen_directory_error(accelerator: Any, temporary: Path) -> Exception | None:
    """The error of a process that cannot see the hidden directory the main process created
    (nodes that share no file system), before a background save, whose publisher would
    otherwise wait for this process's files there until the collective timeout."""
    if temporary.is_dir():
        return None
    missing = FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(temporary))
    return _explain_unshared_directory(accelerator, missing, temporary)


# ---------------------------------------------------------------------------- asynchronous saves

_PENDING: weakref.WeakKeyDictionary[Any, tuple[state_dirs.BackgroundStateWrite, int]] = weakref.WeakKeyDictionary()
_HOST_BUFFERS: weakref.WeakKeyDictionary[Any, dict[tuple[int, str, int], Any]] = weakref.WeakKeyDictionary()


def _start_background_save(
    trainer: Trainer, output_dir: Path, position: dict[str, int], model_state: dict[str, Any] | None, extra: dict[str, Any]
) -> None:
    """Copy the state to host memory (the loop may change the originals from now on) and write
    it in a background thread; :func:`wait_for_training_state` waits for it."""
    accelerator = trainer.accelerator
    if collective_saves.saves_on_each_node(accelerator) and accelerator.num_processes > 1:
        raise ValueError(
            f"Cannot save {output_dir} asynchronously with accelerate's save_on_each_node: the process that "
            f"publishes a state in the background waits for the others' files in its folder, which needs a "
            f"shared file system. Save it synchronously (asynchronous=False), or turn save_on_each_node off "
            f"on a shared file system."
        )
    main = accelerator.is_main_process
    what = "the training state"
    collective_saves.agree_on_save(trainer, collective_saves.attempt(state_dirs.make_temporary_dir, output_dir) if main else None, what, output_dir)
    contents: dict[str, Any] = {}
    buffers = _HOST_BUFFERS.setdefault(trainer, {})  # the previous copy's memory, free again (it was waited for)
    error = collective_saves.attempt(lambda: contents.update(state_dirs.to_host(_state_files(trainer, position, model_state, extra), buffers)))
    error = error or _unseen_directory_error(accelerator, state_dirs.temporary_dir_for(output_dir))
    collective_saves.agree_on_save(trainer, error, what, output_dir)
    manifest = _manifest(trainer, position, _file_names(trainer, contents)) if main else None
    job = state_dirs.BackgroundStateWrite(
        output_dir, contents, accelerator.process_index, accelerator.num_processes, manifest, collective_timeout_s()
    )
    _PENDING[trainer] = (job, position["global_step"])


def wait_for_training_state(trainer: Trainer) -> None:
    """Wait for the training state being written in the background, if any (every process
    must call this when one is); once it has failed on any process, raise on every process a
    ``CheckpointWriteError`` naming the state and what went wrong, its hidden directory removed."""
    pending = _PENDING.pop(trainer, None)
    if pending is None:
        return
    job, step = pending
    error = job.wait()
    try:
        collective_saves.agree_on_save(trainer, cast(Exception | None, error), "the training state", job.output_dir)
    except files.CheckpointWriteError as failure:
        raise files.CheckpointWriteError(
            failure.errno, f"{failure.message} (It was being written in the background, after update step {step}; "
            f"its error is raised at the next save, load or end of the run.)", job.output_dir
        ) from failure


@contextlib.contextmanager
def finishing_background_saves(trainer: Trainer) -> Iterator[None]:
    """Around a run: at its end, wait for a state still being written in the background. When
    the run fails, wait without agreeing with the other processes (one may be gone), at most
    the signal grace for their files; a failure of the save is then printed, not raised."""
    try:
        yield
    except BaseException:
        pending = _PENDING.pop(trainer, None)
        if pending is not None:
            error = pending[0].wait(grace_s=signal_grace_s())
            if error is not None:
                trainer.print(f"The training state {pending[0].output_dir}, written in the background, could not be saved: {error}")
        raise
    wait_for_training_state(trainer)


def _stateful_objects(trainer: Trainer) -> tuple[tuple[str, Any], ...]:
    return (
        ("optimizer.pt", trainer.optimizer),
        ("scheduler.pt", trainer.scheduler),
        ("scaler.pt", trainer.accelerator.scaler),
    )


def _manifest(trainer: Trainer, position: dict[str, int], file_names: list[str]) -> dict[str, Any]:
    config = trainer.run_config
    loader = trainer.train_dataloader
    record = sharded.sharding_record(trainer.accelerator)
    return {
        **position,
        "files": file_names,
        "finite": True,  # every save checks the weights first (see finite.check_finite_before_save)
        "num_processes": trainer.accelerator.num_processes,
        "per_device_batch_size": config.train_per_device_batch_size if config else None,
        "gradient_accumulation_steps": config.gradient_accumulation_steps if config else None,
        "num_batches_per_epoch": batches_per_epoch(loader) if loader is not None else None,
        **({"sharded": record} if record is not None else {}),  # how a sharded state was sharded
    }


def _position_to_save(trainer: Trainer) -> dict[str, int]:
    position = trainer.progress.state_dict()
    config = trainer.run_config
    if trainer.run_state.epoch_finished:
        # The epoch's last event has fired: a resumed run starts the next epoch.
        position.update(epoch=position["epoch"] + 1, batch_index=0, epoch_step=0)
    elif config is not None and position["batch_index"] % config.gradient_accumulation_steps:
        # The partial last window of an epoch ends with an update; a stream's end is not known here.
        if position["batch_index"] != batches_per_epoch(trainer.train_dataloader, position["batch_index"]):
            raise RuntimeError(
                f"save_training_state was called in the middle of a gradient accumulation window "
                f"(batch {position['batch_index']} with gradient_accumulation_steps="
                f"{config.gradient_accumulation_steps}); the accumulated gradients would be lost. "
                f"Save right after an optimizer update, e.g. from on_train_step_end when "
                f"is_update_step is True."
            )
    return position


def _trainer_state(trainer: Trainer, position: dict[str, int], extra: dict[str, Any]) -> dict[str, Any]:
    run_state = trainer.run_state.state_dict()
    history = trainer.run_history.state_dict()
    # The history's epoch follows the saved position (older versions read it from here).
    history["current_epoch"] = run_state["history_first_epoch"] + position["epoch"]
    callbacks = {
        key: files.to_safe_value(state, f"{key}.state_dict()")
        for key, state in trainer.callback_handler.state_dict().items()
    }
    return {
        "progress": position,
        "run_history": files.to_safe_value(history, "run_history"),
        "callbacks": callbacks,
        **run_state,
        "checkpoint_kwargs": extra,
    }


_RESUMING: weakref.WeakSet[Any] = weakref.WeakSet()


def resume_training(trainer: Trainer, resume_from: str | os.PathLike) -> None:
    """What ``train(resume_from=...)`` does: call ``trainer.load_training_state`` (so an
    override runs), which restores the state *as a resume* (settings checked, the exact
    position kept, callback and RNG states held back) because the trainer is marked here."""
    _RESUMING.add(trainer)
    try:
        trainer.load_training_state(resume_from)
    finally:
        _RESUMING.discard(trainer)


def load_training_state(trainer: Trainer, input_dir: str | os.PathLike, resuming: bool = False) -> dict[str, Any]:
    """Restore every object of ``input_dir`` into ``trainer``; return ``{"current_epoch": E,
    **checkpoint_kwargs}``, E the epoch (counted from 1) the state was saved in.

    With ``resuming`` (``train(resume_from=...)``), the run's settings are checked against the
    saved ones first (a state saved mid-epoch on other settings continues at the same sample of
    the epoch's order, see :mod:`.reshard`), and callback and RNG states wait in
    ``trainer.run_state.pending_resume`` until the run's start events have fired (see
    :func:`apply_pending_resume`).

    All or nothing: every file is read and checked (:mod:`.state_checks`) before anything is
    changed. From a folder, a state that fails the checks (or holds non-finite weights) is
    skipped with a warning for the newest good one; a state directory named explicitly is
    never swapped for another.
    """
    loaded = choose_state(trainer, input_dir)
    if isinstance(loaded, original_states.OriginalState):
        return _load_original_state(trainer, loaded, resuming)
    mapped = _check_run_settings(trainer, loaded) if resuming else None
    _load_model_and_optimizer(trainer, loaded)
    _load_stateful_objects(trainer, loaded, resuming)
    state = loaded.trainer_state
    _restore_position(trainer, state)
    if resuming:
        _adopt_run_settings(trainer, loaded.manifest, mapped)
    trainer.run_state.load_process_state_dict(loaded.process_state, trainer.device)
    trainer.run_state.pending_resume = {"callbacks": state["callbacks"], "rng": loaded.process_state["rng"]}
    if not resuming:
        apply_pending_resume(trainer)
    return {"current_epoch": _saved_epoch(state), **state["checkpoint_kwargs"]}


def _saved_epoch(state: dict[str, Any]) -> int:
    """The epoch (counted from 1, as ``run_history.current_epoch``) a state was saved in."""
    progress = state["progress"]
    first = int(state.get("history_first_epoch", state["run_history"]["current_epoch"] - progress["epoch"]))
    # A position at an epoch's first batch was saved at the end of the epoch before.
    in_epoch = progress["batch_index"] > 0 or bool(state.get("epoch_trained", False))
    return max(first, first + progress["epoch"] - (0 if in_epoch else 1))


def choose_state(trainer: Trainer, input_dir: str | os.PathLike) -> state_checks.LoadedState | original_states.OriginalState:
    """Read and check the state at ``input_dir``, or the newest good one in the folder
    ``input_dir``, agreeing across processes (every process must call this).

    Raises:
        The error of an explicitly named state that fails the checks; a ValueError listing
        every candidate and its problem when none in a folder passes.
    """
    if original_states.is_original_state(Path(input_dir)):
        return _read_original_state(trainer, Path(input_dir))
    candidates, explicit = state_dirs.candidate_states(input_dir)
    model, targets, rank = trainer.get_model(), dict(_stateful_objects(trainer)), trainer.accelerator.process_index
    problems: list[tuple[Path, Exception]] = []
    for directory in candidates:
        loaded: state_checks.LoadedState | None = None
        try:
            loaded = state_checks.read_training_state(directory, model, targets, rank, trainer.accelerator.num_processes)
            _check_sharding(trainer, loaded)
        except Exception as error:  # any failure to read a state is a reason to try the next one
            problems.append((directory, error))
            loaded = None
        failed = collective_saves.failed_ranks(trainer, loaded is None)
        if loaded is None and isinstance(problems[-1][1], sharded.ShardedStateError):
            raise problems[-1][1]  # this run's configuration, not the state, is at fault: no fallback
        if loaded is not None and not failed:
            for bad, problem in problems:
                warnings.warn(f"Skipped the training state {bad}: {problem} Resuming from {directory} instead.", stacklevel=4)
            return loaded
        if loaded is not None:
            problems.append((directory, ValueError(f"process {', '.join(map(str, failed))} could not read it (its output says why).")))
        if explicit:
            raise problems[-1][1]
    found = "; ".join(f"{directory.name}: {error}" for directory, error in problems)
    raise ValueError(f"{input_dir} holds no usable training state ({len(problems)} tried, newest first: {found}).")


def _check_sharding(trainer: Trainer, loaded: state_checks.LoadedState) -> None:
    """Check, before anything is loaded, that this run can load the state's model and optimizer:
    a state saved sharded (under FSDP) needs the same FSDP configuration, and its files are
    checked (see :mod:`.sharded`); a plain state loads anywhere."""
    accelerator = trainer.accelerator
    saved = loaded.manifest.get("sharded")
    sharded.check_engine(loaded.directory, saved, sharded.sharding_record(accelerator))
    if saved is not None:
        sharded.check_sharded_state(loaded.directory, loaded.manifest, trainer.get_model(), trainer.optimizer, accelerator.process_index)


def _load_model_and_optimizer(trainer: Trainer, loaded: state_checks.LoadedState) -> None:
    """Load the weights; a sharded state's optimizer too (by every process, its own shards), and
    a plain state's optimizer into a sharded run (each process keeping its shards of it)."""
    if loaded.manifest.get("sharded") is not None:
        model_files.registered_shards(trainer.model)  # after an evaluation, FSDP2 holds whole parameters
        sharded.load(trainer.accelerator, trainer.model, trainer.optimizer, loaded.directory, loaded.manifest)
        return
    model_files.load_full_model_state(trainer.get_model(), loaded.model)  # sharded or not
    optimizer_state = loaded.objects.get("optimizer.pt")
    if uses_fsdp(trainer.accelerator) and optimizer_state is not None and trainer.optimizer is not None:
        model_files.load_optimizer_state(trainer, optimizer_state)  # each process keeps its shards of it
        del loaded.objects["optimizer.pt"]


def _load_stateful_objects(trainer: Trainer, loaded: state_checks.LoadedState, resuming: bool) -> None:
    for name, obj in _stateful_objects(trainer):
        if name in loaded.objects:
            obj.load_state_dict(loaded.objects[name])
        elif name == "scheduler.pt" and obj is not None and resuming:
            warnings.warn(f"{loaded.directory} holds no scheduler state; the new scheduler starts from its first step.", stacklevel=4)


def _restore_position(trainer: Trainer, state: dict[str, Any]) -> None:
    trainer.progress.load_state_dict(state["progress"])
    run_state = dict(state)
    # States saved before the first epoch was recorded: the history's epoch tells it.
    run_state.setdefault("history_first_epoch", state["run_history"]["current_epoch"] - state["progress"]["epoch"])
    trainer.run_state.load_state_dict(run_state)
    trainer.run_history.load_state_dict(state["run_history"])
    trainer.run_history.set_current_epoch(trainer.run_state.history_first_epoch + trainer.progress.epoch)


def _read_original_state(trainer: Trainer, directory: Path) -> original_states.OriginalState:
    """Read and check a state written by the original library, agreeing across processes."""
    model, targets = trainer.get_model(), dict(_stateful_objects(trainer))
    error: Exception | None = None
    try:
        loaded = original_states.read_original_state(directory, trainer.accelerator.process_index)
        loaded.model = state_checks.match_model_keys(model, loaded.model)
        state_checks.check_model_state(model, loaded.model, str(directory))
        loaded.objects = {name: state for name, state in loaded.objects.items() if targets.get(name) is not None}
        for name, state in loaded.objects.items():
            state_checks.check_object_state(targets[name], state, f"{directory} ({name})")
    except Exception as caught:  # raised below, once every process knows
        error = caught
    failed = collective_saves.failed_ranks(trainer, error is not None)
    if error is not None:
        raise error
    if failed:
        raise ValueError(f"Could not load {directory}: process {', '.join(map(str, failed))} could not read it (its output says why).")
    return loaded


def _load_original_state(trainer: Trainer, loaded: original_states.OriginalState, resuming: bool) -> dict[str, Any]:
    """Load a state of the original library; the run continues at the start of its epoch E."""
    trainer.get_model().load_state_dict(loaded.model)
    for name, obj in _stateful_objects(trainer):
        if name in loaded.objects:
            obj.load_state_dict(loaded.objects[name])
    config = trainer.run_config
    steps = config.num_update_steps_per_epoch if config is not None else None
    updates = (loaded.current_epoch - 1) * (steps or 0)
    trainer.progress.load_state_dict({"epoch": loaded.current_epoch - 1, "global_step": updates, "batch_index": 0, "epoch_step": 0})
    trainer.run_history.set_current_epoch(trainer.run_state.history_first_epoch + trainer.progress.epoch)
    trainer.run_state.load_process_state_dict({"train_loss": None}, trainer.device)
    counter = _set_scheduler_counter(trainer.scheduler, updates) if steps is not None else ""
    warnings.warn(
        f"{loaded.directory} was written by pytorch-accelerated 0.1.x, which records only the epoch it was "
        f"saved in (current_epoch={loaded.current_epoch}): the run continues at the start of epoch "
        f"{loaded.current_epoch}" + (f", after {updates} updates{counter}" if steps is not None else "")
        + ". Callback states are not restored" + ("" if loaded.rng is not None else ", nor the RNGs") + ".",
        stacklevel=4,
    )
    trainer.run_state.pending_resume = {"callbacks": None, "rng": loaded.rng}
    if not resuming:
        apply_pending_resume(trainer)
    return {"current_epoch": loaded.current_epoch, **loaded.checkpoint_kwargs}


def _set_scheduler_counter(scheduler: Any, updates: int) -> str:
    """Put a scheduler of this library at ``updates`` completed updates; say what was done."""
    if scheduler is None:
        return ""
    state = scheduler.state_dict()
    if "_num_updates" not in state:
        return f"; the scheduler ({type(scheduler).__name__}) keeps the state it was saved with"
    scheduler.load_state_dict({**state, "_num_updates": updates, "num_updates": updates})
    return f"; the scheduler's counter is set to {updates}"


def apply_pending_resume(trainer: Trainer) -> None:
    """Restore the callback states, then the RNGs, that :func:`load_training_state` keeps back.

    On resume this runs after ``on_training_run_start`` (callbacks set themselves up there;
    their saved state goes in after) and last of all, once nothing else can draw from the RNGs.
    """
    pending = trainer.run_state.pending_resume
    if pending is None:
        return
    trainer.run_state.pending_resume = None
    if pending["callbacks"] is not None:  # None: a state of the original library, which has none
        trainer.callback_handler.load_state_dict(pending["callbacks"])
    if pending["rng"] is not None:
        state_dirs.restore_rng_states(pending["rng"])
        if reshard.RESEED_KEY in pending["rng"]:  # a rank that saved no RNG states: its own stream
            seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
            set_seed(seed + int(pending["rng"][reshard.RESEED_KEY]))


def _check_run_settings(trainer: Trainer, loaded: state_checks.LoadedState) -> reshard.MappedPosition | None:
    """Check the run's settings against the saved ones, before anything is loaded; return where
    a state saved mid-epoch on other settings continues (None: at its saved position).

    Raises:
        ValueError: naming the setting and the fix, where the saved position does not map.
    """
    config = trainer.run_config
    assert config is not None
    manifest, directory = loaded.manifest, loaded.directory
    saved = reshard.BatchSettings.from_manifest(manifest)
    now = reshard.BatchSettings(config.num_processes, config.train_per_device_batch_size, config.gradient_accumulation_steps)
    mid_epoch = manifest["batch_index"] > 0
    # An epoch resumed on other settings starts its order after some samples: it maps too.
    skipped = int(loaded.trainer_state.get("samples_skipped") or 0) if mid_epoch else 0
    if saved == now and not skipped:
        _check_same_batches(trainer, manifest, directory)
        return None
    change = (
        f"saved with {saved.describe()}, resumed with {now.num_processes} x {now.per_device_batch_size} x "
        f"{now.gradient_accumulation_steps}"
    )
    if not mid_epoch:
        warnings.warn(
            f"Resuming {directory}: it was {change}. It was saved at an epoch boundary, so the run continues "
            f"with the next epoch; step counts and schedules now follow the new settings.",
            stacklevel=3,
        )
        return None
    mapped = _map_saved_position(trainer, loaded, saved, now, change)
    warnings.warn(
        f"Resuming {directory} mid-epoch: it was {change}. {mapped.consumed} samples of epoch "
        f"{manifest['epoch'] + 1}'s order were seen; the rest of the epoch visits each of the others once, in "
        f"batches of the new settings (docs: 'Resuming on another number of processes'). Step counters and "
        f"the scheduler carry on; results are close to, not bitwise equal to, an uninterrupted run's.",
        stacklevel=3,
    )
    return mapped


def _check_same_batches(trainer: Trainer, manifest: dict[str, Any], directory: Path) -> None:
    num_batches = batches_per_epoch(trainer.train_dataloader)
    if manifest["batch_index"] > 0 and manifest["num_batches_per_epoch"] != num_batches:
        raise ValueError(
            f"{directory} was saved mid-epoch with {manifest['num_batches_per_epoch']} batches per epoch, "
            f"but this run has {num_batches}: the training set differs, so the saved "
            f"position means nothing here. Resume with the same data set."
        )


def _map_saved_position(
    trainer: Trainer, loaded: state_checks.LoadedState, saved: reshard.BatchSettings, now: reshard.BatchSettings, change: str
) -> reshard.MappedPosition:
    """The position on this run's settings of a state saved mid-epoch on ``saved`` (same
    samples of the epoch's global order seen), or a ValueError saying why there is none.

    Without the Trainer's shuffle sampler, only a change that keeps the samples per batch index
    (processes x per-device batch) and the accumulation maps: to the same batch."""
    config, sampler, accelerator = trainer.run_config, trainer.run_state.train_sampler, trainer.accelerator
    assert config is not None
    reason = None
    if sampler is None:
        reason = reshard.unmappable_loader_reason(config.train_dl_kwargs, trainer.train_dataset, is_map_style(trainer.train_dataset))
    elif accelerator.split_batches or accelerator.dispatch_batches:
        reason = "accelerate's split_batches or dispatch_batches is set, so processes do not take whole batches in turn"
    manifest, state = loaded.manifest, loaded.trainer_state
    if reason is not None or sampler is None:
        same_batches = (saved.global_batch, saved.gradient_accumulation_steps) == (now.global_batch, now.gradient_accumulation_steps)
        if same_batches and not state.get("samples_skipped"):
            return reshard.MappedPosition(manifest["batch_index"] * saved.global_batch, manifest["batch_index"], 0)
        raise ValueError(reshard.unmappable_message(loaded.directory, change, str(reason), saved))
    num_samples = sampler.num_samples
    reshard.check_same_training_set(state, manifest, num_samples, saved, loaded.directory)
    # The epoch's training was done (saved at its last batch, or during its evaluation).
    done = manifest["batch_index"] >= (manifest.get("num_batches_per_epoch") or math.inf) or bool(state.get("epoch_trained"))
    skipped = int(state.get("samples_skipped") or 0)
    consumed = num_samples if done else reshard.samples_consumed(manifest["batch_index"], skipped, saved, num_samples)
    return reshard.map_position(consumed, now, num_samples, batches_per_epoch(trainer.train_dataloader))


def _adopt_run_settings(trainer: Trainer, manifest: dict[str, Any], mapped: reshard.MappedPosition | None) -> None:
    """After a resume's position is restored: continue at ``mapped`` (see :mod:`.reshard`),
    and let the loss weighting find its unit again when the per-device batch size changed."""
    window, sampler, config = trainer.run_state.window, trainer.run_state.train_sampler, trainer.run_config
    if window is not None and config is not None and manifest.get("per_device_batch_size") != config.train_per_device_batch_size:
        window.unit = None
    if mapped is not None:
        trainer.progress.batch_index = mapped.batch_index
        if sampler is not None:
            sampler.skip_in_epoch(trainer.progress.epoch, mapped.skip)


class CheckpointMethods:
    """The Trainer's checkpoint methods (a base class of the Trainer); the work is done by the
    functions of this module."""

    def _trainer(self) -> Trainer:
        return cast("Trainer", self)

    def save_checkpoint(
        self,
        save_path: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        save_per_node: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> None:
        """Save model (and optimizer, scheduler) state with ``checkpoint_kwargs`` to one file.

        The file is written by each node's main process when ``save_per_node`` (for nodes that
        do not share a file system), else by the main process only; it is written to a
        temporary name first, so an interrupted save never leaves a truncated file. Numpy
        values and paths in ``checkpoint_kwargs`` are stored as safe equivalents (numbers,
        tensors, strings). ``model`` saves the weights of another model (e.g. an EMA copy) in
        the same layout. Every process must call this.

        Raises:
            CheckpointWriteError: (an ``OSError``, from :mod:`pytorch_accelerated.checkpoints.files`)
                on every process when the file could not be written, naming it and the OS
                error; an earlier file at ``save_path`` is kept and no temporary file is left.
        """
        model_files.save_checkpoint(self._trainer(), save_path, checkpoint_kwargs, save_optimizer, save_scheduler, save_per_node, model)

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike,
        load_optimizer: bool = True,
        load_scheduler: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> dict[str, Any]:
        """Load a file written by :meth:`save_checkpoint` (never running code from it) and
        return its whole dictionary: ``model_state_dict``, ``optimizer_state_dict`` and
        ``scheduler_state_dict`` when saved, and the ``checkpoint_kwargs``. ``model`` loads the
        weights into another model.

        A state the file lacks, or that the trainer has no object for (an evaluation-only
        Trainer has no optimizer, a fresh one no scheduler), is skipped. Weights saved from a
        ``torch.compile``'d model load into the plain one and the reverse. Everything is checked
        (the file, the model's keys and shapes, the optimizer's parameter groups) before
        anything is loaded, so a file that does not fit changes nothing.
        """
        return model_files.load_checkpoint(self._trainer(), checkpoint_path, load_optimizer, load_scheduler, model)

    def save_training_state(
        self, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None = None, *, asynchronous: bool = False
    ) -> None:
        """Save everything that decides the rest of the run into the directory ``output_dir``.

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

        >>> import tempfile, torch
        >>> from pytorch_accelerated import Trainer
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
        >>> def new_trainer():
        ...     model = nn.Linear(3, 1)
        ...     return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        >>> trainer = new_trainer()
        >>> trainer.train(data, num_epochs=1, per_device_batch_size=4)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     trainer.save_training_state(f"{folder}/after-epoch-1", checkpoint_kwargs={"note": "hi"})
        ...     resumed = new_trainer()
        ...     resumed.train(data, num_epochs=3, per_device_batch_size=4, resume_from=folder)
        >>> resumed.progress.global_step  # 4 updates restored, then 2 more epochs of 4
        12
        """
        save_training_state(self._trainer(), output_dir, checkpoint_kwargs, asynchronous)

    def wait_for_training_state(self) -> None:
        """Wait until a state saved with ``asynchronous=True`` is written and published (at
        once when none is being written). Every process must call this.

        Raises:
            CheckpointWriteError: on every process, when the background write failed on any,
                naming the state and the error; the previous states are intact.
        """
        wait_for_training_state(self._trainer())

    def load_training_state(self, input_dir: str | os.PathLike) -> dict[str, Any]:
        """Restore a state saved by :meth:`save_training_state`; return ``{"current_epoch": E,
        **checkpoint_kwargs}``, E the epoch (counted from 1) the state was saved in.

        ``input_dir`` may be a state directory or a folder of them (the newest good one is
        taken: a newer one that is damaged or holds non-finite weights is skipped with a
        warning), or a directory written by pytorch-accelerated 0.1.x (``trainer_metadata.pt``;
        see :mod:`pytorch_accelerated.checkpoints.original_states`). Every file is checked
        before anything is loaded, so a bad state changes nothing. A state saved sharded under
        FSDP loads only under the same FSDP configuration (on any number of processes); a plain
        state loads under FSDP too (see :mod:`pytorch_accelerated.checkpoints.sharded`). To continue training from
        it, use ``train(..., resume_from=input_dir)``: it calls this method, so an override
        runs there too (inside ``train`` the state is restored as a resume, at its exact
        position; see :func:`resume_training`).
        """
        wait_for_training_state(self._trainer())  # a state still being written in the background
        return load_training_state(self._trainer(), input_dir, resuming=self in _RESUMING)
