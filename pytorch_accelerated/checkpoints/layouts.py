"""Training-state layouts: one class per kind of state directory, chosen once per save or load.

- :class:`PlainLayout` (here): the states this library writes (see :mod:`.directories` for the
  files); the writing process writes the whole model and optimizer (``model.pt``, ``optimizer.pt``).
- :class:`~.sharded.ShardedLayout`: the same, but under FSDP every process writes its shards of the
  model and optimizer.
- :class:`~.original_states.OriginalLayout`: directories written by pytorch-accelerated 0.1.x,
  read only.

A layout owns its files: what each process writes into a state's hidden directory, what the
manifest records, how every file is read and checked before anything is loaded (giving a
:class:`LoadedState`), and how it is loaded. Agreeing across processes, publishing, waiting and
choosing the layout are the store's (:mod:`.store`). Adding a format means adding one class.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._internal.fsdp import uses_fsdp
from ..data import batches_per_epoch
from . import changed_settings, file_checks, finite, original_states, resume, sharded, torch_files, trainable
from .collective_saves import CollectiveSave, attempt, saves_on_each_node
from .directories import manifest_problem, read_manifest, sync_files
from .rng import capture_rng_states
from .training_objects import TrainingObjects


@dataclass
class LoadedState:
    """Every file of a training state that this process needs, read and checked, ready to be loaded.

    Attributes:
        directory: the state's directory.
        layout: the layout that read it (and loads it).
        manifest: the state's manifest ({} for a layout without one).
        model: the whole model's state dict ({} when the layout loads the model itself).
        objects: the states of the objects saved whole, by file name (``optimizer.pt``, ...).
        trainer_state: ``progress``, ``run_history`` (None: not saved), ``callbacks`` (None: not
            saved), ``checkpoint_kwargs``, and the shared part of the run's working state.
        process_state: this process's ``rng`` states (None: not restorable) and share of the loss.
        saved_epoch: the epoch, counted from 1, the state was saved in.
    """

    directory: Path
    layout: StateLayout
    manifest: dict[str, Any]
    model: dict[str, Any]
    objects: dict[str, Any]
    trainer_state: dict[str, Any]
    process_state: dict[str, Any]
    saved_epoch: int


class StateLayout(ABC):
    """One kind of training-state directory: reading, checking and loading it."""

    @abstractmethod
    def read(self, directory: Path, objects: TrainingObjects) -> LoadedState:
        """Read and check every file of ``directory`` this process needs; change nothing.

        Raises:
            An error naming the file and what is wrong with it (missing, truncated, not fitting
            the model or optimizer, non-finite weights).
        """

    def load(self, loaded: LoadedState, objects: TrainingObjects, resuming: bool) -> None:
        """Load the model, the optimizer and the other objects saved whole (every process); a
        sharded run (FSDP) keeps its shards of the model and optimizer."""
        self.load_weights(loaded, objects)
        for name, obj in objects.stateful().items():
            if name == "optimizer.pt" and name in loaded.objects:
                plain = objects.plain_model(keep_torch_compile=False)
                sharded.load_full_optimizer_state(plain, obj, loaded.objects[name])
            elif name in loaded.objects:
                obj.load_state_dict(loaded.objects[name])

    def load_weights(self, loaded: LoadedState, objects: TrainingObjects) -> None:
        """Load the model's state (a sharded model keeps its shards of it)."""
        sharded.load_full_model_state(objects.plain_model(), loaded.model)

    def map_position(self, loaded: LoadedState, objects: TrainingObjects) -> resume.MappedPosition | None:
        """Check the run's settings against the saved ones before anything is loaded (refusing a
        change, or announcing it in one warning); return where a state saved mid-epoch on other
        settings continues (None: at its saved position)."""
        directory, state, saved_optimizer = (
            loaded.directory,
            loaded.trainer_state,
            loaded.objects.get("optimizer.pt"),
        )
        notices = changed_settings.check_training_set(
            objects, directory, state, loaded.manifest["batch_index"] > 0
        )
        mapped = resume.check_run_settings(objects, directory, loaded.manifest, state)
        changed_settings.announce(
            directory, notices + changed_settings.changes(objects, state, saved_optimizer)
        )
        return mapped


class PlainLayout(StateLayout):
    """The states this library writes, with the whole model and optimizer in ``model.pt`` and
    ``optimizer.pt``, written by the process that writes the shared files."""

    #: Files of the stateful objects that this layout writes in another form (see ``weights``).
    replaced_files: tuple[str, ...] = ()

    # ------------------------------------------------------------------ writing

    def check_can_save(self, objects: TrainingObjects, output_dir: Path, asynchronous: bool) -> None:
        """Refuse, before anything is written, a save this layout cannot do."""

    def weights(self, objects: TrainingObjects) -> dict[str, Any]:
        """The model's file, by name: called on every process, since collecting the state is
        collective with some engines; only the writing process writes it."""
        # The plain model's keys, even compiled.
        return {
            "model.pt": file_checks.without_compile_prefix(objects.accelerator.get_state_dict(objects.model))
        }

    def files_to_write(
        self,
        objects: TrainingObjects,
        position: dict[str, int],
        extra: dict[str, Any],
        shared: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """What this process writes, by file name: its RNG states and share of the epoch's loss;
        with ``shared`` (the writing process: ``weights``' files), also those, the objects saved
        whole and ``trainer_state.pt``."""
        contents: dict[str, Any] = {
            f"rng_state_{objects.accelerator.process_index}.pt": {
                "rng": cut.rng_states if (cut := objects.loop_state.cut_short) else capture_rng_states(),
                **objects.loop_state.process_state_dict(position["batch_index"] > 0),
            }
        }
        if shared is not None:
            contents |= {
                **shared,
                **{
                    name: obj.state_dict()
                    for name, obj in objects.stateful().items()
                    if obj is not None and name not in self.replaced_files
                },
                "trainer_state.pt": trainer_state(objects, position, extra),
            }
        return contents

    def write_collectively(self, objects: TrainingObjects, temporary: Path, save: CollectiveSave) -> None:
        """What every process writes together, once the files are written (nothing here)."""

    def before_publishing(self, temporary: Path) -> None:
        """Make sure every file in ``temporary`` is on disk (each was flushed when written)."""

    def manifest(self, objects: TrainingObjects, position: dict[str, int]) -> dict[str, Any]:
        """What the manifest records besides the files: the position, the run's batch settings and
        the run that wrote it."""
        config, loader, identity = objects.run_config, objects.train_dataloader, objects.run_identity
        return {
            **position,
            "finite": True,  # every save checks the weights first (finite.check_finite_before_save)
            "num_processes": objects.accelerator.num_processes,
            "per_device_batch_size": config.train_per_device_batch_size if config else None,
            "gradient_accumulation_steps": config.gradient_accumulation_steps if config else None,
            "num_batches_per_epoch": batches_per_epoch(loader) if loader is not None else None,
            "run_id": identity.run_id,  # the run that wrote it, and its updates over its train() calls
            "run_step": identity.steps_before + position["global_step"],
            "stage": identity.stage,  # the train() call that wrote it (resume_from="auto" resumes its own)
            # What train() was given: a resume on another number of processes may change it.
            "asked_accumulation_steps": identity.asked_accumulation,
        }

    # ------------------------------------------------------------------ reading and loading

    def read(self, directory: Path, objects: TrainingObjects) -> LoadedState:
        manifest = read_manifest(directory)
        if manifest is None:
            raise file_checks.UnusableStateError(
                manifest_problem(directory)
                or f"{directory} is not a complete training state (its manifest is missing or unreadable)."
            )
        if manifest.get("finite") is False:
            raise file_checks.UnusableStateError(
                f"{directory} holds NaN or infinite weights (so its manifest records)."
            )
        file_checks.check_saved_settings(directory, manifest)
        model_state = self.read_weights(directory, manifest, objects)
        listed, targets = set(manifest.get("files", ())), objects.stateful()
        saved = {
            name: file_checks.read_file(directory, name, manifest)
            for name, target in targets.items()
            if name in listed and target is not None
        }
        for name, state in saved.items():
            file_checks.check_object_state(targets[name], state, str(directory / name))
        state = file_checks.read_file(directory, "trainer_state.pt", manifest)
        where = directory / "trainer_state.pt"
        file_checks.require_keys(
            state,
            ("progress", "run_history", "callbacks", "checkpoint_kwargs", "loss_weight_unit", "shuffle_seed"),
            where,
        )
        file_checks.require_keys(
            state["progress"], ("epoch", "global_step", "batch_index"), where, "progress"
        )
        file_checks.require_keys(state["run_history"], ("current_epoch",), where, "run_history")
        file_checks.check_position(directory, manifest, state)
        trainable.read_record(state, where)
        process_state = file_checks.read_process_state(
            directory, manifest, objects.accelerator.process_index, objects.accelerator.num_processes
        )
        return LoadedState(
            directory, self, manifest, model_state, saved, state, process_state, saved_epoch(state)
        )

    def read_weights(
        self, directory: Path, manifest: dict[str, Any], objects: TrainingObjects
    ) -> dict[str, Any]:
        """Read and check the whole model's state (it loads into a sharded run too)."""
        model = objects.plain_model()
        model_state = file_checks.match_model_keys(
            model, file_checks.read_file(directory, "model.pt", manifest)
        )
        file_checks.check_model_state(model, model_state, str(directory))
        if not finite.state_is_finite(model_state):
            raise file_checks.UnusableStateError(f"{directory / 'model.pt'} holds NaN or infinite weights.")
        return model_state

    def load(self, loaded: LoadedState, objects: TrainingObjects, resuming: bool) -> None:
        """Load the weights and the objects saved whole, and warn when a resume finds no scheduler state."""
        super().load(loaded, objects, resuming)
        if resuming and objects.scheduler is not None and "scheduler.pt" not in loaded.objects:
            warnings.warn(
                f"{loaded.directory} holds no scheduler state; the new scheduler starts from its first step.",
                stacklevel=6,
            )


class ShardedLayout(PlainLayout):
    """Training states of a run under accelerate's FSDP engine: every process writes its shards of
    the model and optimizer (see :mod:`.sharded`); the manifest records how they were sharded.
    Such a state loads only under the same FSDP configuration (on any number of processes)."""

    replaced_files = ("model.pt", "optimizer.pt")

    def check_can_save(self, objects: TrainingObjects, output_dir: Path, asynchronous: bool) -> None:
        sharded.check_can_save(
            objects.accelerator, output_dir, asynchronous, saves_on_each_node(objects.accelerator)
        )

    def weights(self, objects: TrainingObjects) -> dict[str, Any]:
        return {}  # every process writes its shards instead

    def write_collectively(self, objects: TrainingObjects, temporary: Path, save: CollectiveSave) -> None:
        """Every process writes its shards of the model, then of the optimizer (accelerate's FSDP
        savers, collective), agreeing after each."""
        accelerator, model = objects.accelerator, objects.model
        sharded.registered_shards(model)  # after an evaluation, FSDP2 holds whole parameters
        save.agree(attempt(sharded.save_model, accelerator, model, temporary))
        if objects.optimizer is not None:
            save.agree(attempt(sharded.save_optimizer, accelerator, objects.optimizer, model, temporary))

    def before_publishing(self, temporary: Path) -> None:
        sync_files(temporary)  # accelerate writes FULL_STATE_DICT files with a plain torch.save

    def manifest(self, objects: TrainingObjects, position: dict[str, int]) -> dict[str, Any]:
        return {
            **super().manifest(objects, position),
            "sharded": sharded.sharding_record(objects.accelerator),
        }

    def read_weights(
        self, directory: Path, manifest: dict[str, Any], objects: TrainingObjects
    ) -> dict[str, Any]:
        """Check that this run can load the shards, and every file of them (see :mod:`.sharded`)."""
        accelerator = objects.accelerator
        sharded.check_engine(directory, manifest["sharded"], sharded.sharding_record(accelerator))
        sharded.check_sharded_state(
            directory,
            manifest,
            objects.plain_model(),
            objects.optimizer,
            (accelerator.process_index, accelerator.num_processes),
        )
        return {}  # loaded by every process from its shards

    def load_weights(self, loaded: LoadedState, objects: TrainingObjects) -> None:
        sharded.registered_shards(objects.model)  # after an evaluation, FSDP2 holds whole parameters
        sharded.load(objects.accelerator, objects.model, objects.optimizer, loaded.directory, loaded.manifest)


class OriginalLayout(StateLayout):
    """Directories written by pytorch-accelerated 0.1.x, read only (see :mod:`.original_states`).

    They record only the epoch E they were saved in, so the run continues at the start of epoch E,
    after ``(E - 1) x num_update_steps_per_epoch`` updates, with the scheduler's counter set there
    (a scheduler of this library), and a warning; callback states are not restored."""

    def read(self, directory: Path, objects: TrainingObjects) -> LoadedState:
        saved = original_states.read_original_state(directory, objects.accelerator.process_index)
        model = objects.plain_model()
        model_state = file_checks.match_model_keys(model, saved.model)
        file_checks.check_model_state(model, model_state, str(directory))
        targets = objects.stateful()
        states = {name: state for name, state in saved.objects.items() if targets.get(name) is not None}
        for name, state in states.items():
            file_checks.check_object_state(targets[name], state, f"{directory} ({name})")
        steps = objects.run_config.num_update_steps_per_epoch if objects.run_config is not None else None
        state = {
            "progress": {
                "epoch": saved.current_epoch - 1,
                "global_step": (saved.current_epoch - 1) * (steps or 0),
                "batch_index": 0,
                "epoch_step": 0,
            },
            "run_history": None,  # not saved: the run's own history goes on
            "callbacks": None,  # not saved
            "checkpoint_kwargs": saved.checkpoint_kwargs,
            "updates_per_epoch": steps,
        }
        return LoadedState(
            directory,
            self,
            {},
            model_state,
            states,
            state,
            {"rng": saved.rng, "train_loss": None},  # process_state
            saved.current_epoch,
        )

    def map_position(self, loaded: LoadedState, objects: TrainingObjects) -> resume.MappedPosition | None:
        return None  # it continues at the start of its epoch, whatever the settings

    def load(self, loaded: LoadedState, objects: TrainingObjects, resuming: bool) -> None:
        super().load(loaded, objects, resuming)
        epoch, updates = loaded.saved_epoch, loaded.trainer_state["progress"]["global_step"]
        known = loaded.trainer_state["updates_per_epoch"] is not None
        counter = _set_scheduler_counter(objects.scheduler, updates) if known else ""
        warnings.warn(
            f"{loaded.directory} was written by pytorch-accelerated 0.1.x, which records only the epoch it was "
            f"saved in (current_epoch={epoch}): the run continues at the start of epoch {epoch}"
            + (f", after {updates} updates{counter}" if known else "")
            + ". Callback states are not restored, nor which parameters require gradients"
            + ("" if loaded.process_state["rng"] is not None else ", nor the RNGs")
            + ".",
            stacklevel=6,
        )


def _set_scheduler_counter(scheduler: Any, updates: int) -> str:
    """Put a scheduler of this library at ``updates`` completed updates; say what was done."""
    if scheduler is None:
        return ""
    state = scheduler.state_dict()
    if "_num_updates" not in state:
        return f"; the scheduler ({type(scheduler).__name__}) keeps the state it was saved with"
    scheduler.load_state_dict({**state, "_num_updates": updates, "num_updates": updates})
    return f"; the scheduler's counter is set to {updates}"


def layout_for_saving(accelerator: Any) -> PlainLayout:
    """The layout a run writes its training states in: sharded under accelerate's FSDP engine."""
    return ShardedLayout() if uses_fsdp(accelerator) else PlainLayout()


def layout_of(directory: Path) -> StateLayout:
    """The layout of the state in ``directory`` (whose manifest, if any, says how it was written)."""
    if original_states.is_original_state(directory):
        return OriginalLayout()
    return ShardedLayout() if (read_manifest(directory) or {}).get("sharded") is not None else PlainLayout()


def trainer_state(
    objects: TrainingObjects, position: dict[str, int], extra: dict[str, Any]
) -> dict[str, Any]:
    """``trainer_state.pt``: the position, the run history, each callback's state and the shared
    part of the run's working state, with the user's ``checkpoint_kwargs``."""
    run_state = resume.run_state_dict(objects)
    cut = objects.loop_state.cut_short  # the limit ended the run mid-epoch: the run as it was there
    history = dict(cut.run_history) if cut is not None else objects.run_history.state_dict()
    # The history's epoch follows the saved position (older versions read it from here).
    history["current_epoch"] = run_state["history_first_epoch"] + position["epoch"]
    callbacks = {
        key: torch_files.to_safe_value(state, f"{key}.state_dict()")
        for key, state in objects.callbacks.state_dict().items()
    }
    return {
        "progress": position,
        "run_history": torch_files.to_safe_value(history, "run_history"),
        "callbacks": callbacks,
        **run_state,
        "run_settings": changed_settings.run_settings(objects),
        "frozen_parameters": trainable.frozen_parameters(objects.plain_model(keep_torch_compile=False)),
        "checkpoint_kwargs": extra,
    }


def saved_epoch(state: dict[str, Any]) -> int:
    """The epoch (counted from 1, as ``run_history.current_epoch``) a state was saved in."""
    progress = state["progress"]
    first = int(state.get("history_first_epoch", state["run_history"]["current_epoch"] - progress["epoch"]))
    # A position at an epoch's first batch was saved at the end of the epoch before.
    in_epoch = progress["batch_index"] > 0 or bool(state.get("epoch_trained", False))
    return max(first, first + progress["epoch"] - (0 if in_epoch else 1))
