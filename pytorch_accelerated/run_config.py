"""The state of a run, in explicit objects, each holding one kind of thing.

- :class:`TrainerRunConfig`: the settings of one training run, frozen when it starts;
- :class:`RunProgress`: where the run is (epoch, optimizer step, batch), public;
- :class:`RunIdentity`: which run this is (its id, its earlier ``train()`` calls' updates, the
  history epoch it started at), recorded by its training states;
- :class:`LoopState`: the loop's own working state (running losses, accumulation weighting, step
  metrics, the epoch's phase, where ``max_num_train_steps`` cut an epoch short: :class:`CutShort`).

The training loader's shuffle sampler is the loaders' (:class:`~.loaders.TrainerLoaders`), and the exit
code of a stop by a signal travels with its :class:`~.callbacks.StopTrainingError`.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .data import loader_batch_size
from .run_history import LossTracker
from .step_metrics import StepMetrics

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ._internal.accumulation import WindowWeighting


@dataclass(frozen=True)
class TrainerRunConfig:
    """The settings of one training run, fixed when ``train()`` starts.

    Step counts are optimizer updates. An update happens on every process at once, so
    ``num_update_steps_per_epoch`` and ``max_num_train_steps`` are the same number whether the
    run uses one process or many; ``num_local_update_steps_per_epoch`` is kept for
    compatibility and equals ``num_update_steps_per_epoch``.
    ``train_total_batch_size`` is the number of samples that go into one update across all
    processes (per-device batch x processes x accumulation steps).

    ``max_num_train_steps`` is the limit passed to ``train()`` or, when none was, the run's
    length ``num_epochs x num_update_steps_per_epoch`` (as in 0.1.61, without its extra step);
    ``train_steps_limit`` is the limit the run stops at (None: after ``num_epochs``).
    ``train_dl_kwargs`` / ``eval_dl_kwargs`` are the loaders' arguments: the defaults with the
    ``*_dataloader_kwargs`` passed to ``train()`` merged over them.

    ``evaluate()`` on a Trainer that has not trained sets a config with ``evaluation_only``
    True: one epoch, no updates (``num_update_steps_per_epoch`` and ``max_num_train_steps``
    None), the evaluation's batch size and loader arguments for both loaders.

    When the training set is a stream of unknown length (an ``IterableDataset`` without
    ``__len__``), ``num_update_steps_per_epoch`` is None (an epoch is one pass over the stream)
    and, with ``max_num_train_steps``, ``num_epochs`` is only an upper bound (that many passes).
    """

    num_epochs: int
    train_per_device_batch_size: int
    train_dl_kwargs: dict[str, Any]
    eval_per_device_batch_size: int
    eval_dl_kwargs: dict[str, Any]
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    train_total_batch_size: int
    eval_total_batch_size: int
    num_update_steps_per_epoch: int | None
    num_local_update_steps_per_epoch: int | None
    max_num_train_steps: int | None
    is_local_process_zero: bool
    is_world_process_zero: bool
    is_distributed: bool
    mixed_precision: str
    num_processes: int
    max_grad_norm: float | None = None
    seed: int | None = None
    train_steps_limit: int | None = None
    evaluation_only: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def for_run(
        cls,
        accelerator: Accelerator,
        *,
        num_batches_per_epoch: int | None,
        per_device_batch_size: int,
        num_epochs: int,
        gradient_accumulation_steps: int,
        max_num_train_steps: int | None,
        gradient_clip_value: float | None,
        max_grad_norm: float | None,
        train_dl_kwargs: dict[str, Any] | None,
        eval_dl_kwargs: dict[str, Any] | None,
        seed: int | None,
    ) -> TrainerRunConfig:
        """The config of a run with these settings, on ``accelerator``'s processes, over a
        training loader of ``num_batches_per_epoch`` batches per process.

        A ``batch_size`` in ``train_dl_kwargs`` / ``eval_dl_kwargs`` is what the loaders use, so
        it is the per-device batch size recorded (and saved with training states).
        """
        steps_per_epoch, num_epochs = _steps_and_epochs(
            num_batches_per_epoch, gradient_accumulation_steps, max_num_train_steps, num_epochs
        )
        processes = accelerator.num_processes
        train_batch_size, eval_batch_size = (
            loader_batch_size(kwargs, per_device_batch_size) for kwargs in (train_dl_kwargs, eval_dl_kwargs)
        )
        return cls(
            num_epochs=num_epochs,
            train_per_device_batch_size=train_batch_size,
            train_dl_kwargs=dict(train_dl_kwargs or {}),
            eval_per_device_batch_size=eval_batch_size,
            eval_dl_kwargs=dict(eval_dl_kwargs or {}),
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_clip_value=gradient_clip_value,
            train_total_batch_size=train_batch_size * processes * gradient_accumulation_steps,
            eval_total_batch_size=eval_batch_size * processes,
            num_update_steps_per_epoch=steps_per_epoch,
            num_local_update_steps_per_epoch=steps_per_epoch,
            max_num_train_steps=_reported_max_steps(max_num_train_steps, num_epochs, steps_per_epoch),
            train_steps_limit=max_num_train_steps,
            **_process_fields(accelerator),
            max_grad_norm=max_grad_norm,
            seed=seed,
        )

    @classmethod
    def for_evaluation(
        cls,
        accelerator: Accelerator,
        *,
        per_device_batch_size: int,
        eval_dl_kwargs: dict[str, Any] | None,
        seed: int | None,
    ) -> TrainerRunConfig:
        """The config of an evaluation run (``evaluate()`` on a Trainer that has not trained): that of
        a one-epoch run without updates, batching by the evaluation loader's batch size."""
        batch_size = loader_batch_size(eval_dl_kwargs, per_device_batch_size)
        return replace(
            cls.for_run(
                accelerator,
                num_batches_per_epoch=None,
                per_device_batch_size=batch_size,
                num_epochs=1,
                gradient_accumulation_steps=1,
                max_num_train_steps=None,
                gradient_clip_value=None,
                max_grad_norm=None,
                train_dl_kwargs=None,
                eval_dl_kwargs=eval_dl_kwargs,
                seed=seed,
            ),
            evaluation_only=True,
        )


def _steps_and_epochs(
    num_batches: int | None, accumulation: int, max_num_train_steps: int | None, num_epochs: int
) -> tuple[int | None, int]:
    """Updates per epoch (None for a stream of unknown length) and the number of epochs."""
    steps_per_epoch = None if num_batches is None else math.ceil(num_batches / accumulation)
    # Over a stream, every epoch (one pass) makes at least one update: a bound.
    return steps_per_epoch, (
        num_epochs if max_num_train_steps is None else math.ceil(max_num_train_steps / (steps_per_epoch or 1))
    )


def _reported_max_steps(given: int | None, num_epochs: int, steps_per_epoch: int | None) -> int | None:
    """The limit given, else the run's length in updates (None over a stream of unknown length)."""
    return given if given is not None or steps_per_epoch is None else num_epochs * steps_per_epoch


def _process_fields(accelerator: Accelerator) -> dict[str, Any]:
    """The fields of a run config that describe the processes and precision of ``accelerator``."""
    return {
        "is_local_process_zero": accelerator.is_local_main_process,
        "is_world_process_zero": accelerator.is_main_process,
        "is_distributed": accelerator.num_processes > 1,
        "mixed_precision": str(accelerator.mixed_precision),
        "num_processes": accelerator.num_processes,
    }


@dataclass
class RunProgress:
    """Where a training run is. Updated by the Trainer only; read it anywhere.

    Attributes:
        epoch: the epoch being run, counted from 0 (``run_history.current_epoch`` is the same
            epoch counted from 1); once an epoch's last event has fired, the next one.
        global_step: optimizer updates completed since the start of the run (an update that
            fp16's gradient scaler skipped is not counted, here or in ``epoch_step``).
        batch_index: batches of the current epoch fully processed by this process.
        epoch_step: optimizer updates completed in the current epoch.
    """

    epoch: int = 0
    global_step: int = 0
    batch_index: int = 0
    epoch_step: int = 0

    def state_dict(self) -> dict[str, int]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, int]) -> None:
        for key, value in state.items():
            setattr(self, key, int(value))

    def start_next_epoch(self) -> None:
        """Move to the start of the next epoch."""
        self.epoch, self.batch_index, self.epoch_step = self.epoch + 1, 0, 0


@dataclass
class RunIdentity:
    """Which run this is, across its ``train()`` calls and resumes; each ``train()`` that starts a new
    run makes a new one. Training states record it (:meth:`state_dict`; the manifest, ``run_id`` and
    ``run_step``), so that a folder's states tell their runs apart.

    Attributes:
        run_id: the run's id: new for each run; kept by a ``train()`` call that keeps the run
            history, and by a resumed run (the id of the state it resumes).
        steps_before: optimizer updates of the run's earlier ``train()`` calls (those that kept
            the history): ``steps_before + progress.global_step`` counts the run's updates.
        history_first_epoch: ``run_history.current_epoch`` at the start of this run's first epoch
            (1 unless the history of an earlier run was kept); the history's epoch follows
            ``progress.epoch`` from there.
        asked_accumulation: the ``gradient_accumulation_steps`` given to ``train()`` (the run's
            own may differ: ``resume_from="auto"`` keeps a state's global batch); states record it.
        stage: which ``train()`` call of the Trainer this is, from 1 (its stage); states record
            it, so that ``resume_from="auto"`` resumes each call of a script with several from its
            own states. Set by each call, never loaded from a state.
    """

    run_id: str = field(default_factory=lambda: f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}")
    steps_before: int = 0
    history_first_epoch: int = 1
    asked_accumulation: int | None = None
    stage: int = 1

    def run_step(self, progress: RunProgress) -> int:
        """The run's optimizer updates so far, over its ``train()`` calls."""
        return self.steps_before + progress.global_step

    def origin(self, progress: RunProgress) -> dict[str, Any]:
        """Where the run is, as a failure record of ``resume_from="auto"`` names where a run started:
        its id, update over its ``train()`` calls, and stage."""
        return {"run_id": self.run_id, "update": self.run_step(progress), "stage": self.stage}

    def state_dict(self) -> dict[str, Any]:
        return {
            "history_first_epoch": self.history_first_epoch,
            "run_id": self.run_id,
            "stage": self.stage,
            "steps_before": self.steps_before,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history_first_epoch = int(state.get("history_first_epoch", 1))
        self.run_id = str(state.get("run_id", self.run_id))  # a state of an older version: this run's
        self.steps_before = int(state.get("steps_before", 0))


@dataclass(frozen=True)
class CutShort:
    """The run as ``max_num_train_steps`` left it when it ended the run before the last batch of an
    epoch: at that update, before the epoch's metrics, evaluation and end events ran. Every training
    state saved after it records this (not the next epoch, where the loop moves on): a relaunch with a
    larger limit continues the epoch from there, as a longer run would have gone on.

    Attributes:
        position: :class:`RunProgress`'s ``state_dict()`` at the cut.
        run_history: the run history's ``state_dict()`` at the cut (without the cut epoch's
            ``train_loss_epoch`` and evaluation, which the continued run records for the whole epoch).
        rng_states: this process's RNG states at the cut (the evaluation after it draws from them).
    """

    position: dict[str, int]
    run_history: dict[str, Any]
    rng_states: dict[str, Any]


@dataclass
class LoopState:
    """The loop's own working state during a run; each ``train()`` starts a new one. Not meant to be
    changed from outside the Trainer; training states save it through :meth:`state_dict` (what
    every process shares) and :meth:`process_state_dict` (what is each process's own).

    Attributes:
        train_loss: this process's running training loss of the current epoch.
        eval_loss: this process's running loss of the current evaluation epoch.
        last_eval_loss: the mean loss of the last evaluation epoch, over every process.
        window: how batches of an accumulation window are weighted (its unit is saved).
        step_metrics: the step-level metrics asked for by callbacks (see :mod:`.step_metrics`).
        epoch_trained: the current epoch's training part (with ``on_train_epoch_end``) is done;
            a state saved during its evaluation resumes with that evaluation.
        epoch_finished: the current epoch's last event has fired: a state saved now resumes at
            the start of the next epoch.
        cut_short: where ``max_num_train_steps`` ended the run before the last batch of an epoch
            (None: it did not); states saved after the cut record the run as it was there.
    """

    train_loss: LossTracker = field(default_factory=LossTracker)
    eval_loss: LossTracker = field(default_factory=LossTracker)
    last_eval_loss: float = math.nan
    window: WindowWeighting | None = None
    step_metrics: StepMetrics = field(default_factory=StepMetrics)
    epoch_trained: bool = False
    epoch_finished: bool = False
    cut_short: CutShort | None = None

    def state_dict(self) -> dict[str, Any]:
        """What every process shares: the loss weighting unit, and whether the epoch's training was done."""
        return {
            "loss_weight_unit": self.window.unit if self.window is not None else None,
            # Saved during the epoch's evaluation: a resumed run evaluates, without training again
            # (unless the limit cut the epoch's training short: a longer run trains the rest).
            "epoch_trained": self.epoch_trained and not self.epoch_finished and self.cut_short is None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.window is not None:
            self.window.unit = state["loss_weight_unit"]
        self.epoch_trained = bool(state.get("epoch_trained", False))

    def process_state_dict(self, mid_epoch: bool) -> dict[str, Any]:
        """This process's own share: its part of the epoch's training loss so far (mid-epoch), and
        of the loss since the last step-metrics point."""
        loss = self.train_loss
        return {
            "train_loss": {"total": loss.running_total, "count": loss.count} if mid_epoch else None,
            "step_metrics": self.step_metrics.process_state_dict(loss.running_total, loss.count),
        }

    def load_process_state_dict(self, state: dict[str, Any], device: Any) -> None:
        loss = self.train_loss
        loss.reset()
        if (partial := state["train_loss"]) is not None:
            total = partial["total"]
            loss.running_total = total.to(device) if hasattr(total, "to") else total
            loss.count = partial["count"]
        self.step_metrics.load_process_state_dict(
            state.get("step_metrics"), loss.running_total, loss.count, device
        )
