"""The five callbacks every Trainer gets unless told otherwise."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .._internal.validation import check_whole_number
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

    The Trainer already sums each step's loss on the device, and that sum is NaN or infinite
    once any loss of the epoch was: it is the flag, kept on the device at no extra cost. Every
    ``check_every_n_steps`` optimizer updates (default 10) and at the end of each epoch, the
    processes read it and agree (one collective call, one host read) whether any saw a
    non-finite loss; if so, all raise :class:`StopTrainingError` at the same step, so the run
    ends through the normal end hooks within ``check_every_n_steps`` updates of the first
    non-finite loss. The other steps cost no device work and no device-to-host sync. Every save
    of weights (training states, save-best, EMA, WSD) makes the same check first, so a NaN
    never reaches a checkpoint even between two checks.

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
        process (a device-to-host sync; the built-in checks agree across processes instead)."""
        if not bool(torch.isfinite(torch.as_tensor(batch_output["loss"])).all()):
            self.triggered = True
            where = f" at step {step}" if step is not None else ""
            raise StopTrainingError(f"non-finite loss{where}")

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.triggered = False

    def on_train_step_end(self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if is_update_step and trainer.progress.global_step % self.check_every_n_steps == 0:
            self._stop_if_non_finite(trainer)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._stop_if_non_finite(trainer)  # before the epoch's sum is reset

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        total = trainer.run_state.eval_loss.running_total  # a sum over this process's batches
        if trainer.any_process(~torch.isfinite(torch.as_tensor(total)).all()):
            self.triggered = True
            trainer.print(f"A non-finite evaluation loss was seen at step {trainer.progress.global_step}; stopping.")
            raise StopTrainingError("non-finite evaluation loss")

    def _stop_if_non_finite(self, trainer: Trainer) -> None:
        if trainer.any_process(non_finite_loss_flag(trainer)):
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


class ProgressBarCallback(TrainerCallback):
    """tqdm progress bars for training and evaluation epochs, on each node's main process only.

    The training bar shows the epoch's running loss and the learning rate. They are read
    only when tqdm redraws the bar (at most ten times a second), because reading a loss from
    the GPU forces the host to wait for it. An evaluation during training (e.g. every N
    steps) gets its own bar below the training bar.
    """

    def __init__(self) -> None:
        self.train_bar: Any = None
        self.eval_bar: Any = None

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

    def _open(self, trainer: Trainer, dataloader: Any, desc: str, position: int) -> Any:
        return tqdm(
            total=batches_per_epoch(dataloader),  # None for a stream: a bar without a total
            desc=desc,
            disable=not trainer.is_local_process_zero,
            leave=False,
            dynamic_ncols=True,
            position=position,
        )

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.train_bar = self._open(trainer, trainer.train_dataloader, "train", position=0)

    def on_train_step_end(self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if self.train_bar is not None and self.train_bar.update(1):
            postfix = {"loss": f"{trainer.running_loss:.4g}"}
            if trainer.optimizer is not None:
                postfix["lr"] = f"{trainer.optimizer.param_groups[0]['lr']:.3g}"
            self.train_bar.set_postfix(postfix, refresh=False)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._close(training=True)

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        self.eval_bar = self._open(trainer, trainer.eval_dataloader, "eval", position=1 if self.train_bar is not None else 0)

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any = None, batch_output: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if self.eval_bar is not None:
            self.eval_bar.update(1)

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        self._close(evaluation=True)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        # A stopped run skips the epoch-end events: close whatever is still open.
        self._close(training=True, evaluation=True)

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._close(evaluation=True)  # a stop skips on_eval_epoch_end

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._close(training=True, evaluation=True)

    def _close(self, training: bool = False, evaluation: bool = False) -> None:
        if training and self.train_bar is not None:
            self.train_bar.close()
            self.train_bar = None
        if evaluation and self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None


class LogMetricsCallback(TrainerCallback):
    """Print the latest value of every metric after each epoch and each evaluation run.

    Override :meth:`log_metrics` to send them elsewhere.
    """

    def __init__(self) -> None:
        self._counts_before: dict[str, int] = {}

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        history = trainer.run_history
        self.log_metrics(trainer, {name: history.get_latest_metric(name) for name in sorted(history.get_metric_names())})

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        history = trainer.run_history
        self._counts_before = {name: len(history.get_metric_values(name)) for name in history.get_metric_names()}

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
            shown = f"{value:.6g}" if isinstance(value, float) and math.isfinite(value) else value
            trainer.print(f"{name}: {shown}")
