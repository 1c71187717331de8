"""Callbacks that watch a metric: keep the best model, stop when the metric stops improving."""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._internal.argument_checks import check_whole_number
from .events import StopTrainingError, TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["MetricWatchingCallback", "SaveBestModelCallback", "EarlyStoppingCallback"]


class MetricWatchingCallback(TrainerCallback):
    """Base class of callbacks that act when a watched metric improves, once per epoch.

    At each ``on_training_run_epoch_end`` a subclass calls :meth:`read_new_value` (the value
    recorded for ``watch_metric`` since the last check, or None when none was recorded, so a
    metric recorded every other epoch is only judged when it is) and :meth:`agree_improvement`.

    With several processes, the main process decides whether the metric improved and every
    process follows its decision (one collective call per check), so all of them save or stop
    at the same epoch even when a metric differs between processes.

    ``best_metric`` is reset at each ``on_training_run_start`` when ``reset_on_train``, except
    just after :meth:`load_state_dict`: a restored state is kept for the run that follows.
    """

    def __init__(
        self, watch_metric: str, greater_is_better: bool, reset_on_train: bool, threshold: float = 0.0
    ) -> None:
        if not isinstance(watch_metric, str) or not watch_metric:
            raise TypeError(
                f"watch_metric must be a metric name such as 'eval_loss_epoch', got {watch_metric!r}."
            )
        self.watch_metric = watch_metric
        self.greater_is_better = bool(greater_is_better)
        self.reset_on_train = bool(reset_on_train)
        self.threshold = float(threshold)
        self.best_metric: float | None = None
        self._num_values_seen = 0
        self._keep_loaded_state = False

    @property
    def operator(self) -> Callable[[Any, Any], bool]:
        """``operator.gt`` when ``greater_is_better``, else ``operator.lt`` (as in 0.1.61)."""
        return operator.gt if self.greater_is_better else operator.lt

    def reset(self) -> None:
        """Forget the best value (subclasses also forget their own state)."""
        self.best_metric = None

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.reset_on_train and not self._keep_loaded_state:
            self.reset()
        self._keep_loaded_state = False
        history = trainer.run_history
        # Values left from an earlier run (reset_run_history=False) are not this run's.
        self._num_values_seen = (
            len(history.get_metric_values(self.watch_metric))
            if self.watch_metric in history.get_metric_names()
            else 0
        )

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._keep_loaded_state = False

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._keep_loaded_state = False

    def read_new_value(self, trainer: Trainer) -> float | None:
        """Return the value of ``watch_metric`` recorded since the last check, or None.

        Raises:
            ValueError: if the metric has never been recorded, listing the recorded ones.
        """
        history = trainer.run_history
        names = history.get_metric_names()
        if self.watch_metric not in names:
            raise ValueError(self._unknown_metric_message(sorted(names)))
        values = history.get_metric_values(self.watch_metric)
        if len(values) <= self._num_values_seen:
            return None
        self._num_values_seen = len(values)
        return float(values[-1])

    def is_improvement(self, value: float) -> bool:
        """True if ``value`` beats ``best_metric`` by more than ``threshold`` (NaN never does)."""
        return not math.isnan(value) and (
            self.best_metric is None
            or (
                value > self.best_metric + self.threshold
                if self.greater_is_better
                else value < self.best_metric - self.threshold
            )
        )

    def agree_improvement(self, trainer: Trainer, value: float) -> bool:
        """The main process's :meth:`is_improvement`, shared with every process (collective)."""
        return trainer.any_process(self.is_improvement(value) and trainer.is_world_process_zero)

    def state_dict(self) -> dict[str, Any]:
        return {"best_metric": self.best_metric}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best_metric = None if state.get("best_metric") is None else float(state["best_metric"])
        self._keep_loaded_state = True

    def _unknown_metric_message(self, recorded: list[str]) -> str:
        hint = (
            f"{self.watch_metric!r} is recorded only when there is an evaluation epoch: pass "
            f"eval_dataset to trainer.train(...), or watch one of the recorded metrics."
            if self.watch_metric.endswith("eval_loss_epoch")
            else "Record it with trainer.run_history.update_metric(...) in a callback placed before "
            "this one, or watch one of the recorded metrics."
        )
        return (
            f"{type(self).__name__} watches the metric {self.watch_metric!r}, but it was never "
            f"recorded; the recorded metrics are {recorded}. {hint}"
        )


class BestEpochCallback(MetricWatchingCallback):
    """A :class:`MetricWatchingCallback` that also keeps ``best_epoch``, the epoch of the best
    value (forgotten by :meth:`reset`, part of the state), also named ``best_metric_epoch``."""

    best_epoch: int | None

    def reset(self) -> None:
        super().reset()
        self.best_epoch = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "best_epoch": self.best_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.best_epoch = state.get("best_epoch")

    @property
    def best_metric_epoch(self) -> int | None:
        """The name pytorch-accelerated 0.1.61 gives :attr:`best_epoch`."""
        return self.best_epoch

    @best_metric_epoch.setter
    def best_metric_epoch(self, value: int | None) -> None:
        self.best_epoch = value


class SaveBestModelCallback(BestEpochCallback):
    """Save a checkpoint whenever ``watch_metric`` improves; reload the best weights at the end.

    The checkpoint is written with :meth:`Trainer.save_checkpoint`, so it always has the same
    keys: ``model_state_dict``, ``optimizer_state_dict`` / ``scheduler_state_dict`` (when asked
    and present), ``epoch`` (the run history's, counted from 1: ``run_history.current_epoch``, which
    goes on across ``train()`` calls with ``reset_run_history=False``, as in 0.1.61), ``global_step``
    (optimizer updates done) and the watched metric's name with its value. Any improvement
    counts, however small. At ``on_training_run_end`` (also after an early stop) the best
    model weights are loaded back into the model when ``load_saved_checkpoint``.

    Weights that hold NaN or infinity (or follow a non-finite training loss) are never saved:
    the save is refused with :class:`~pytorch_accelerated.checkpoints.finite.NonFiniteStateError`,
    which stops the run, and the file keeps the best finite weights.

    Place it before an :class:`EarlyStoppingCallback`, so that an epoch is saved before a stop.

    Args:
        save_path: the checkpoint file, overwritten at each improvement.
        watch_metric: the run-history metric to watch.
        greater_is_better: True for metrics such as accuracy.
        reset_on_train: forget the best value when a new ``train()`` starts.
        save_optimizer: include the optimizer state.
        save_scheduler: include the scheduler state.
        load_saved_checkpoint: load the best weights into the model at the end of the run.

    Attributes:
        best_metric: the best value so far; ``best_epoch`` (also ``best_metric_epoch``) its epoch.
        operator: ``operator.gt`` when ``greater_is_better``, else ``operator.lt``.
    """

    def __init__(
        self,
        save_path: str | os.PathLike = "best_model.pt",
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool = False,
        reset_on_train: bool = True,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        load_saved_checkpoint: bool = True,
    ) -> None:
        super().__init__(watch_metric, greater_is_better, reset_on_train)
        self.save_path = save_path
        self.save_optimizer = save_optimizer
        self.save_scheduler = save_scheduler
        self.load_saved_checkpoint = load_saved_checkpoint
        self.best_epoch: int | None = None

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        value = self.read_new_value(trainer)
        if value is None or not self.agree_improvement(trainer, value):
            return
        epoch = trainer.run_history.current_epoch  # as 0.1.61: counts on across train() calls
        # Refused (NonFiniteStateError, which stops the run) when the weights or the loss are
        # not finite: the best so far then stays the one in the file.
        trainer.save_checkpoint(
            self.save_path,
            checkpoint_kwargs={
                "epoch": epoch,
                "global_step": trainer.progress.global_step,
                self.watch_metric: value,
            },
            save_optimizer=self.save_optimizer,
            save_scheduler=self.save_scheduler,
        )
        self.best_metric, self.best_epoch = value, epoch

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        super().on_training_run_end(trainer)
        if self.load_saved_checkpoint and self.best_epoch is not None:
            trainer.load_checkpoint(self.save_path, load_optimizer=False, load_scheduler=False)
            trainer.print(
                f"Loaded the best model of epoch {self.best_epoch} "
                f"({self.watch_metric} = {self.best_metric:.6g}) from {str(self.save_path)!r}"
            )


class EarlyStoppingCallback(MetricWatchingCallback):
    """Stop training when ``watch_metric`` has not improved for ``early_stopping_patience`` epochs.

    An epoch improves on the best value so far when it beats it by more than
    ``early_stopping_threshold`` (an absolute amount); the best value only changes on an
    improvement. After ``early_stopping_patience`` epochs in a row without one, the callback
    raises :class:`StopTrainingError` at ``on_training_run_epoch_end``: the run ends through
    ``on_stop_training_error`` and the run-end hooks, on every process at the same epoch.

    Args:
        early_stopping_patience: epochs without improvement to allow (>= 1).
        early_stopping_threshold: the least change that counts as an improvement (>= 0).
        watch_metric: the run-history metric to watch.
        greater_is_better: True for metrics such as accuracy.
        reset_on_train: forget the best value and the count when a new ``train()`` starts.

    Attributes:
        num_epochs_without_improvement: epochs in a row without an improvement (also
            ``early_stopping_patience_counter``).
        operator: ``operator.gt`` when ``greater_is_better``, else ``operator.lt``.
    """

    def __init__(
        self,
        early_stopping_patience: int = 1,
        early_stopping_threshold: float = 0.01,
        watch_metric: str = "eval_loss_epoch",
        greater_is_better: bool = False,
        reset_on_train: bool = True,
    ) -> None:
        self.early_stopping_patience: int = check_whole_number(
            early_stopping_patience, "early_stopping_patience", owner="EarlyStoppingCallback"
        )
        if not isinstance(early_stopping_threshold, numbers.Real) or not early_stopping_threshold >= 0:
            raise ValueError(
                f"early_stopping_threshold must be a number >= 0 (the least change that counts as "
                f"an improvement), got {early_stopping_threshold!r}."
            )
        super().__init__(watch_metric, greater_is_better, reset_on_train, threshold=early_stopping_threshold)
        self.early_stopping_threshold: float = float(early_stopping_threshold)
        self.num_epochs_without_improvement: int = 0

    @property
    def early_stopping_patience_counter(self) -> int:
        """The name pytorch-accelerated 0.1.61 gives :attr:`num_epochs_without_improvement`."""
        return self.num_epochs_without_improvement

    @early_stopping_patience_counter.setter
    def early_stopping_patience_counter(self, value: int) -> None:
        self.num_epochs_without_improvement = value

    def reset(self) -> None:
        super().reset()
        self.num_epochs_without_improvement = 0

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        value = self.read_new_value(trainer)
        if value is None:
            return
        if self.agree_improvement(trainer, value):
            self.best_metric, self.num_epochs_without_improvement = value, 0
            return
        # Every process counts the same shared decisions, so all reach the patience together.
        self.num_epochs_without_improvement += 1
        if self.num_epochs_without_improvement >= self.early_stopping_patience:
            best = "none yet" if self.best_metric is None else f"{self.best_metric:.6g}"
            raise StopTrainingError(
                f"early stopping: {self.watch_metric} has not improved by more than "
                f"{self.early_stopping_threshold:g} on its best value ({best}) for "
                f"{self.num_epochs_without_improvement} epoch(s)"
            )

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "num_epochs_without_improvement": self.num_epochs_without_improvement}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.num_epochs_without_improvement = int(state.get("num_epochs_without_improvement", 0))
