"""Keep, evaluate and save an exponential moving average (EMA) of the model's weights."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch

from .._internal.fsdp import refuse_under_fsdp
from ..checkpoints.finite import NonFiniteStateError
from ..utils import ModelEma
from .events import CallbackHandler, TrainerCallback
from .monitoring import BestEpochCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["ModelEmaCallback"]

EMA_METRIC_PREFIX = "ema_model_"


class ModelEmaCallback(BestEpochCallback):
    """Average the model's weights after every optimizer update; evaluate and save the average.

    - At ``on_training_run_start`` an EMA copy of the unwrapped model is made on
      ``trainer.device`` (``model_ema(model, decay=decay)``); it is :attr:`ema_model`, and the
      averaged network itself is ``ema_model.module``.
    - After every optimizer update (``on_train_step_end`` with ``is_update_step``) it is
      updated: ``ema = decay * ema + (1 - decay) * weights``. Batches that only accumulate
      gradients do not update it.
    - After each end-of-epoch evaluation, when ``evaluate_during_training``, the EMA weights are
      evaluated on the same data with ``trainer.run_eval_epoch``, with every metric recorded
      under the prefix ``ema_model_`` (``ema_model_eval_loss_epoch``, and e.g.
      ``ema_model_accuracy`` from a callback in ``callbacks`` that records ``accuracy``).
    - Intermediate evaluations (such as those of ``StepBasedEvaluationCallback``) are followed
      by an EMA evaluation only with ``evaluate_intermediate=True``. It runs once the model's
      evaluation has returned (at this callback's next ``on_train_step_end`` or
      ``on_train_epoch_end``: place it after the callback that evaluates to have it in the same
      step), with ``is_intermediate=True``, and its loss is recorded as
      ``ema_model_intermediate_eval_loss``.
    - ``callbacks``: the callbacks (instances or classes) of the EMA evaluation. As in
      pytorch-accelerated 0.1.61, **only** they receive its events (``on_eval_epoch_start`` to
      ``on_eval_epoch_end``): :attr:`callback_handler` replaces the Trainer's handler while it
      runs, so the Trainer's own callbacks (a metric callback, the progress bar) do not see it.
      Pass a metric callback both to the Trainer and here to measure both models.
    - When ``watch_metric`` improves, the EMA weights are saved to ``save_path`` in the layout
      of :meth:`Trainer.save_checkpoint` (``model_state_dict``, ``epoch`` counted from 1,
      ``global_step``, the metric's value and ``ema_decay``), so ``trainer.load_checkpoint(path,
      load_optimizer=False)`` loads them into a model. Without evaluation during training, the
      final EMA weights are saved at the end of the run instead.
    - At ``on_training_run_end``, when ``load_saved_checkpoint``, the best saved EMA weights are
      loaded back into the EMA copy (``ema_model.module``); the trained model is left as it is.
    - EMA weights that hold NaN or infinity (or follow a non-finite training loss) are never
      saved: during the run the refused save stops it
      (:class:`~pytorch_accelerated.checkpoints.finite.NonFiniteStateError`); at its end the
      refusal is printed. The file keeps the last finite EMA weights saved.

    Args:
        decay: the weight kept by the average at each update, in [0, 1].
        evaluate_during_training: evaluate the EMA weights after each evaluation epoch.
        save_path: where to save the best EMA weights; None saves nothing.
        watch_metric: the metric that decides which EMA weights are the best.
        greater_is_better: True for metrics such as accuracy.
        model_ema: the EMA class (or factory), called as ``model_ema(model, decay=decay)``
            (also :attr:`model_ema_cls`).
        callbacks: the callbacks of the EMA evaluation (and only of it).
        evaluate_intermediate: also evaluate the EMA weights after intermediate evaluations.
        load_saved_checkpoint: load the best EMA weights into the EMA copy at the end of the run.
        save_optimizer: include the optimizer state in the EMA file.
        save_scheduler: include the scheduler state in the EMA file.

    Attributes:
        best_epoch: the epoch of the best EMA weights (also ``best_metric_epoch``).
        operator: ``operator.gt`` when ``greater_is_better``, else ``operator.lt``.
    """

    def __init__(
        self,
        decay: float = 0.99,
        evaluate_during_training: bool = True,
        save_path: str | os.PathLike | None = "ema_model.pt",
        watch_metric: str = "ema_model_eval_loss_epoch",
        greater_is_better: bool = False,
        model_ema: Callable[..., ModelEma] = ModelEma,
        callbacks: Iterable[TrainerCallback | type[TrainerCallback]] = (),
        *,
        evaluate_intermediate: bool = False,
        load_saved_checkpoint: bool = True,
        save_optimizer: bool = False,
        save_scheduler: bool = False,
    ) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(
                f"ModelEmaCallback decay must be a number in [0, 1] (e.g. 0.99 or 0.999), got {decay!r}."
            )
        super().__init__(watch_metric, greater_is_better, reset_on_train=True)
        self.decay = decay
        self.evaluate_during_training = evaluate_during_training
        self.save_path = save_path
        self.model_ema = model_ema
        # Checked now (unknown hooks, classes instantiated), not in the middle of a run.
        self.callback_handler = CallbackHandler(callbacks)
        self.evaluate_intermediate = evaluate_intermediate
        self.save_optimizer = save_optimizer
        self.save_scheduler = save_scheduler
        self.load_saved_checkpoint = load_saved_checkpoint
        self.ema_model: ModelEma | None = None
        self.best_epoch: int | None = None
        self._pending_ema_state: dict[str, torch.Tensor] | None = None
        self._in_training_run = False
        self._evaluating = False
        self._pending_intermediate = False
        self._epoch = 0

    @property
    def callbacks(self) -> list[TrainerCallback]:
        """The callbacks of the EMA evaluation (those of :attr:`callback_handler`)."""
        return self.callback_handler.callbacks

    @property
    def model_ema_cls(self) -> Callable[..., ModelEma]:
        """The name pytorch-accelerated 0.1.61 gives :attr:`model_ema` (the EMA class)."""
        return self.model_ema

    @model_ema_cls.setter
    def model_ema_cls(self, value: Callable[..., ModelEma]) -> None:
        self.model_ema = value

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        super().on_training_run_start(trainer)
        refuse_under_fsdp(
            trainer.accelerator,
            "ModelEmaCallback",
            "it keeps a whole copy of the model on each process, and "
            "FSDP's model is sharded across the processes",
            "Remove it from the callbacks, or train without FSDP.",
        )
        self.ema_model = self.model_ema(trainer.get_model(), decay=self.decay).to(trainer.device)
        if self._pending_ema_state is not None:
            self.ema_model.module.load_state_dict(self._pending_ema_state)
            self._pending_ema_state = None
        self._in_training_run, self._pending_intermediate = True, False

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if self.ema_model is not None and is_update_step:
            self.ema_model.update(trainer.model)
        self._run_pending_intermediate(trainer)

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._epoch = trainer.progress.epoch + 1  # the last epoch run, for the save at the end

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._run_pending_intermediate(trainer)

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        if (
            self._evaluating  # the EMA evaluation's own end event
            or not self._in_training_run  # trainer.evaluate() outside a run
            or not self.evaluate_during_training
            or (is_intermediate and not self.evaluate_intermediate)
            or self.ema_model is None
        ):
            return
        if is_intermediate:
            # Run once the intermediate evaluation has returned: nested inside it, the EMA
            # evaluation would change the loss that run_eval_epoch returns to its caller.
            self._pending_intermediate = True
        else:
            self.evaluate_ema(trainer)

    def _run_pending_intermediate(self, trainer: Trainer) -> None:
        if self._pending_intermediate:
            self._pending_intermediate = False
            trainer.run_history.update_metric(
                f"{EMA_METRIC_PREFIX}intermediate_eval_loss", self.evaluate_ema(trainer, is_intermediate=True)
            )

    def evaluate_ema(self, trainer: Trainer, is_intermediate: bool = False) -> float:
        """Evaluate the EMA weights on the evaluation data; metrics get the ``ema_model_`` prefix.

        Returns the mean loss. Only :attr:`callbacks` receive the evaluation's events. Every
        process must call this.
        """
        if self.ema_model is None:
            raise RuntimeError("ModelEmaCallback.evaluate_ema needs a training run to have started.")
        trainer_handler, trainer.callback_handler = trainer.callback_handler, self.callback_handler
        self._evaluating = True
        try:
            return trainer.run_eval_epoch(
                model=self.ema_model.module,
                is_intermediate=is_intermediate,
                metric_name_prefix=EMA_METRIC_PREFIX,
            )
        finally:
            trainer.callback_handler = trainer_handler
            self._evaluating = False

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if not self.evaluate_during_training or self.ema_model is None:
            return
        value = self.read_new_value(trainer)
        if value is None or not self.agree_improvement(trainer, value):
            return
        epoch = trainer.progress.epoch + 1
        self._save(trainer, {"epoch": epoch, self.watch_metric: value})  # refused: stops the run
        self.best_metric, self.best_epoch = value, epoch

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        super().on_training_run_end(trainer)
        self._in_training_run = False
        if self.ema_model is None or self.save_path is None:
            return
        if not self.evaluate_during_training:
            try:
                self._save(trainer, {"epoch": self._epoch})
            except NonFiniteStateError as error:  # the run ends anyway: the other end hooks run
                trainer.print(str(error))
        elif self.load_saved_checkpoint and self.best_epoch is not None:
            trainer.load_checkpoint(
                self.save_path, load_optimizer=False, load_scheduler=False, model=self.ema_model.module
            )
            trainer.print(
                f"Loaded the best EMA weights of epoch {self.best_epoch} "
                f"({self.watch_metric} = {self.best_metric:.6g}) into ModelEmaCallback.ema_model"
            )

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        super().on_exception(trainer, exception)
        self._in_training_run = self._pending_intermediate = False

    def _save(self, trainer: Trainer, extra: dict[str, Any]) -> None:
        if self.save_path is None or self.ema_model is None:
            return
        # The EMA copy is the same on every process; save_checkpoint writes it once per node.
        trainer.save_checkpoint(
            self.save_path,
            checkpoint_kwargs={
                "global_step": trainer.progress.global_step,
                "ema_decay": float(self.decay),
                **extra,
            },
            save_optimizer=self.save_optimizer,
            save_scheduler=self.save_scheduler,
            model=self.ema_model.module,
        )

    def _unknown_metric_message(self, recorded: list[str]) -> str:
        return (
            f"{super()._unknown_metric_message(recorded)} To keep the EMA without evaluating it, "
            f"pass ModelEmaCallback(evaluate_during_training=False)."
        )

    def state_dict(self) -> dict[str, Any]:
        """The best metric and epoch, and the EMA weights (CPU tensors) once a run has started."""
        state = super().state_dict()
        source = self.ema_model.module.state_dict() if self.ema_model is not None else self._pending_ema_state
        if source is not None:
            state["ema_state_dict"] = {name: tensor.detach().cpu().clone() for name, tensor in source.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; before a run starts, the EMA weights wait for it."""
        super().load_state_dict(state)
        ema_state = state.get("ema_state_dict")
        if ema_state is not None and self.ema_model is not None:
            self.ema_model.module.load_state_dict(ema_state)
        elif ema_state is not None:
            self._pending_ema_state = dict(ema_state)
