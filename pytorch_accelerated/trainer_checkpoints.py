"""The Trainer's checkpoints: single files (weights) and training states (everything, to resume).

The Trainer's ``save_checkpoint``, ``load_checkpoint``, ``save_training_state`` and
``load_training_state`` delegate here; file formats live in :mod:`.checkpointing` and
:mod:`.training_state`, which know nothing of the Trainer.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import checkpointing, training_state

if TYPE_CHECKING:
    from .trainer import Trainer

_RESERVED = {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict"}


# ---------------------------------------------------------------------------- single files


def save_checkpoint(
    trainer: Trainer,
    save_path: str | os.PathLike,
    checkpoint_kwargs: dict[str, Any] | None,
    save_optimizer: bool,
    save_scheduler: bool,
    save_per_node: bool,
) -> None:
    extra = checkpointing.to_safe_value(dict(checkpoint_kwargs or {}))
    reserved = _RESERVED & set(extra)
    if reserved:
        raise ValueError(f"checkpoint_kwargs may not use the reserved keys {sorted(reserved)}; rename them.")
    accelerator = trainer._accelerator
    # Called on every process: with sharded models, collecting the state is collective.
    checkpoint: dict[str, Any] = {"model_state_dict": accelerator.get_state_dict(trainer.model)}
    if save_optimizer and trainer.optimizer is not None:
        checkpoint["optimizer_state_dict"] = trainer.optimizer.state_dict()
    if save_scheduler and trainer.scheduler is not None:
        checkpoint["scheduler_state_dict"] = trainer.scheduler.state_dict()
    checkpoint.update(extra)
    writer = accelerator.is_local_main_process if save_per_node else accelerator.is_main_process
    if writer:
        checkpointing.atomic_torch_save(checkpoint, save_path)
    accelerator.wait_for_everyone()


def load_checkpoint(trainer: Trainer, checkpoint_path: str | os.PathLike, load_optimizer: bool, load_scheduler: bool) -> dict[str, Any]:
    checkpoint = checkpointing.safe_torch_load(checkpoint_path)
    if not isinstance(checkpoint, dict) or "model_state_dict" not in checkpoint:
        raise ValueError(f"{str(checkpoint_path)!r} is not a checkpoint written by save_checkpoint (no 'model_state_dict').")
    load_model_state(trainer, checkpoint.pop("model_state_dict"), str(checkpoint_path))
    optimizer_state = checkpoint.pop("optimizer_state_dict", None)
    scheduler_state = checkpoint.pop("scheduler_state_dict", None)
    if load_optimizer:
        if optimizer_state is None:
            raise ValueError(f"{str(checkpoint_path)!r} holds no optimizer state; pass load_optimizer=False.")
        trainer.optimizer.load_state_dict(optimizer_state)  # type: ignore[union-attr]
    if load_scheduler and scheduler_state is not None and trainer.scheduler is not None:
        trainer.scheduler.load_state_dict(scheduler_state)
    return checkpoint


def load_model_state(trainer: Trainer, state: dict[str, Any], source: str) -> None:
    """Load ``state`` into the unwrapped model, or explain exactly how it does not fit."""
    model = trainer.get_model()
    expected = {name: tuple(value.shape) for name, value in model.state_dict().items()}
    found = {name: tuple(value.shape) for name, value in state.items()}
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(f"missing keys {_few(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_few(unexpected)}")
    mismatched = [f"{name}: {found[name]} in the file, {expected[name]} in the model" for name in sorted(set(found) & set(expected)) if found[name] != expected[name]]
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
    accelerator = trainer._accelerator
    extra = checkpointing.to_safe_value(dict(checkpoint_kwargs or {}))
    position, history = _position_to_save(trainer)
    model_state = accelerator.get_state_dict(trainer.model)  # collective for sharded models
    temporary = training_state.temporary_dir_for(output_dir)
    if accelerator.is_main_process:
        if temporary.exists():  # left by a save that was killed
            import shutil

            shutil.rmtree(temporary)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    # Each process writes what is its own: its RNGs and its share of the epoch's loss so far.
    own = {"rng": training_state.capture_rng_states(), "train_loss": _partial_loss(trainer, position)}
    training_state.write_file(own, temporary / f"rng_state_{accelerator.process_index}.pt")
    if accelerator.is_main_process:
        files = ["model.pt", "trainer_state.pt"]
        training_state.write_file(model_state, temporary / "model.pt")
        for name, obj in (("optimizer.pt", trainer.optimizer), ("scheduler.pt", trainer.scheduler), ("scaler.pt", accelerator.scaler)):
            if obj is not None:
                training_state.write_file(obj.state_dict(), temporary / name)
                files.append(name)
        training_state.write_file(_trainer_state(trainer, position, history, extra), temporary / "trainer_state.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        config = trainer.run_config
        training_state.write_manifest(
            temporary,
            {
                **position,
                "files": sorted(files + [f"rng_state_{rank}.pt" for rank in range(accelerator.num_processes)]),
                "num_processes": accelerator.num_processes,
                "per_device_batch_size": config.train_per_device_batch_size if config else None,
                "gradient_accumulation_steps": config.gradient_accumulation_steps if config else None,
                "num_batches_per_epoch": len(trainer._train_dataloader) if trainer._train_dataloader is not None else None,
            },
        )
        training_state.publish(temporary, output_dir)
    accelerator.wait_for_everyone()


def _position_to_save(trainer: Trainer) -> tuple[dict[str, int], dict[str, Any]]:
    progress, history = trainer.progress.state_dict(), trainer.run_history.state_dict()
    config = trainer.run_config
    if trainer._epoch_finished:
        # The epoch's last event has fired: a resumed run starts the next epoch.
        progress.update(epoch=progress["epoch"] + 1, batch_index=0, epoch_step=0)
        history["current_epoch"] += 1
    elif config is not None and progress["batch_index"] % config.gradient_accumulation_steps:
        if progress["batch_index"] != len(trainer._train_dataloader):
            raise RuntimeError(
                f"save_training_state was called in the middle of a gradient accumulation window "
                f"(batch {progress['batch_index']} with gradient_accumulation_steps="
                f"{config.gradient_accumulation_steps}); the accumulated gradients would be lost. "
                f"Save right after an optimizer update, e.g. from on_train_step_end when "
                f"trainer.progress.global_step has just increased."
            )
    return progress, history


def _trainer_state(trainer: Trainer, position: dict[str, int], history: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    callbacks = {
        f"{index}:{type(callback).__name__}": checkpointing.to_safe_value(callback.state_dict(), f"{type(callback).__name__}.state_dict()")
        for index, callback in enumerate(trainer.callback_handler.callbacks)
        if hasattr(callback, "state_dict")
    }
    return {
        "progress": position,
        "run_history": checkpointing.to_safe_value(history, "run_history"),
        "callbacks": callbacks,
        "loss_weight_unit": trainer._window_weighting.unit,
        "shuffle_seed": trainer._train_sampler.seed if trainer._train_sampler is not None else None,
        "checkpoint_kwargs": extra,
    }


def _partial_loss(trainer: Trainer, position: dict[str, int]) -> dict[str, Any] | None:
    if position["batch_index"] == 0:
        return None
    return {"total": trainer._train_loss.running_total, "count": trainer._train_loss.count}


def load_training_state(trainer: Trainer, input_dir: str | os.PathLike, resuming: bool = False) -> dict[str, Any]:
    """Restore every object of ``input_dir`` into ``trainer``; return its checkpoint_kwargs.

    With ``resuming`` (``train(resume_from=...)``), the run's settings are checked against the
    saved ones first, and callback states are kept for after ``on_training_run_start``.
    """
    directory = training_state.resolve_state_dir(input_dir)
    manifest = training_state.read_manifest(directory)
    assert manifest is not None
    accelerator = trainer._accelerator
    if resuming:
        _check_run_settings(trainer, manifest, directory)
    load_model_state(trainer, training_state.load_file(directory, "model.pt"), str(directory))
    files = set(manifest["files"])
    for name, obj in (("optimizer.pt", trainer.optimizer), ("scheduler.pt", trainer.scheduler), ("scaler.pt", accelerator.scaler)):
        if name in files and obj is not None:
            obj.load_state_dict(training_state.load_file(directory, name))
        elif name == "scheduler.pt" and obj is not None and resuming:
            warnings.warn(f"{directory} holds no scheduler state; the new scheduler starts from its first step.", stacklevel=3)
    state = training_state.load_file(directory, "trainer_state.pt")
    trainer.run_history.load_state_dict(state["run_history"])
    trainer.progress.load_state_dict(state["progress"])
    trainer._window_weighting.unit = state["loss_weight_unit"]
    if trainer._train_sampler is not None and state["shuffle_seed"] is not None:
        trainer._train_sampler.seed = state["shuffle_seed"]
    rank_file = f"rng_state_{accelerator.process_index}.pt"
    own = training_state.load_file(directory, rank_file if rank_file in files else "rng_state_0.pt")
    rng_states = own["rng"]
    trainer._train_loss.reset()
    if own["train_loss"] is not None:
        total = own["train_loss"]["total"]
        trainer._train_loss.running_total = total.to(trainer.device) if hasattr(total, "to") else total
        trainer._train_loss.count = own["train_loss"]["count"]
    if resuming:
        trainer._pending_resume = {"callbacks": state["callbacks"], "rng": rng_states}
    else:
        training_state.restore_rng_states(rng_states)
        apply_callback_states(trainer, state["callbacks"])
    return state["checkpoint_kwargs"]


def apply_callback_states(trainer: Trainer, states: dict[str, Any]) -> None:
    for index, callback in enumerate(trainer.callback_handler.callbacks):
        key = f"{index}:{type(callback).__name__}"
        if key in states and hasattr(callback, "load_state_dict"):
            callback.load_state_dict(states[key])


def _check_run_settings(trainer: Trainer, manifest: dict[str, Any], directory: Path) -> None:
    config = trainer.run_config
    assert config is not None
    saved = (manifest["num_processes"], manifest["per_device_batch_size"], manifest["gradient_accumulation_steps"])
    now = (config.num_processes, config.train_per_device_batch_size, config.gradient_accumulation_steps)
    mid_epoch = manifest["batch_index"] > 0
    if saved == now:
        if mid_epoch and manifest["num_batches_per_epoch"] != len(trainer._train_dataloader):
            raise ValueError(
                f"{directory} was saved mid-epoch with {manifest['num_batches_per_epoch']} batches per epoch, "
                f"but this run has {len(trainer._train_dataloader)}: the training set differs, so the saved "
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
