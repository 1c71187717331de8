"""The Trainer's checkpoints: single files (weights) and training states (everything, to resume).

The Trainer's ``save_checkpoint``, ``load_checkpoint``, ``save_training_state`` and
``load_training_state`` delegate here, and this module reaches the Trainer through its public
attributes only (``accelerator``, ``model``, ``optimizer``, ``scheduler``, ``progress``,
``run_state``, ``run_history``, ``callback_handler``, ...). File formats live in :mod:`.files`
and :mod:`.state_dirs`, which know nothing of the Trainer.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from . import files, state_dirs

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
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    reserved = _RESERVED & set(extra)
    if reserved:
        raise ValueError(f"checkpoint_kwargs may not use the reserved keys {sorted(reserved)}; rename them.")
    accelerator = trainer.accelerator
    # Called on every process: with sharded models, collecting the state is collective.
    source = trainer.model if model is None else model
    checkpoint: dict[str, Any] = {"model_state_dict": accelerator.get_state_dict(source)}
    if save_optimizer and trainer.optimizer is not None:
        checkpoint["optimizer_state_dict"] = trainer.optimizer.state_dict()
    if save_scheduler and trainer.scheduler is not None:
        checkpoint["scheduler_state_dict"] = trainer.scheduler.state_dict()
    checkpoint.update(extra)
    writer = accelerator.is_local_main_process if save_per_node else accelerator.is_main_process
    if writer:
        files.atomic_torch_save(checkpoint, save_path)
    accelerator.wait_for_everyone()


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
    load_model_state(target, checkpoint.pop("model_state_dict"), str(checkpoint_path))
    optimizer_state = checkpoint.pop("optimizer_state_dict", None)
    scheduler_state = checkpoint.pop("scheduler_state_dict", None)
    if load_optimizer and trainer.optimizer is not None:
        if optimizer_state is None:
            raise ValueError(f"{str(checkpoint_path)!r} holds no optimizer state; pass load_optimizer=False.")
        trainer.optimizer.load_state_dict(optimizer_state)
    if load_scheduler and scheduler_state is not None and trainer.scheduler is not None:
        trainer.scheduler.load_state_dict(scheduler_state)
    return checkpoint


def load_model_state(model: nn.Module, state: dict[str, Any], source: str) -> None:
    """Load ``state`` into ``model`` (unwrapped), or explain exactly how it does not fit."""
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in state.items()}
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(f"missing keys {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_few(unexpected)}")
    mismatched = [
        f"{name}: {found[name]} in the file, {expected[name]} in the model"
        for name in sorted(set(found) & set(expected))
        if found[name] != expected[name]
    ]
    if mismatched:
        problems.append(f"size mismatch for {_few(mismatched)}")
    if problems:
        raise RuntimeError(
            f"The checkpoint {source!r} does not fit this model ({type(model).__name__}): "
            + "; ".join(problems)
            + ". Was it saved from a different model?"
        )
    model.load_state_dict(state)


def _few(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


# ---------------------------------------------------------------------------- training states


def save_training_state(trainer: Trainer, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None) -> None:
    output_dir = Path(output_dir)
    accelerator = trainer.accelerator
    extra = files.to_safe_value(dict(checkpoint_kwargs or {}))
    position = _position_to_save(trainer)
    model_state = accelerator.get_state_dict(trainer.model)  # collective for sharded models
    temporary = state_dirs.temporary_dir_for(output_dir)
    if accelerator.is_main_process:
        if temporary.exists():  # left by a save that was killed
            shutil.rmtree(temporary)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    # Each process writes what is its own: its RNGs and its share of the epoch's loss so far.
    own = {"rng": state_dirs.capture_rng_states(), **trainer.run_state.process_state_dict(position["batch_index"] > 0)}
    state_dirs.write_file(own, temporary / f"rng_state_{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        written = _write_shared_files(trainer, temporary, model_state, _trainer_state(trainer, position, extra))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        rank_files = [f"rng_state_{rank}.pt" for rank in range(accelerator.num_processes)]
        state_dirs.write_manifest(temporary, _manifest(trainer, position, sorted(written + rank_files)))
        state_dirs.publish(temporary, output_dir)
    accelerator.wait_for_everyone()


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
        "num_processes": trainer.accelerator.num_processes,
        "per_device_batch_size": config.train_per_device_batch_size if config else None,
        "gradient_accumulation_steps": config.gradient_accumulation_steps if config else None,
        "num_batches_per_epoch": len(loader) if loader is not None else None,
    }


def _position_to_save(trainer: Trainer) -> dict[str, int]:
    position = trainer.progress.state_dict()
    config = trainer.run_config
    if trainer.run_state.epoch_finished:
        # The epoch's last event has fired: a resumed run starts the next epoch.
        position.update(epoch=position["epoch"] + 1, batch_index=0, epoch_step=0)
    elif config is not None and position["batch_index"] % config.gradient_accumulation_steps:
        if position["batch_index"] != len(trainer.train_dataloader):
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


def load_training_state(trainer: Trainer, input_dir: str | os.PathLike, resuming: bool = False) -> dict[str, Any]:
    """Restore every object of ``input_dir`` into ``trainer``; return its checkpoint_kwargs.

    With ``resuming`` (``train(resume_from=...)``), the run's settings are checked against the
    saved ones first, and callback and RNG states wait in ``trainer.run_state.pending_resume``
    until the run's start events have fired (see :func:`apply_pending_resume`).
    """
    directory = state_dirs.resolve_state_dir(input_dir)
    manifest = state_dirs.read_manifest(directory)
    if manifest is None:  # resolve_state_dir returns complete states only
        raise ValueError(f"{directory} is not a complete training state.")
    if resuming:
        _check_run_settings(trainer, manifest, directory)
    load_model_state(trainer.get_model(), state_dirs.load_file(directory, "model.pt"), str(directory))
    _load_stateful_objects(trainer, directory, set(manifest["files"]), resuming)
    state = state_dirs.load_file(directory, "trainer_state.pt")
    _restore_position(trainer, state)
    rank_file = f"rng_state_{trainer.accelerator.process_index}.pt"
    own = state_dirs.load_file(directory, rank_file if rank_file in manifest["files"] else "rng_state_0.pt")
    trainer.run_state.load_process_state_dict(own, trainer.device)
    trainer.run_state.pending_resume = {"callbacks": state["callbacks"], "rng": own["rng"]}
    if not resuming:
        apply_pending_resume(trainer)
    return state["checkpoint_kwargs"]


def _load_stateful_objects(trainer: Trainer, directory: Path, saved: set[str], resuming: bool) -> None:
    for name, obj in _stateful_objects(trainer):
        if name in saved and obj is not None:
            obj.load_state_dict(state_dirs.load_file(directory, name))
        elif name == "scheduler.pt" and obj is not None and resuming:
            warnings.warn(f"{directory} holds no scheduler state; the new scheduler starts from its first step.", stacklevel=4)


def _restore_position(trainer: Trainer, state: dict[str, Any]) -> None:
    trainer.progress.load_state_dict(state["progress"])
    run_state = dict(state)
    # States saved before the first epoch was recorded: the history's epoch tells it.
    run_state.setdefault("history_first_epoch", state["run_history"]["current_epoch"] - state["progress"]["epoch"])
    trainer.run_state.load_state_dict(run_state)
    trainer.run_history.load_state_dict(state["run_history"])
    trainer.run_history.set_current_epoch(trainer.run_state.history_first_epoch + trainer.progress.epoch)


def apply_pending_resume(trainer: Trainer) -> None:
    """Restore the callback states, then the RNGs, that :func:`load_training_state` keeps back.

    On resume this runs after ``on_training_run_start`` (callbacks set themselves up there;
    their saved state goes in after) and last of all, once nothing else can draw from the RNGs.
    """
    pending = trainer.run_state.pending_resume
    if pending is None:
        return
    trainer.run_state.pending_resume = None
    trainer.callback_handler.load_state_dict(pending["callbacks"])
    state_dirs.restore_rng_states(pending["rng"])


def _check_run_settings(trainer: Trainer, manifest: dict[str, Any], directory: Path) -> None:
    config = trainer.run_config
    assert config is not None
    saved = (manifest["num_processes"], manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"])
    now = (config.num_processes, config.train_per_device_batch_size, config.gradient_accumulation_steps)
    mid_epoch = manifest["batch_index"] > 0
    if saved == now:
        if mid_epoch and manifest["num_batches_per_epoch"] != len(trainer.train_dataloader):
            raise ValueError(
                f"{directory} was saved mid-epoch with {manifest['num_batches_per_epoch']} batches per epoch, "
                f"but this run has {len(trainer.train_dataloader)}: the training set differs, so the saved "
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
        """Load a file written by :meth:`save_checkpoint` (never running code from it); return
        its ``checkpoint_kwargs``. ``model`` loads the weights into another model."""
        return load_checkpoint(self._trainer(), checkpoint_path, load_optimizer, load_scheduler, model)

    def save_training_state(self, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None = None) -> None:
        """Save everything that decides the rest of the run into the directory ``output_dir``.

        Model, optimizer, scheduler, gradient scaler, every process's RNG states, the run
        history, every stateful callback's ``state_dict()`` (by its ``state_key``), and the
        exact position (epoch, optimizer step, batch). The directory appears only once
        complete. Every process must call this, between optimizer updates (not inside an
        accumulation window). Continue a run with ``train(..., resume_from=output_dir)``.

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
        """Restore a state saved by :meth:`save_training_state`; return its ``checkpoint_kwargs``.

        ``input_dir`` may be a state directory or a folder of them (the newest complete one is
        taken). To continue training from it, use ``train(..., resume_from=input_dir)``.
        """
        return load_training_state(self._trainer(), input_dir)
