"""The five callbacks every Trainer gets unless told otherwise, and how printed metrics look
(:func:`format_metric_value`, for any callback that prints or logs a metric)."""

from __future__ import annotations

import math
import numbers
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .._internal.argument_checks import check_whole_number
from .._internal.intervals import every
from ..checkpoints.finite import non_finite_loss_flag
from ..data import batches_per_epoch
from .events import StopTrainingError, TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer


class MoveModulesToDeviceCallback(TrainerCallback):
    """Move every ``nn.Module`` attribute of the Trainer other than the model (e.g. a loss
    function with a class-weight buffer) to the Trainer's device at the start of each run."""

    def _move_modules(self, trainer: Trainer) -> None:
        for name, value in vars(trainer).items():
            if isinstance(value, nn.Module) and name != "model" and value is not trainer.model:
                value.to(trainer.device)

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._move_modules(trainer)

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._move_modules(trainer)


class TerminateOnNaNCallback(TrainerCallback):
    """Stop training when a training loss is NaN or infinite, on every process at once.

    The Trainer already sums each batch's loss on the device, and that sum is NaN or infinite
    once any loss of the epoch was: it is the flag, kept on the device at no extra cost. Every
    ``check_every_n_steps`` optimizer updates (default 10) and at the end of each epoch, the
    processes read it and agree (one collective call and one host read; on one process just
    the read) whether any saw a non-finite loss; if so, all raise :class:`StopTrainingError` at
    the same step, so the run ends through the normal end hooks within ``check_every_n_steps``
    updates of the first non-finite loss. The other updates cost no device work and no
    device-to-host sync. Every save of weights (training states, save-best, EMA, WSD) makes the
    same check first, so a NaN never reaches a checkpoint even between two checks.

    At the end of each evaluation epoch the processes also agree whether its loss was
    non-finite (one collective call per evaluation) and, if so, stop the same way. The run then
    ends normally: unlike pytorch-accelerated 0.1.61, the process does not exit.

    Args:
        check_every_n_steps: optimizer updates between two checks; 1 checks after every
            update (a device-to-host sync per step).

    Attributes:
        triggered: True once a non-finite loss stopped the run (reset when a run starts).
    """

    def __init__(self, check_every_n_steps: int = 10) -> None:
        self.check_every_n_steps = check_whole_number(
            check_every_n_steps, "check_every_n_steps", owner="TerminateOnNaNCallback"
        )
        self.triggered = False

    def check_for_nan_after_batch(self, batch_output: dict[str, Any], step: int | None = None) -> None:
        """Raise :class:`StopTrainingError` (and set :attr:`triggered`) if ``batch_output["loss"]``
        is NaN or infinite: the check of pytorch-accelerated 0.1.61, for one batch of this
        process (a device-to-host sync; the built-in checks agree across processes instead).
        ``step`` (0.1.61's argument, e.g. the batch index ``on_train_step_end`` receives) is
        only named in the error message."""
        if not bool(torch.isfinite(torch.as_tensor(batch_output["loss"])).all()):
            self.triggered = True
            where = f" at step {step}" if step is not None else ""
            raise StopTrainingError(f"non-finite loss{where}")

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.triggered = False

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step and every(self.check_every_n_steps, trainer.progress.global_step):
            self._stop_if_non_finite(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._stop_if_non_finite(trainer)  # before the epoch's sum is reset

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        total = trainer.loop_state.eval_loss.running_total  # a sum over this process's batches
        if trainer.any_process(~torch.isfinite(torch.as_tensor(total)).all()):
            self.triggered = True
            trainer.print(
                f"A non-finite evaluation loss was seen at step {trainer.progress.global_step}; stopping."
            )
            raise StopTrainingError("non-finite evaluation loss")

    def _stop_if_non_finite(self, trainer: Trainer) -> None:
        total = trainer.loop_state.train_loss.running_total
        if (  # on one process there is nothing to agree on: one host read, no device op
            not math.isfinite(float(total))
            if trainer.accelerator.num_processes == 1
            else trainer.any_process(non_finite_loss_flag(total))
        ):
            self.triggered = True
            trainer.print(
                f"A non-finite training loss was seen by step {trainer.progress.global_step} "
                f"of epoch {trainer.progress.epoch + 1}; stopping the run."
            )
            raise StopTrainingError("non-finite training loss")


class PrintProgressCallback(TrainerCallback):
    """Print a line when a run starts and ends and when each epoch starts."""

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        config = trainer.run_config
        if config is None:  # train() sets it before this event: only a hand-made call lacks it
            return
        trainer.print(
            f"\nStarting training run: {config.num_epochs} epochs, "
            f"{config.num_update_steps_per_epoch or 'an unknown number of'} updates per epoch, "
            f"{config.num_processes} process(es)"
        )

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.print(f"\nStarting epoch {trainer.run_history.current_epoch}")

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.print("Finishing training run")

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.print("\nStarting evaluation run")

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.print("Finishing evaluation run")


def format_metric_value(value: Any) -> str:
    """Show a metric value the one way every printed metric is shown, whatever its type.

    Python floats, 0-d and 1-element tensors and numpy scalars show with 6 significant digits
    (``.6g``: ``0.198``, ``2.27405``, ``1e-07``, ``nan``, ``inf``); whole numbers (``int``,
    integer tensors) as they are; anything else with ``str()``. A tensor on a device is copied
    to the host (a sync): call this when a value is printed, not on every step.

    >>> format_metric_value(torch.tensor(0.198)), format_metric_value(2.274051), format_metric_value(7)
    ('0.198', '2.27405', '7')
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    elif type(value).__module__ == "numpy" and getattr(value, "size", None) == 1:
        value = value.item()  # a numpy scalar or 1-element array
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral):
        return str(int(value))
    return f"{float(value):.6g}"


def progress_bar_wanted(enabled: bool | None = None) -> bool:
    """Whether a progress bar should be drawn: ``enabled`` when it is True or False; otherwise
    (None, automatic) not when the ``TQDM_DISABLE`` environment variable is set (to anything but
    ``""``, ``0`` or ``false``), yes in a Jupyter notebook, else only when standard output is a
    terminal (not a pipe or a log file)."""
    if enabled is not None:
        return enabled
    if os.environ.get("TQDM_DISABLE", "").strip().lower() not in ("", "0", "false"):
        return False
    if any(cls.__module__ == "tqdm.notebook" for cls in tqdm.__mro__):  # tqdm.auto chose widgets
        return True
    isatty = getattr(sys.stdout, "isatty", None)
    return bool(isatty is not None and isatty())


@dataclass
class _EpochCounts:
    """What a bar counts on the host during an epoch: no device value is read to count."""

    label: str
    batches: int
    total: int | None
    samples: int = 0
    start: float = field(default_factory=time.perf_counter)
    next_draw: float = 0.0

    def add_batch(self, batch_output: Any) -> None:
        self.batches += 1
        size = batch_output.get("batch_size") if isinstance(batch_output, dict) else None
        if type(size) is int:  # the usual case, without the slower check of an ABC below
            self.samples += size
        elif isinstance(size, numbers.Integral):  # a tensor would need a host read: not counted
            self.samples += int(size)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def samples_per_second(self, num_processes: int) -> float:
        """Samples of every process per second: this process's count times ``num_processes``."""
        elapsed = self.elapsed()
        return self.samples * num_processes / elapsed if elapsed > 0 else 0.0

    def batches_done(self) -> str:
        return f"{self.batches}/{self.total}" if self.total is not None else str(self.batches)


def _epoch_loss(trainer: Trainer) -> Any:
    """The training loss of the epoch that just ended: the mean over every process the Trainer
    has just recorded (on the host already), else this process's running loss."""
    history = trainer.run_history
    try:
        return history.get_latest_metric(f"{history.metric_name_prefix}train_loss_epoch")
    except KeyError:  # a custom run history, or the metric deleted by a callback
        return trainer.running_loss


class ProgressBarCallback(TrainerCallback):
    """Progress of training and evaluation epochs, once per machine (each node's main process).

    On a terminal (or in a Jupyter notebook, through ``tqdm.auto``) each training epoch gets a
    tqdm bar showing the epoch, the update step (optimizer updates since the run started), the
    epoch's running loss, the learning rate (of the first parameter group) and samples per second
    (this process's samples times the number of processes). The loss and learning rate are read
    from the device only when the bar is redrawn, at most once every ``refresh_interval``
    seconds, because a read makes the host wait for the device. At the end of the epoch the bar
    is drawn once more, with its true final state (``11/11``), and left on the screen.
    Evaluation gets its own bar, removed when the evaluation ends; an evaluation during training
    (e.g. every N steps) draws below the training bar. Text printed with ``trainer.print`` goes
    above the bars.

    When standard output is not a terminal (a pipe, a log file) there is no bar: each training
    epoch ends with one summary line instead, e.g.
    ``epoch 2/5: 11/11 batches, step 22, loss 0.4321, lr 0.01, 812 samples/s, 1.3 s``.

    Args:
        enabled: True draws bars, False never does (summary lines instead); None (the default)
            decides by itself: no bar when the ``TQDM_DISABLE`` environment variable is set, a
            bar in a notebook or when standard output is a terminal (see
            :func:`progress_bar_wanted`).
        refresh_interval: the least number of seconds between two redraws of a bar.
    """

    def __init__(self, enabled: bool | None = None, refresh_interval: float = 0.1) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise TypeError(
                f"ProgressBarCallback: enabled must be True, False or None (decide by whether "
                f"standard output is a terminal), got {enabled!r}."
            )
        if (
            isinstance(refresh_interval, bool)
            or not isinstance(refresh_interval, numbers.Real)
            or not refresh_interval > 0
        ):
            raise ValueError(
                f"ProgressBarCallback: refresh_interval must be a number of seconds > 0 (e.g. 0.1), "
                f"got {refresh_interval!r}."
            )
        self.enabled: bool | None = enabled
        self.refresh_interval: float = float(refresh_interval)
        self.train_bar: Any = None
        self.eval_bar: Any = None
        self._train: _EpochCounts | None = None
        self._eval: _EpochCounts | None = None

    @property
    def pbar(self) -> Any:
        """The training bar (the name pytorch-accelerated 0.1.61 gives :attr:`train_bar`)."""
        return self.train_bar

    @pbar.setter
    def pbar(self, value: Any) -> None:
        self.train_bar = value

    @property
    def eval_pbar(self) -> Any:
        """The evaluation bar (the name pytorch-accelerated 0.1.61 gives :attr:`eval_bar`)."""
        return self.eval_bar

    @eval_pbar.setter
    def eval_pbar(self, value: Any) -> None:
        self.eval_bar = value

    def _open(self, trainer: Trainer, counts: _EpochCounts, position: int, leave: bool) -> Any:
        """A bar (a disabled one where no bar is drawn) that tqdm never redraws by itself:
        :meth:`_draw` redraws it, so the values it shows are read only then."""
        return tqdm(
            total=counts.total,  # None for a stream: a bar without a total
            initial=counts.batches,
            desc=counts.label,
            # (accelerate's is_local_main_process builds its shared state anew: asked second)
            disable=not (progress_bar_wanted(self.enabled) and trainer.is_local_process_zero),
            leave=leave,
            dynamic_ncols=True,
            position=position,
            file=sys.stdout,  # where trainer.print writes: printed lines then go above the bar
        )

    def _draw(self, bar: Any, counts: _EpochCounts, postfix: dict[str, str] | None = None) -> None:
        """Redraw ``bar`` with the counts (and ``postfix``) of now; nothing where no bar is drawn."""
        if bar.disable:
            return
        counts.next_draw = time.perf_counter() + self.refresh_interval
        bar.total, bar.n = counts.total, counts.batches
        if postfix is not None:
            bar.set_postfix(postfix, refresh=False)
        bar.refresh()

    def _train_values(self, trainer: Trainer, counts: _EpochCounts, loss: Any) -> dict[str, str]:
        """What the training bar and summary show, by name."""
        values = {"step": str(trainer.progress.global_step), "loss": format_metric_value(loss)}
        if trainer.optimizer is not None and trainer.optimizer.param_groups:
            values["lr"] = format_metric_value(trainer.optimizer.param_groups[0]["lr"])
        values["samples/s"] = f"{counts.samples_per_second(trainer.accelerator.num_processes):.0f}"
        return values

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        config = trainer.run_config
        label = f"epoch {trainer.progress.epoch + 1}" + (
            f"/{config.num_epochs}" if config is not None else ""
        )
        # Resuming mid-epoch starts at the batch the run stopped at.
        self._train = _EpochCounts(
            label, trainer.progress.batch_index, batches_per_epoch(trainer.train_dataloader)
        )
        self.train_bar = self._open(trainer, self._train, position=0, leave=True)

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, batch_output: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        counts = self._train
        if counts is None or self.train_bar is None:
            return
        counts.add_batch(batch_output)
        self.train_bar.n = counts.batches  # a host count: shown by any redraw, e.g. around a print
        if not self.train_bar.disable and time.perf_counter() >= counts.next_draw:
            # A callback may have replaced the loader after the bar was opened.
            counts.total = batches_per_epoch(trainer.train_dataloader, counts.total)
            self._draw(self.train_bar, counts, self._train_values(trainer, counts, trainer.running_loss))

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._end_train_epoch(trainer, lambda: _epoch_loss(trainer))

    def _end_train_epoch(self, trainer: Trainer, loss: Callable[[], Any]) -> None:
        """Draw the bar's final state and close it; without a bar, print the epoch's summary
        (each node's main process only)."""
        counts, bar = self._train, self.train_bar
        summary = None
        if counts is not None and bar is not None and trainer.is_local_process_zero:
            values = self._train_values(trainer, counts, loss())
            self._draw(bar, counts, values)
            summary = self._summary(counts, values) if bar.disable else None  # (close() disables it)
        self._close(training=True)
        if summary is not None:
            trainer.print(summary)

    @staticmethod
    def _summary(counts: _EpochCounts, values: dict[str, str]) -> str:
        """The line that stands for an epoch's bar where no bar is drawn."""
        lr = f", lr {values['lr']}" if "lr" in values else ""
        return (
            f"{counts.label}: {counts.batches_done()} batches, step {values['step']}, loss {values['loss']}{lr}, "
            f"{values['samples/s']} samples/s, {counts.elapsed():.2f} s"
        )

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        self._eval = _EpochCounts("eval", 0, batches_per_epoch(trainer.eval_dataloader))
        below_train = self.train_bar is not None and not self.train_bar.disable
        self.eval_bar = self._open(trainer, self._eval, position=1 if below_train else 0, leave=False)

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any = None, batch_output: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        counts = self._eval
        if counts is None or self.eval_bar is None:
            return
        counts.add_batch(batch_output)
        if not self.eval_bar.disable and time.perf_counter() >= counts.next_draw:
            self._draw(self.eval_bar, counts)

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        if self._eval is not None and self.eval_bar is not None:
            self._draw(self.eval_bar, self._eval)
        self._close(evaluation=True)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        # A stopped run skips the epoch-end events: end the epoch's bar where the run stopped.
        if self._train is not None and self.train_bar is not None:
            self._end_train_epoch(trainer, lambda: trainer.running_loss)
        self._close(training=True, evaluation=True)

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._close(evaluation=True)  # a stop skips on_eval_epoch_end

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._close(training=True, evaluation=True)

    def _close(self, training: bool = False, evaluation: bool = False) -> None:
        if evaluation and self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar, self._eval = None, None
        if training and self.train_bar is not None:
            self.train_bar.close()
            self.train_bar, self._train = None, None


class LogMetricsCallback(TrainerCallback):
    """Print the latest value of every metric after each epoch and each evaluation run.

    Each prints as ``name: value``, the value shown by :func:`format_metric_value` (one
    precision for floats, tensors and numpy scalars alike). Override :meth:`log_metrics` to
    send them elsewhere.
    """

    def __init__(self) -> None:
        self._counts_before: dict[str, int] = {}

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        history = trainer.run_history
        self.log_metrics(
            trainer, {name: history.get_latest_metric(name) for name in sorted(history.get_metric_names())}
        )

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        history = trainer.run_history
        self._counts_before = {
            name: len(history.get_metric_values(name)) for name in history.get_metric_names()
        }

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        # Only what this evaluation measured, not the training metrics still in the history.
        history = trainer.run_history
        measured = {
            name: history.get_latest_metric(name)
            for name in sorted(history.get_metric_names())
            if len(history.get_metric_values(name)) > self._counts_before.get(name, 0)
        }
        self.log_metrics(trainer, measured)

    def log_metrics(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        """Print ``metrics`` on the main process of each node."""
        for name, value in metrics.items():
            trainer.print(f"{name}: {format_metric_value(value)}")
