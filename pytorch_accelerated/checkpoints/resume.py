"""Where a run resumes: the plan of a resume (:class:`ResumePlan`, chosen once), the position a
training state records when it is saved, the run's settings checked against the saved ones before
anything is loaded, the position restored, and what a resume restores once the run has started
(:class:`Resumed`).

A state saved mid-epoch on other settings (number of processes, per-device batch size,
accumulation) continues at the same sample of the epoch's order (:mod:`.reshard`); one whose
position means nothing for this run is refused with the reason and the fix.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed

from .._internal.distributed import print_once_per_node
from ..data import batches_per_epoch, is_map_style
from . import reshard
from .directories import read_manifest
from .discovery import candidate_states
from .reshard import RESEED_KEY, MappedPosition
from .rng import restore_rng_states
from .trainable import TrainableParameters
from .training_objects import Stateful, TrainingObjects


@dataclass(frozen=True)
class ResumePlan(os.PathLike):
    """What ``train(resume_from=...)`` resumes, chosen once, before the run is set up: the training
    states to try, newest first. ``train`` hands the plan to ``load_training_state`` as its
    ``input_dir`` (a path: the one asked); loading it restores the first of ``states`` that passes
    every check, at its exact position (see :meth:`.TrainingStateStore.resume`).

    Attributes:
        asked: the state or folder of states asked for, or the one ``resume_from="auto"`` chose.
        states: the states to try, newest first; a state named by ``asked`` is the only one.
        explicit: ``asked`` names one state, which is never swapped for another.
        auto: chosen by ``resume_from="auto"`` (the resume's line says so).
        problem: why ``asked`` holds no state to try; raised when the plan is loaded (an override
            of ``load_training_state`` that restores a state of its own never meets it).
    """

    asked: Path
    states: tuple[Path, ...]
    explicit: bool
    auto: bool = False
    problem: Exception | None = None

    @classmethod
    def of(cls, path: str | os.PathLike) -> ResumePlan:
        """The plan of ``resume_from=path``: the states it names (see :func:`.discovery.candidate_states`)."""
        try:
            states, explicit = candidate_states(path)
        except (OSError, ValueError) as problem:
            return cls(Path(path), (), True, problem=problem)
        return cls(Path(path), tuple(states), explicit)

    def __fspath__(self) -> str:
        return os.fspath(self.asked)

    def __str__(self) -> str:
        return os.fspath(self.asked)

    def __truediv__(self, name: str) -> Path:
        return self.asked / name

    def accumulation_keeping_global_batch(
        self, accelerator: Any, per_device_batch_size: int, asked: int
    ) -> int:
        """The ``gradient_accumulation_steps`` of a run that resumes the newest of :attr:`states` (none:
        ``asked``), keeping that state's global batch when it was saved on another number of processes
        by the same settings (see :func:`.reshard.kept_accumulation`), with one line saying so.

        Raises:
            ValueError: before training, when no accumulation keeps it.
        """
        # The newest whose manifest reads (a damaged one is skipped by the resume too).
        directory, manifest = next(
            ((state, manifest) for state in self.states if (manifest := read_manifest(state))),
            (self.asked, {}),
        )
        now = reshard.BatchSettings(accelerator.num_processes, per_device_batch_size, asked)
        saved = reshard.BatchSettings.from_manifest(manifest)
        kept = reshard.kept_accumulation(saved, manifest.get("asked_accumulation_steps"), now, directory)
        if kept is None:
            return asked
        if kept != asked and accelerator.is_main_process:
            print_once_per_node(
                accelerator,
                f"Resuming {directory} on {now.num_processes} process(es), saved on {saved.num_processes}: "
                f"gradient_accumulation_steps {kept} instead of {asked} keeps its global batch of "
                f"{saved.global_batch * saved.gradient_accumulation_steps} samples per update.",
            )
        return kept


class Resumed(dict[str, Any]):
    """What loading a :class:`ResumePlan` returns: ``{"current_epoch": E, **checkpoint_kwargs}``, as
    ``load_training_state`` returns for any state, and what the resume restores once the run's start
    events have fired (:meth:`restore_after_start`).

    Attributes:
        directory: the state loaded.
        state: its ``trainer_state.pt``: the callbacks' states (``callbacks``; None in 0.1.x's) and
            what the resume's line reports (``epoch_trained``).
        rng_states: this process's RNG states (None: not restorable).
        trainable: which parameters require gradients, as saved (None: the state records nothing).
    """

    def __init__(
        self,
        returned: dict[str, Any],
        directory: Path,
        state: dict[str, Any],
        rng_states: dict[str, Any] | None,
        trainable: TrainableParameters | None,
    ) -> None:
        super().__init__(returned)
        self.directory, self.state, self.rng_states, self.trainable = directory, state, rng_states, trainable

    def restore_after_start(self, callbacks: Stateful) -> None:
        """Restore which parameters require gradients, the callbacks' states, then the RNGs: after
        ``on_training_run_start`` (callbacks set themselves up there, and a script may freeze a model
        for a new run; the saved state goes in after), last of all, once nothing else can draw from
        the RNGs."""
        if self.trainable is not None:  # which parameters require gradients, as saved
            self.trainable.restore()
        if self.state["callbacks"] is not None:
            callbacks.load_state_dict(self.state["callbacks"])
        if self.rng_states is not None:
            restore_rng_states(self.rng_states)
            if RESEED_KEY in self.rng_states:  # a rank that saved no RNG states: its own stream
                set_seed(int(torch.randint(0, 2**31 - 1, (1,)).item()) + int(self.rng_states[RESEED_KEY]))


def position_to_save(objects: TrainingObjects) -> dict[str, int]:
    """The position a state saved now records: where a resumed run continues (after a cut by
    ``max_num_train_steps`` before an epoch's last batch, the cut: see ``run_config.CutShort``).

    Raises:
        RuntimeError: in the middle of an accumulation window (its gradients would be lost).
    """
    if (cut := objects.loop_state.cut_short) is not None:  # the limit ended the run mid-epoch: there
        return dict(cut.position)
    position = objects.progress.state_dict()
    config = objects.run_config
    if objects.loop_state.epoch_finished:
        # The epoch's last event has fired: a resumed run starts the next epoch.
        position.update(epoch=position["epoch"] + 1, batch_index=0, epoch_step=0)
    elif (
        config is not None
        and position["batch_index"] % config.gradient_accumulation_steps
        # The partial last window of an epoch ends with an update; a stream's end is not known here.
        and position["batch_index"] != batches_per_epoch(objects.train_dataloader, position["batch_index"])
    ):
        raise RuntimeError(
            f"save_training_state was called in the middle of a gradient accumulation window "
            f"(batch {position['batch_index']} with gradient_accumulation_steps="
            f"{config.gradient_accumulation_steps}); the accumulated gradients would be lost. "
            f"Save right after an optimizer update, e.g. from on_train_step_end when "
            f"is_update_step is True."
        )
    return position


def run_state_dict(objects: TrainingObjects) -> dict[str, Any]:
    """What a state records of the run besides its position, history and callbacks, the same on every
    process: its identity, the loss weighting unit, whether the epoch's training was done, and the
    shuffle sampler's seed."""
    sampler = objects.train_sampler
    return {
        **objects.run_identity.state_dict(),
        **objects.loop_state.state_dict(),
        "shuffle_seed": sampler.seed if sampler is not None else None,
        # The training set's length and, in an epoch resumed on other settings, the samples its
        # order starts after: a resume on other settings maps the position through them.
        "train_samples": sampler.num_samples if sampler is not None else None,
        "samples_skipped": sampler.skipped if sampler is not None else 0,
    }


def load_run_state_dict(objects: TrainingObjects, state: dict[str, Any]) -> None:
    """Restore what :func:`run_state_dict` recorded (but the samples skipped: see :func:`adopt_run_settings`)."""
    objects.run_identity.load_state_dict(state)
    objects.loop_state.load_state_dict(state)
    if objects.train_sampler is not None and state["shuffle_seed"] is not None:
        objects.train_sampler.seed = state["shuffle_seed"]


def restore_position(objects: TrainingObjects, state: dict[str, Any], process_state: dict[str, Any]) -> None:
    """Restore the saved position, run history (when saved) and working state of the run."""
    objects.progress.load_state_dict(state["progress"])
    if state["run_history"] is not None:
        # States saved before the first epoch was recorded: the history's epoch tells it.
        first_epoch = state["run_history"]["current_epoch"] - state["progress"]["epoch"]
        load_run_state_dict(objects, {"history_first_epoch": first_epoch, **state})
        objects.run_history.load_state_dict(state["run_history"])
    objects.run_history.set_current_epoch(objects.run_identity.history_first_epoch + objects.progress.epoch)
    objects.loop_state.load_process_state_dict(process_state, objects.accelerator.device)


def check_run_settings(
    objects: TrainingObjects, directory: Path, manifest: dict[str, Any], state: dict[str, Any]
) -> MappedPosition | None:
    """Check the run's settings against the saved ones, before anything is loaded; return where
    a state saved mid-epoch on other settings continues (None: at its saved position).

    Raises:
        ValueError: naming the setting and the fix, where the saved position does not map.
    """
    config = objects.run_config
    assert config is not None  # resuming happens inside a training run
    saved = reshard.BatchSettings.from_manifest(manifest)
    now = reshard.BatchSettings(
        config.num_processes, config.train_per_device_batch_size, config.gradient_accumulation_steps
    )
    mid_epoch = manifest["batch_index"] > 0
    # An epoch resumed on other settings starts its order after some samples: it maps too.
    if saved == now and not (mid_epoch and state.get("samples_skipped")):
        num_batches = batches_per_epoch(objects.train_dataloader)
        if mid_epoch and manifest["num_batches_per_epoch"] != num_batches:
            raise ValueError(
                f"{directory} was saved mid-epoch with {manifest['num_batches_per_epoch']} batches per epoch, "
                f"but this run has {num_batches}: the training set differs, so the saved "
                f"position means nothing here. Resume with the same data set."
            )
        return None
    change = (
        f"saved with {saved.describe()}, resumed with {now.num_processes} x {now.per_device_batch_size} x "
        f"{now.gradient_accumulation_steps}"
    )
    if not mid_epoch:
        warnings.warn(
            f"Resuming {directory}: it was {change}. It was saved at an epoch boundary, so the run continues "
            f"with the next epoch; step counts and schedules now follow the new settings.",
            stacklevel=6,
        )
        return None
    mapped = _map_saved_position(objects, directory, manifest, state, saved, now, change)
    warnings.warn(
        f"Resuming {directory} mid-epoch: it was {change}. {mapped.consumed} samples of epoch "
        f"{manifest['epoch'] + 1}'s order were seen; the rest of the epoch visits each of the others once, in "
        f"batches of the new settings (docs: 'Resuming on another number of processes'). Step counters and "
        f"the scheduler carry on; results are close to, not bitwise equal to, an uninterrupted run's.",
        stacklevel=6,
    )
    return mapped


def _map_saved_position(
    objects: TrainingObjects,
    directory: Path,
    manifest: dict[str, Any],
    state: dict[str, Any],
    saved: reshard.BatchSettings,
    now: reshard.BatchSettings,
    change: str,
) -> MappedPosition:
    """The position on this run's settings of a state saved mid-epoch on ``saved`` (the same
    samples of the epoch's global order seen), or a ValueError saying why there is none.

    Without the Trainer's shuffle sampler, only a change that keeps the samples per batch index
    (processes x per-device batch) and the accumulation maps: to the same batch."""
    config, sampler, accelerator = objects.run_config, objects.train_sampler, objects.accelerator
    assert config is not None
    skipped = int(state.get("samples_skipped") or 0)
    reason = None
    if sampler is None:
        dataset = objects.train_dataset
        reason = reshard.unmappable_loader_reason(config.train_dl_kwargs, dataset, is_map_style(dataset))
    elif accelerator.split_batches or accelerator.dispatch_batches:
        reason = "accelerate's split_batches or dispatch_batches is set, so processes do not take whole batches in turn"
    if reason is not None or sampler is None:
        if not skipped and (saved.global_batch, saved.gradient_accumulation_steps) == (
            now.global_batch,
            now.gradient_accumulation_steps,
        ):
            return MappedPosition(manifest["batch_index"] * saved.global_batch, manifest["batch_index"], 0)
        raise ValueError(
            f"Cannot resume {directory} mid-epoch on other settings (it was {change}): {reason}, so the "
            f"saved position does not map onto this run. Resume with the saved settings ({saved.describe()}), "
            f"or from a state saved at the end of an epoch (SaveTrainingStateCallback's epoch_<E> states)."
        )
    num_samples = sampler.num_samples
    reshard.check_same_training_set(state, manifest, num_samples, saved, directory)
    # The epoch's training was done (saved at its last batch, or during its evaluation).
    done = manifest["batch_index"] >= (manifest.get("num_batches_per_epoch") or math.inf) or bool(
        state.get("epoch_trained")
    )
    consumed = (
        num_samples if done else min(num_samples, skipped + manifest["batch_index"] * saved.global_batch)
    )
    return reshard.map_position(consumed, now, num_samples, batches_per_epoch(objects.train_dataloader))


def adopt_run_settings(
    objects: TrainingObjects, manifest: dict[str, Any], mapped: MappedPosition | None
) -> None:
    """After a resume's position is restored: continue at ``mapped`` (see :mod:`.reshard`),
    and let the loss weighting find its unit again when the per-device batch size changed."""
    window, sampler, config = objects.loop_state.window, objects.train_sampler, objects.run_config
    if (
        window is not None
        and config is not None
        and manifest.get("per_device_batch_size") != config.train_per_device_batch_size
    ):
        window.unit = None
    if mapped is not None:
        objects.progress.batch_index = mapped.batch_index
        if sampler is not None:
            sampler.skip_in_epoch(objects.progress.epoch, mapped.skip)
