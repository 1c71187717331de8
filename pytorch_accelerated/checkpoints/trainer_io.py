"""The Trainer's checkpoints: single files (weights) and training states (everything, to resume).

The Trainer's ``save_checkpoint``, ``load_checkpoint``, ``save_training_state`` and
``load_training_state`` delegate here, and this module reaches the Trainer through its public
attributes only (``accelerator``, ``model``, ``optimizer``, ``scheduler``, ``progress``,
``run_state``, ``run_history``, ``callback_handler``, ...). File formats live in :mod:`.files`
and :mod:`.state_dirs`, which know nothing of the Trainer.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..data import batches_per_epoch
from . import files, finite, original_states, state_checks, state_dirs

if TYPE_CHECKING:
    from ..trainer import Trainer

_RESERVED = {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}


# ---------------------------------------------------------------------------- single files


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
    error = _attempt(files.atomic_torch_save, checkpoint, save_path) if writer else None
    _agree_on_save(trainer, error, "the checkpoint", Path(save_path))


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


def _attempt(action: Callable[..., Any], *args: Any) -> Exception | None:
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


def _agree_on_save(trainer: Trainer, error: Exception | None, what: str, target: Path) -> None:
    """Raise on every process if a step of saving ``what`` to ``target`` failed on any.

    The process that failed raises its own error, as a :class:`files.CheckpointWriteError`
    naming ``target`` and the OS error when there was one; the others say which process failed.
    """
    failed = failed_ranks(trainer, error is not None)
    if not failed:
        return
    if what == "the training state":
        state_dirs.remove_temporary(target)
    intact = "the previous states are intact" if what == "the training state" else "an earlier file there is unchanged"
    if error is None:
        raise files.CheckpointWriteError(
            None, f"Could not save {what} to {target}: process {', '.join(map(str, failed))} failed to "
            f"write it (its output says why). Nothing was written; {intact}.", target
        )
    if isinstance(error, files.CheckpointWriteError) and not error.message.startswith("Could not save"):
        raise files.CheckpointWriteError(
            error.errno, f"Could not save {what} to {target}: {error.message}. Nothing was written; "
            f"{intact}. {files.write_hint(error, target)}", target
        ) from error
    raise error


# ---------------------------------------------------------------------------- training states


def save_training_state(trainer: Trainer, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None) -> None:
    finite.check_finite_before_save(trainer, None, f"the training state {str(output_dir)!r}")
    output_dir = Path(output_dir)
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    position = _position_to_save(trainer)
    # Collective for sharded models; the plain model's keys, also for a torch.compile'd model.
    model_state = state_checks.without_compile_prefix(trainer.accelerator.get_state_dict(trainer.model))
    try:
        _write_training_state(trainer, output_dir, position, model_state, extra)
    except KeyboardInterrupt:
        state_dirs.remove_temporary(output_dir)
        raise


def _write_training_state(
    trainer: Trainer, output_dir: Path, position: dict[str, int], model_state: dict[str, Any], extra: dict[str, Any]
) -> None:
    """Write the state into its hidden directory, then publish it. The processes agree after
    each step, so a step that fails on one process raises on all, with nothing left behind."""
    accelerator = trainer.accelerator
    main = accelerator.is_main_process
    what = "the training state"
    temporary = state_dirs.temporary_dir_for(output_dir)
    _agree_on_save(trainer, _attempt(state_dirs.make_temporary_dir, output_dir) if main else None, what, output_dir)
    # Each process writes what is its own: its RNGs and its share of the epoch's loss so far.
    own = {"rng": state_dirs.capture_rng_states(), **trainer.run_state.process_state_dict(position["batch_index"] > 0)}
    error = _attempt(state_dirs.write_file, own, temporary / f"rng_state_{accelerator.process_index}.pt")
    written: list[str] = []
    if main and error is None:
        trainer_state = _trainer_state(trainer, position, extra)
        error = _attempt(lambda: written.extend(_write_shared_files(trainer, temporary, model_state, trainer_state)))
    _agree_on_save(trainer, error, what, output_dir)
    if main:
        rank_files = [f"rng_state_{rank}.pt" for rank in range(accelerator.num_processes)]
        manifest = _manifest(trainer, position, sorted(written + rank_files))
        error = _attempt(state_dirs.write_manifest, temporary, manifest) or _attempt(state_dirs.publish, temporary, output_dir)
    _agree_on_save(trainer, error, what, output_dir)


def _write_shared_files(trainer: Trainer, directory: Path, model_state: dict[str, Any], trainer_state: dict[str, Any]) -> list[str]:
    written = ["model.pt", "trainer_state.pt"]
    state_dirs.write_file(model_state, directory / "model.pt")
    for name, obj in _stateful_objects(trainer):
        if obj is not None:
            state_dirs.write_file(obj.state_dict(), directory / name)
            written.append(name)
    state_dirs.write_file(trainer_state, directory / "trainer_state.pt")
    return written


def _stateful_objects(trainer: Trainer) -> tuple[tuple[str, Any], ...]:
    return (
        ("optimizer.pt", trainer.optimizer),
        ("scheduler.pt", trainer.scheduler),
        ("scaler.pt", trainer.accelerator.scaler),
    )


def _manifest(trainer: Trainer, position: dict[str, int], file_names: list[str]) -> dict[str, Any]:
    config = trainer.run_config
    loader = trainer.train_dataloader
    return {
        **position,
        "files": file_names,
        "finite": True,  # every save checks the weights first (see finite.check_finite_before_save)
        "num_processes": trainer.accelerator.num_processes,
        "per_device_batch_size": config.train_per_device_batch_size if config else None,
        "gradient_accumulation_steps": config.gradient_accumulation_steps if config else None,
        "num_batches_per_epoch": batches_per_epoch(loader) if loader is not None else None,
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
    saved ones first, and callback and RNG states wait in ``trainer.run_state.pending_resume``
    until the run's start events have fired (see :func:`apply_pending_resume`).

    All or nothing: every file is read and checked (:mod:`.state_checks`) before anything is
    changed. From a folder, a state that fails the checks (or holds non-finite weights) is
    skipped with a warning for the newest good one; a state directory named explicitly is
    never swapped for another.
    """
    loaded = choose_state(trainer, input_dir)
    if isinstance(loaded, original_states.OriginalState):
        return _load_original_state(trainer, loaded, resuming)
    if resuming:
        _check_run_settings(trainer, loaded.manifest, loaded.directory)
    trainer.get_model().load_state_dict(loaded.model)
    _load_stateful_objects(trainer, loaded, resuming)
    state = loaded.trainer_state
    _restore_position(trainer, state)
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
            loaded = state_checks.read_training_state(directory, model, targets, rank)
        except Exception as error:  # any failure to read a state is a reason to try the next one
            problems.append((directory, error))
        failed = failed_ranks(trainer, loaded is None)
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
    failed = failed_ranks(trainer, error is not None)
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


def _check_run_settings(trainer: Trainer, manifest: dict[str, Any], directory: Path) -> None:
    config = trainer.run_config
    assert config is not None
    saved = (manifest["num_processes"], manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"])
    now = (config.num_processes, config.train_per_device_batch_size, config.gradient_accumulation_steps)
    mid_epoch = manifest["batch_index"] > 0
    if saved == now:
        num_batches = batches_per_epoch(trainer.train_dataloader)
        if mid_epoch and manifest["num_batches_per_epoch"] != num_batches:
            raise ValueError(
                f"{directory} was saved mid-epoch with {manifest['num_batches_per_epoch']} batches per epoch, "
                f"but this run has {num_batches}: the training set differs, so the saved "
                f"position means nothing here. Resume with the same data set."
            )
        return
    change = (
        f"saved with {saved[0]} process(es) x per_device_batch_size {saved[1]} x gradient_accumulation_steps "
        f"{saved[2]}, resumed with {now[0]} x {now[1]} x {now[2]}"
    )
    same_samples_per_step = saved[0] * saved[1] == now[0] * now[1] and saved[2] == now[2]
    if mid_epoch and not same_samples_per_step:
        raise ValueError(
            f"Cannot resume {directory} mid-epoch: it was {change}, so the saved position (batch "
            f"{manifest['batch_index']} of epoch {manifest['epoch'] + 1}) does not map onto this run. Resume with "
            f"the same settings, or keep processes x per_device_batch_size and the accumulation the same."
        )
    warnings.warn(
        f"Resuming {directory}: it was {change}. "
        + ("Each update still sees the same samples, so the data position carries over; results will not be "
           "bitwise identical." if mid_epoch else "It was saved at an epoch boundary, so the run continues with "
           "the next epoch; step counts and schedules now follow the new settings."),
        stacklevel=3,
    )


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
        save_checkpoint(self._trainer(), save_path, checkpoint_kwargs, save_optimizer, save_scheduler, save_per_node, model)

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
        return load_checkpoint(self._trainer(), checkpoint_path, load_optimizer, load_scheduler, model)

    def save_training_state(self, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None = None) -> None:
        """Save everything that decides the rest of the run into the directory ``output_dir``.

        Model, optimizer, scheduler, gradient scaler, every process's RNG states, the run
        history, every stateful callback's ``state_dict()`` (by its ``state_key``), and the
        exact position (epoch, optimizer step, batch). The directory appears only once
        complete. Every process must call this, between optimizer updates (not inside an
        accumulation window). Continue a run with ``train(..., resume_from=output_dir)``.
        A save that fails (disk full, a parent that is a file) removes what it wrote and raises
        ``CheckpointWriteError`` on every process, naming the directory and the OS error.

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
        save_training_state(self._trainer(), output_dir, checkpoint_kwargs)

    def load_training_state(self, input_dir: str | os.PathLike) -> dict[str, Any]:
        """Restore a state saved by :meth:`save_training_state`; return ``{"current_epoch": E,
        **checkpoint_kwargs}``, E the epoch (counted from 1) the state was saved in.

        ``input_dir`` may be a state directory or a folder of them (the newest good one is
        taken: a newer one that is damaged or holds non-finite weights is skipped with a
        warning), or a directory written by pytorch-accelerated 0.1.x (``trainer_metadata.pt``;
        see :mod:`pytorch_accelerated.checkpoints.original_states`). Every file is checked
        before anything is loaded, so a bad state changes nothing. To continue training from
        it, use ``train(..., resume_from=input_dir)``: it calls this method, so an override
        runs there too (inside ``train`` the state is restored as a resume, at its exact
        position; see :func:`resume_training`).
        """
        return load_training_state(self._trainer(), input_dir, resuming=self in _RESUMING)
