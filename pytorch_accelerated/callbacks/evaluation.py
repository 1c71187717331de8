"""Callbacks that evaluate during an epoch, and that shorten those evaluations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._internal.argument_checks import check_whole_number
from .._internal.intervals import every
from .events import TrainerCallback
from .limits import limit, unlimit

if TYPE_CHECKING:
    from ..trainer import Trainer


class StepBasedEvaluationCallback(TrainerCallback):
    """Evaluate on the run's evaluation set every ``eval_every_n_steps`` optimizer updates.

    The evaluation runs in ``on_train_step_end`` of the batch whose update makes
    ``trainer.progress.global_step`` a multiple of ``eval_every_n_steps``: after the backward
    pass, the optimizer step and the scheduler step, so it sees the updated weights. It is a
    full evaluation epoch (``trainer.run_eval_epoch``): the eval events fire with
    ``is_intermediate=True``, and ``eval_loss_epoch`` is not written, so callbacks that watch it
    (early stopping, best model) are not affected. Afterwards the model is back in the mode it
    was in (training, with dropout active) and the epoch goes on.

    It records two metrics in the run history, one value per evaluation:

    - ``intermediate_eval_loss``: the mean evaluation loss per sample over every process;
    - ``intermediate_eval_step``: the ``global_step`` at which it was measured.

    These evaluations come in addition to the one after each epoch. To make them cheaper, add
    :class:`LimitEvalStepsCallback`. Every process must use this callback (the evaluation
    gathers the loss from all of them).

    Args:
        eval_every_n_steps: optimizer updates between evaluations, >= 1.

    Raises:
        ValueError: at the start of a run that has no ``eval_dataset``.
    """

    LOSS_METRIC = "intermediate_eval_loss"
    STEP_METRIC = "intermediate_eval_step"

    def __init__(self, eval_every_n_steps: int) -> None:
        self.eval_every_n_steps = check_whole_number(
            eval_every_n_steps, "eval_every_n_steps", owner="StepBasedEvaluationCallback"
        )

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.eval_dataloader is None:
            raise ValueError(
                "StepBasedEvaluationCallback evaluates during training, but this run has no "
                "evaluation set. Pass train(..., eval_dataset=...) or remove the callback."
            )

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        global_step = trainer.progress.global_step
        # With gradient accumulation most batches end without an update: evaluate only after one.
        if is_update_step and every(self.eval_every_n_steps, global_step):
            trainer.run_history.update_metric(self.LOSS_METRIC, trainer.run_eval_epoch(is_intermediate=True))
            trainer.run_history.update_metric(self.STEP_METRIC, global_step)


class LimitEvalStepsCallback(TrainerCallback):
    """Evaluate on only the first ``num_eval_steps`` batches (per process).

    By default only intermediate evaluations are shortened (those that fire the eval events
    with ``is_intermediate=True``, such as :class:`StepBasedEvaluationCallback`'s), so the
    evaluation after each epoch and ``evaluate()`` still see the whole set. With
    ``limit_intermediate_only=False`` every evaluation is shortened. The evaluation loader is
    replaced in ``on_eval_epoch_start`` and restored in ``on_eval_epoch_end``; put this
    callback before ``ProgressBarCallback`` for the bar to show the shorter length.

    Args:
        num_eval_steps: evaluation batches per evaluation, >= 1 (0.1.61's name: a step here is
            an evaluation batch, not an optimizer update).
        limit_intermediate_only: shorten intermediate evaluations only (the default), or all.
    """

    def __init__(self, num_eval_steps: int, limit_intermediate_only: bool = True) -> None:
        self.num_eval_steps = check_whole_number(
            num_eval_steps, "num_eval_steps", owner="LimitEvalStepsCallback"
        )
        if not isinstance(limit_intermediate_only, bool):
            raise TypeError(
                f"LimitEvalStepsCallback needs limit_intermediate_only to be True or False, got "
                f"{limit_intermediate_only!r}."
            )
        self.limit_intermediate_only = limit_intermediate_only

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        if is_intermediate or not self.limit_intermediate_only:
            trainer.eval_dataloader = limit(trainer.eval_dataloader, self.num_eval_steps)

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        trainer.eval_dataloader = unlimit(trainer.eval_dataloader)

    # A stop skips on_eval_epoch_end, and a failure every end event: restore the loader there too.
    on_training_run_end = on_evaluation_run_end = on_eval_epoch_end

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        trainer.eval_dataloader = unlimit(trainer.eval_dataloader)  # (not through an overridable event)
