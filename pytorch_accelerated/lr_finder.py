"""The learning-rate range test behind :meth:`Trainer.find_learning_rate
<pytorch_accelerated.trainer.Trainer.find_learning_rate>`.

The test is a real ``trainer.train(...)`` of ``num_steps`` optimizer updates: the Trainer's own
loaders, accumulation, overridable batch-loss and step methods and distribution run it. Three
things differ from a training run:

- the learning rate of every param group rises exponentially from ``start_lr`` to ``end_lr``, one
  value per update (:class:`ExponentialRangeSchedule`, in place of ``create_scheduler_fn``);
- only :class:`RangeTestRecorder` (and the Trainer's own ``MoveModulesToDeviceCallback`` instances,
  which place the loss function's modules) observe the run: none of the user's other callbacks is
  told of it, so nothing saves a state, logs to a tracker, draws a bar or writes the run history;
- the recorder reads each update's loss, averaged over every process, every
  :data:`CHECK_EVERY_N_UPDATES` updates (one collective call and one device read for those
  updates), and stops the run when the smoothed loss diverges.

Everything the run changes is put back afterwards (:class:`TrainerSnapshot`): the weights, buffers,
gradients and train/eval modes of the model, the optimizer's state and hyper-parameters, the
scheduler, the RNG streams, the run history, the callbacks and the run's objects (config, progress,
loaders), so a ``train()`` after the test is the ``train()`` without it, bit for bit.
"""

from __future__ import annotations

import copy
import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate.utils import DistributedType

from ._internal.argument_checks import check_whole_number
from .callbacks import CallbackHandler, MoveModulesToDeviceCallback, StopTrainingError, TrainerCallback
from .callbacks.plotting import checked_png_path, new_figure, require_matplotlib, write_png
from .checkpoints.rng import capture_rng_states, restore_rng_states
from .run_history import InMemoryRunHistory
from .schedulers.base import StatefulSchedulerBase

if TYPE_CHECKING:
    import os

    from .trainer import Trainer

__all__ = [
    "find_learning_rate",
    "LRFinderResult",
    "RangeTestSettings",
    "ExponentialRangeSchedule",
    "suggest_learning_rate",
]

#: The run stops once the smoothed loss exceeds this many times its lowest value so far (fastai's
#: and Lightning's factor).
DIVERGENCE_FACTOR = 4.0
#: The weight of the past in the exponential moving average of the loss (fastai's and Lightning's).
SMOOTHING = 0.98
#: The suggestion is the learning rate at the lowest smoothed loss divided by this (fastai's "minimum").
SUGGESTION_DIVISOR = 10.0
#: Updates between two reads of the losses (and divergence checks): the other updates read nothing.
CHECK_EVERY_N_UPDATES = 10
#: Distributed set-ups whose model or optimizer state the test cannot put back by itself.
REFUSED = {DistributedType.DEEPSPEED: "DeepSpeed", DistributedType.FSDP: "FSDP"}


def exponential_rate(start_lr: float, end_lr: float, num_steps: int, update: int) -> float:
    """The learning rate of update ``update`` (from 0) of ``num_steps`` rising from ``start_lr`` to ``end_lr``."""
    return float(start_lr * (end_lr / start_lr) ** (update / (num_steps - 1)))


class ExponentialRangeSchedule(StatefulSchedulerBase):
    """Sets the learning rate of every param group to ``start_lr * (end_lr / start_lr) ** (k / (num_steps - 1))``
    for update ``k`` (counted from 0): ``start_lr`` for the first update, ``end_lr`` for the last.

    Stepped as any scheduler of the Trainer: ``step()`` after each update, or ``step_update(n)``
    (``TrainerWithTimmScheduler``); timm's per-epoch ``step(epoch=...)`` leaves the rate alone.

    >>> model = torch.nn.Linear(2, 1)
    >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    >>> schedule = ExponentialRangeSchedule(optimizer, start_lr=1e-3, end_lr=1.0, num_steps=4)
    >>> rates = [round(schedule.rate(k), 6) for k in range(4)]
    >>> rates
    [0.001, 0.01, 0.1, 1.0]
    >>> group = optimizer.param_groups[0]
    >>> group["lr"]  # the first update's rate, set at construction
    0.001
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, start_lr: float, end_lr: float, num_steps: int
    ) -> None:
        self.start_lr, self.end_lr, self.num_steps = start_lr, end_lr, num_steps
        super().__init__(optimizer)

    def rate(self, update: int) -> float:
        """The learning rate of update ``update`` (counted from 0)."""
        return exponential_rate(self.start_lr, self.end_lr, self.num_steps, update)

    def get_updated_values(self, num_updates: int) -> float:
        return self.rate(min(num_updates, self.num_steps - 1))

    def step(self, epoch: int | None = None, metric: Any = None) -> None:
        if epoch is None:  # (timm's step(epoch, metric) after each epoch: the rate follows updates only)
            super().step()


def suggest_learning_rate(learning_rates: list[float], smoothed_losses: list[float]) -> float:
    """The learning rate at the lowest smoothed loss, divided by 10 (fastai's "minimum" rule): at
    the lowest point the rate is already near the edge of stability, a tenth of it still trains
    fast. (The other common rule, the steepest descent of the smoothed loss, is easily set off by
    the noise of the first batches, whose average rests on few samples.) NaN when the loss never fell below its first value
    (``start_lr`` is already too high), with a warning that says so.

    >>> suggest_learning_rate([0.001, 0.01, 0.1, 1.0, 10.0], [2.0, 1.9, 1.0, 0.9, 5.0])
    0.1
    """
    finite = [loss if math.isfinite(loss) else math.inf for loss in smoothed_losses]
    lowest = int(np.argmin(finite)) if finite else 0
    if lowest == 0:
        warnings.warn(
            f"find_learning_rate: the smoothed loss never fell below its first value ({len(finite)} "
            f"updates from lr {learning_rates[0] if learning_rates else math.nan:.3g}), so there is no "
            f"descent to suggest a learning rate from (suggestion: nan). Pass a lower start_lr.",
            stacklevel=3,
        )
        return math.nan
    return learning_rates[lowest] / SUGGESTION_DIVISOR


@dataclass(frozen=True)
class LRFinderResult:
    """What :meth:`Trainer.find_learning_rate <pytorch_accelerated.trainer.Trainer.find_learning_rate>` found.

    Attributes:
        learning_rates: the learning rate of each update, rising exponentially.
        losses: the training loss of each update (the mean over every sample, or item, of its
            accumulation window on every process), one entry per update.
        smoothed_losses: ``losses`` smoothed by an exponential moving average (weight
            ``smoothing`` on the past, debiased: divided by ``1 - smoothing ** (k + 1)`` so that the
            first values are not pulled towards 0), what the suggestion and the divergence check read.
        suggestion: the learning rate at the lowest smoothed loss divided by 10
            (:func:`suggest_learning_rate`); NaN if the loss never fell.
        diverged: True when the test stopped early because the smoothed loss exceeded
            ``divergence_factor`` times its lowest value (or a loss was not finite); the diverged
            update is the last entry.
    """

    learning_rates: list[float]
    losses: list[float]
    smoothed_losses: list[float] = field(repr=False)
    suggestion: float
    diverged: bool

    def plot(self, path: str | os.PathLike = "lr_finder.png", *, dpi: int = 100) -> Path:
        """Write a PNG of the loss (raw and smoothed) against the learning rate on a log scale, the
        suggestion marked, written atomically (as ``PlotRunCallback`` writes the run's picture);
        return its path. Writes wherever it is called: on several processes, call it on one
        (``if trainer.is_world_process_zero``).

        Raises:
            ImportError: if matplotlib is not installed.
            ValueError: if ``path`` does not end in ``.png`` or lies under a file.
            OSError: if the file cannot be written.
        """
        require_matplotlib("LRFinderResult.plot")
        png = checked_png_path(path, "LRFinderResult.plot")
        figure = new_figure(6.0, 4.0)
        axes = figure.add_subplot(1, 1, 1)
        axes.plot(self.learning_rates, self.losses, color="0.7", linewidth=1, label="loss")
        axes.plot(self.learning_rates, self.smoothed_losses, linewidth=1.5, label="smoothed loss")
        if math.isfinite(self.suggestion):
            axes.axvline(
                self.suggestion, color="tab:red", linestyle="--", label=f"suggestion {self.suggestion:.3g}"
            )
        axes.set(
            xscale="log", xlabel="learning rate", ylabel="training loss", title="learning-rate range test"
        )
        finite = [loss for loss in self.smoothed_losses if math.isfinite(loss)]
        if finite:  # the descent fills the panel, not the diverged end
            lowest = finite.index(min(finite))
            low = min(loss for loss in [*self.losses[: lowest + 1], finite[lowest]] if math.isfinite(loss))
            high = max(finite[: lowest + 1])
            axes.set_ylim(low - 0.1 * (high - low + 1e-12), high + 0.5 * (high - low + 1e-12))
        axes.grid(alpha=0.3)
        axes.legend(fontsize="small")
        write_png(figure, png, dpi, {"Suggestion": repr(self.suggestion)})
        return png


class RangeTestRecorder(TrainerCallback):
    """Records the loss of each update of a range test, reading it every
    :data:`CHECK_EVERY_N_UPDATES` updates, and stops the run (``StopTrainingError``) once it diverges.

    Each batch's loss is the loop's own detached copy (``loop_state.train_loss.loss_value``) and its
    weight the loop's (``loop_state.window.weight_of``): a batch costs no device operation. The
    losses read are summed over every process, the same on each, so every process stops at the
    same update.
    """

    def __init__(self, schedule_rate: Any, divergence_factor: float | None, smoothing: float) -> None:
        self.schedule_rate, self.divergence_factor, self.smoothing = (
            schedule_rate,
            divergence_factor,
            smoothing,
        )
        self.losses: list[float] = []
        self.smoothed_losses: list[float] = []
        self.diverged = False
        self._average = 0.0  # the moving average, before debiasing
        self._window: list[tuple[Any, Any]] = []  # (loss, weight) of the batches of the open window
        self._windows: list[list[tuple[Any, Any]]] = []  # updates not read yet

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._window = []  # (a last window of the epoch that fp16's scaler skipped made no update)

    def on_train_step_end(
        self,
        trainer: Trainer,
        batch: Any = None,
        batch_output: dict[str, Any] | None = None,
        step: int | None = None,
        *,
        is_update_step: bool = False,
        **kwargs: Any,
    ) -> None:
        loop_state, config = trainer.loop_state, trainer.run_config
        assert (
            loop_state.window is not None and config is not None and batch_output is not None
        )  # set by train()
        # The loop's detached copy of this batch's loss and its weight: no device operation here.
        self._window.append((loop_state.train_loss.loss_value, loop_state.window.weight_of(batch_output)))
        if is_update_step:
            self._windows.append(self._window)
            self._window = []
            if len(self._windows) == CHECK_EVERY_N_UPDATES:
                self._read(trainer)
        elif len(self._window) == config.gradient_accumulation_steps:
            self._window = []  # a full window without an update: fp16's scaler skipped it

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self._windows:  # every process ends here together: the last read is collective too
            self._read(trainer)

    def _read(self, trainer: Trainer) -> None:
        windows, self._windows = self._windows, []
        for loss in window_losses(trainer.accelerator, windows):
            if self._add(loss):
                self.diverged = True
                raise StopTrainingError(
                    f"the learning-rate range test ends at update {len(self.losses)} (lr "
                    f"{self.schedule_rate(len(self.losses) - 1):.3g}): the loss diverged ({loss:.4g})"
                )

    def _add(self, loss: float) -> bool:
        """Record the next update's ``loss``; True if the loss diverges there."""
        self.losses.append(loss)
        self._average = self.smoothing * self._average + (1 - self.smoothing) * loss
        self.smoothed_losses.append(self._average / (1 - self.smoothing ** len(self.losses)))
        if not math.isfinite(loss):
            return True
        factor = self.divergence_factor
        return factor is not None and self.smoothed_losses[-1] > factor * min(self.smoothed_losses)

    def result(self) -> LRFinderResult:
        rates = [self.schedule_rate(update) for update in range(len(self.losses))]
        suggestion = suggest_learning_rate(rates, self.smoothed_losses)
        return LRFinderResult(rates, list(self.losses), list(self.smoothed_losses), suggestion, self.diverged)


def window_losses(accelerator: Any, windows: list[list[tuple[Any, Any]]]) -> list[float]:
    """The mean loss of each accumulation window over every process: ``sum(loss * weight) /
    sum(weight)`` of its batches, summed over the processes with one collective call and read with
    one device-to-host copy (a handful of device operations for all the windows)."""
    device = accelerator.device
    batches = [batch for window in windows for batch in window]
    losses = torch.stack([loss for loss, _ in batches]).reshape(len(batches)).double()
    weights = [weight for _, weight in batches]
    if all(isinstance(weight, (int, float)) for weight in weights):  # samples: host numbers
        weight_tensor = torch.tensor(weights, dtype=torch.float64, device=device)
    else:  # num_items_in_batch: device counts
        weight_tensor = torch.stack([torch.as_tensor(w, device=device).reshape(()) for w in weights]).double()
    sums = torch.stack([losses * weight_tensor, weight_tensor])
    if len(batches) > len(windows):  # accumulation: add up each window's batches
        owners = torch.tensor([index for index, window in enumerate(windows) for _ in window], device=device)
        sums = torch.zeros(2, len(windows), dtype=torch.float64, device=device).index_add_(1, owners, sums)
    if accelerator.num_processes > 1:
        sums = accelerator.reduce(sums, reduction="sum")
    totals, counts = sums.tolist()
    return [total / count if count else math.nan for total, count in zip(totals, counts, strict=True)]


class TrainerSnapshot:
    """What a range test's ``train()`` changes on ``trainer``, taken before it and put back by :meth:`restore`.

    The model keeps its prepared (wrapped) form, as a ``train()`` would leave it; its weights,
    buffers, gradients and train/eval modes are put back in place, so the optimizer still holds
    the same parameters.
    """

    #: The Trainer's attributes that ``train()`` replaces, put back as they were.
    ATTRIBUTES = (
        "scheduler",
        "create_scheduler_fn",
        "collate_fn",
        "train_dataset",
        "eval_dataset",
        "run_config",
        "progress",
        "run_identity",
        "loop_state",
        "last_grad_norm",
        "run_history",
        "callback_handler",
        "_train_calls",  # the test is no stage of the script (resume_from="auto")
    )

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.attributes = {name: getattr(trainer, name) for name in self.ATTRIBUTES}
        self.loaders = dict(vars(trainer.loaders))
        self.model = trainer.model
        self.tensors = _tensors_of(trainer.model)
        self.modes = [(module, module.training) for module in trainer.model.modules()]
        self.optimizer = copy.deepcopy(trainer.optimizer.state_dict())  # type: ignore[union-attr]
        self.rng = capture_rng_states()

    def train_observed_by(self, recorder: RangeTestRecorder, train_dataset: Any, **arguments: Any) -> None:
        """``trainer.train(train_dataset, num_epochs=1, **arguments)`` (the run's epochs follow from
        ``max_num_train_steps``), observed by ``recorder`` and the Trainer's callbacks that place modules
        on the device only, with a history of its own; then everything is put back (:meth:`restore`)."""
        trainer = self.trainer
        callbacks = trainer.callback_handler.callbacks
        placing = [callback for callback in callbacks if isinstance(callback, MoveModulesToDeviceCallback)]
        try:
            trainer.callback_handler = CallbackHandler([*placing, recorder])
            trainer.run_history = InMemoryRunHistory()
            trainer.train(train_dataset, num_epochs=1, **arguments)
        finally:
            self.restore()

    def restore(self) -> None:
        trainer = self.trainer
        with torch.no_grad():
            for tensor, (value, grad) in self.tensors.items():
                tensor.copy_(value)
                tensor.grad = grad
        for module, training in self.modes:
            module.training = training
        trainer.optimizer.load_state_dict(self.optimizer)  # type: ignore[union-attr]
        vars(trainer.loaders).update(self.loaders)
        for name, value in self.attributes.items():
            setattr(trainer, name, value)
        restore_rng_states(self.rng)


def _tensors_of(model: torch.nn.Module) -> dict[torch.Tensor, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every parameter and buffer of ``model`` (also non-persistent buffers, which a state dict
    leaves out), with a copy of its value and of its gradient."""
    tensors = [*model.parameters(), *model.buffers()]
    return {
        tensor: (tensor.detach().clone(), None if tensor.grad is None else tensor.grad.detach().clone())
        for tensor in tensors
    }


@dataclass(frozen=True)
class RangeTestSettings:
    """The settings of one range test, as :meth:`Trainer.find_learning_rate
    <pytorch_accelerated.trainer.Trainer.find_learning_rate>` takes them (its docstring says what each
    means), checked when made: a value out of range raises ``ValueError`` naming it, the value and
    what is allowed."""

    per_device_batch_size: int = 8
    start_lr: float = 1e-7
    end_lr: float = 10.0
    num_steps: int = 100
    gradient_accumulation_steps: int = 1
    collate_fn: Callable[..., Any] | None = None
    train_dataloader_kwargs: dict[str, Any] | None = None
    divergence_factor: float | None = DIVERGENCE_FACTOR
    smoothing: float = SMOOTHING
    gradient_clip_value: float | None = None
    max_grad_norm: float | None = None
    seed: int | None = 42

    def __post_init__(self) -> None:
        for name in ("start_lr", "end_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ValueError(f"find_learning_rate: {name} must be a finite number > 0, got {value!r}.")
        if not self.end_lr > self.start_lr:
            raise ValueError(
                f"find_learning_rate: end_lr must be greater than start_lr (the rate rises from one to the "
                f"other), got start_lr={self.start_lr!r} and end_lr={self.end_lr!r}."
            )
        check_whole_number(
            self.num_steps,
            "num_steps",
            minimum=2,
            owner="find_learning_rate",
            hint="It is the number of updates.",
        )
        factor, smoothing = self.divergence_factor, self.smoothing
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 < factor < math.inf
        ):
            raise ValueError(
                f"find_learning_rate: divergence_factor must be a finite number > 1 (stop once the smoothed "
                f"loss exceeds that many times its lowest value) or None (never stop early), got {factor!r}."
            )
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0 <= smoothing < 1:
            raise ValueError(
                f"find_learning_rate: smoothing must be a number from 0 (no smoothing) up to but not "
                f"including 1, got {smoothing!r}."
            )

    def train_arguments(self) -> dict[str, Any]:
        """The arguments of ``train()`` that the range test passes on as it was given them."""
        return {
            "per_device_batch_size": self.per_device_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "gradient_clip_value": self.gradient_clip_value,
            "train_dataloader_kwargs": self.train_dataloader_kwargs,
            "collate_fn": self.collate_fn,
            "max_grad_norm": self.max_grad_norm,
            "seed": self.seed,
        }


def find_learning_rate(trainer: Trainer, train_dataset: Any, settings: RangeTestSettings) -> LRFinderResult:
    """What :meth:`Trainer.find_learning_rate <pytorch_accelerated.trainer.Trainer.find_learning_rate>`
    does with its checked ``settings``: the range test through ``trainer``'s own ``train()``, observed by
    a :class:`RangeTestRecorder`, everything it changes put back by a :class:`TrainerSnapshot`."""
    _refuse_unsupported(trainer.accelerator)
    start_lr, end_lr, num_steps = float(settings.start_lr), float(settings.end_lr), settings.num_steps
    rate = functools.partial(exponential_rate, start_lr, end_lr, num_steps)
    factor = None if settings.divergence_factor is None else float(settings.divergence_factor)
    recorder = RangeTestRecorder(rate, factor, float(settings.smoothing))
    schedule = functools.partial(
        ExponentialRangeSchedule, start_lr=start_lr, end_lr=end_lr, num_steps=num_steps
    )
    TrainerSnapshot(trainer).train_observed_by(
        recorder,
        train_dataset,
        max_num_train_steps=num_steps,
        create_scheduler_fn=schedule,
        **settings.train_arguments(),
    )
    result = recorder.result()
    trainer.print(_summary(result, start_lr, end_lr, num_steps))
    return result


def _summary(result: LRFinderResult, start_lr: float, end_lr: float, num_steps: int) -> str:
    ended = (
        f"the loss diverged at update {len(result.losses)} (lr {result.learning_rates[-1]:.3g})"
        if result.diverged
        else f"{len(result.losses)} updates"
    )
    return (
        f"Learning-rate range test from {start_lr:.3g} to {end_lr:.3g} over {num_steps} updates: {ended}; "
        f"suggestion {result.suggestion:.3g}"
    )


def _refuse_unsupported(accelerator: Any) -> None:
    refused = REFUSED.get(accelerator.distributed_type)
    if refused is not None:
        raise ValueError(
            f"find_learning_rate cannot run under {refused}: its engine holds the model's and the "
            f"optimizer's state, which the range test must put back afterwards. Run the range test "
            f"without {refused} (e.g. on one process), then train under it."
        )
