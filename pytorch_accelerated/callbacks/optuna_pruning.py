"""Optuna's pruning on any number of processes: :class:`OptunaPruningCallback`.

Optuna is an extra (``pip install 'pytorch-accelerated[tune]'``), imported only when the callback is
created: importing the package without it works.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from .evaluation import StepBasedEvaluationCallback
from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["OptunaPruningCallback"]


class OptunaPruningCallback(TrainerCallback):
    """Report a metric to an Optuna trial after each evaluation, and end the run with
    ``optuna.TrialPruned`` on every process when the study's pruner says so.

    After each evaluation the latest value of ``monitor`` in the run history is reported with
    ``trial.report(value, step)``, then ``trial.should_prune()`` is asked. The step is the epoch,
    counted from 0 as Optuna's pruners expect (their warm-up counts steps from 0); in a run with a
    :class:`~pytorch_accelerated.callbacks.StepBasedEvaluationCallback` it is the number of
    optimizer updates done (``trainer.progress.global_step``), for every report of the run.

    Several processes: only the main process holds the trial and talks to the study (``trial``
    may be None on the others, Optuna's convention for distributed objectives); its decision is
    shared with one collective call per evaluation (``trainer.any_process``), so ``train()``
    raises ``optuna.TrialPruned`` on every process after the same evaluation and none is left
    waiting. Updates that do not evaluate cost nothing: no device read, no collective call.

    The report waits until every callback has finished with the evaluation, so a metric that
    another callback records at its end (an accuracy, ``intermediate_eval_loss``) is seen,
    whatever the order of the callbacks: an epoch's evaluation is reported at
    ``on_training_run_epoch_end``, a step-based one before the next batch (or at the epoch's end).
    Put this callback before ``SaveTrainingStateCallback``: a state saved at an epoch's end then
    always follows that epoch's report, so a trial resumed from it never skips one.

    Args:
        trial: the ``optuna.trial.Trial`` on the main process (anything with ``report`` and
            ``should_prune``, such as ``optuna.trial.FixedTrial``); None is allowed on the others.
        monitor: the run-history metric to report (the study's direction must match it, e.g.
            ``direction="minimize"`` for a loss).

    Raises:
        ImportError: if optuna is not installed.
        TypeError: if ``trial`` is neither None nor a trial, or ``monitor`` is not a name.
        ValueError: at the start of a run without an evaluation set, when the main process has no
            trial, or after an epoch's evaluation when ``monitor`` is not a metric of the run
            history (the message lists those that are).
    """

    def __init__(self, trial: Any, monitor: str = "eval_loss_epoch") -> None:
        try:
            import optuna
        except ImportError as error:
            raise ImportError(
                "OptunaPruningCallback needs optuna, which is not installed: "
                "pip install 'pytorch-accelerated[tune]'  (or pip install optuna)."
            ) from error
        if trial is not None and not all(
            callable(getattr(trial, name, None)) for name in ("report", "should_prune")
        ):
            raise TypeError(
                f"OptunaPruningCallback(trial=...) takes the optuna trial passed to your objective (or "
                f"None on processes other than the main one), got {trial!r} ({type(trial).__name__})."
            )
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(
                f"OptunaPruningCallback(monitor=...) takes the name of a metric of the run history, such "
                f"as 'eval_loss_epoch', got {monitor!r}."
            )
        self.trial, self.monitor = trial, monitor
        self._trial_pruned = optuna.TrialPruned
        self._by_update = False  # the step is the update count (step-based evaluation), else the epoch
        self._reported = 0  # values of the monitored metric already reported (or there before this run)
        self._pending = False  # an evaluation ended and has not been reported yet

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.is_world_process_zero and self.trial is None:
            raise ValueError(
                "OptunaPruningCallback has trial=None on the main process, which reports to the study: "
                "pass the trial your objective received there (None is for the other processes)."
            )
        if trainer.eval_dataloader is None:
            raise ValueError(
                "OptunaPruningCallback reports a metric after each evaluation, but this run has no "
                "evaluation set. Pass train(..., eval_dataset=...) or remove the callback."
            )
        self._by_update = trainer.callback_handler.get_callback(StepBasedEvaluationCallback) is not None
        history = trainer.run_history
        # Values there already (a resumed run, a kept history) were reported by the run that made them.
        self._reported = len(history.get_metric_values(self.monitor)) if self._recorded(trainer) else 0
        self._pending = False

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        self._pending = True  # reported once every callback is done with this evaluation

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if self._pending:  # a step-based evaluation ran at the end of the last batch
            self._report(trainer, trainer.progress.global_step, after_epoch=False)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self._pending:  # a step-based evaluation ran at the end of the epoch's last batch
            self._report(trainer, trainer.progress.global_step, after_epoch=False)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if self._pending:
            step = trainer.progress.global_step if self._by_update else trainer.progress.epoch
            self._report(trainer, step, after_epoch=True)

    def _recorded(self, trainer: Trainer) -> bool:
        return self.monitor in trainer.run_history.get_metric_names()

    def _report(self, trainer: Trainer, step: int, after_epoch: bool) -> None:
        """Report the new value of the monitored metric, if there is one, and prune on every
        process if the main process's trial says so."""
        self._pending = False
        if not self._recorded(trainer):
            if after_epoch:  # every epoch-level metric exists once an epoch was evaluated
                self._missing_metric(trainer)
            return  # (an epoch-level metric is not there yet after a step-based evaluation)
        values = trainer.run_history.get_metric_values(self.monitor)
        if len(values) <= self._reported:
            return  # this evaluation did not record it
        self._reported, value = len(values), _as_number(values[-1], self.monitor)
        prune = False
        if trainer.is_world_process_zero:
            self.trial.report(value, step)
            prune = bool(self.trial.should_prune())
        if trainer.any_process(prune):  # the main process's decision, on every process
            raise self._trial_pruned(f"pruned at step {step}: {self.monitor} = {value:.6g}")

    def _missing_metric(self, trainer: Trainer) -> None:
        names = sorted(trainer.run_history.get_metric_names())
        raise ValueError(
            f"OptunaPruningCallback(monitor={self.monitor!r}): the run history has no metric of that "
            f"name after an evaluation; it has {names}. Pass one of these as monitor (and set the "
            f"study's direction to match it)."
        )


def _as_number(value: Any, monitor: str) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if getattr(value, "numel", lambda: 0)() == 1:  # a one-element tensor
        return float(value.item())
    raise TypeError(
        f"OptunaPruningCallback(monitor={monitor!r}): the metric's latest value is {value!r}, which is not "
        f"a number; Optuna's trial.report takes one number per step."
    )
