"""The Trainer: ``train`` -> ``_run_training`` -> ``_run_train_epoch`` -> one method per ML step.

Methods without a prefix are meant to be overridden; each is followed by the callback event of the
same name with ``on_`` in front (docs/inside-the-trainer.md, pinned by tests/unit/test_event_order.py).
The Trainer holds its parts as objects (``loaders``, ``state_store``, what was prepared). The methods
that only hand over to a part are functions and properties of :mod:`.runs`, bound here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import torch
from accelerate import Accelerator, skip_first_batches
from torch import nn

from . import lr_finder, prediction, runs
from ._internal.accelerator_checks import check_accelerator
from ._internal.accumulation import accumulation_windows
from ._internal.batch_loss import batch_size_of, loss_of, loss_without_grad_error, unpack_batch
from ._internal.distributed import mean_over_processes
from ._internal.launch_checks import check_every_process_joins
from ._internal.preparation import Preparation
from ._internal.process_group import default_accelerator, destroy_process_group_at_exit
from ._internal.validation import check_batch_output, check_callbacks, check_trainer_arguments
from .callbacks import (  # the default callbacks are re-exported, as in 0.1.61
    DEFAULT_CALLBACKS,
    CallbackHandler,
    LimitBatchesCallback,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
)
from .callbacks.limits import limit_batches_callback_from_env
from .checkpoints.store import TrainingStateStore
from .data import (
    batches_per_epoch,
    check_same_data_on_every_process,
    check_stream_gave_batches,
    prepare_eval_dataloader,
)
from .loaders import RunLoaders
from .placeholders import TrainerPlaceholderValues, replace_trainer_placeholder_values
from .prediction import model_outputs
from .run_config import RunProgress, RunState, TrainerRunConfig
from .tracking import InMemoryRunHistory, LossTracker, RunHistory
from .utils import remove_padding, worker_init_fn  # re-exported, as in 0.1.61

if TYPE_CHECKING:
    from typing_extensions import Unpack  # (typing's own from Python 3.11)

# fmt: off
__all__ = [  # the last eight: 0.1.61 also exported them from this module
    "Trainer", "TrainerPlaceholderValues", "DEFAULT_CALLBACKS", "TrainerWithTimmScheduler",
    "replace_trainer_placeholder_values", "MoveModulesToDeviceCallback", "TerminateOnNaNCallback",
    "PrintProgressCallback", "ProgressBarCallback", "LogMetricsCallback", "LimitBatchesCallback",
    "remove_padding", "worker_init_fn",
]
# fmt: on


class Trainer:
    """Trains and evaluates a model with a complete, distributed-ready loop.

    Args:
        model: the ``nn.Module`` to train.
        loss_func: ``loss_func(model_outputs, targets)``, used by the default ``calculate_*_batch_loss``.
        optimizer: a ``torch.optim.Optimizer`` (or anything with ``step()`` and ``zero_grad()``).
        callbacks: callback instances or classes, called in this order (replaces the defaults).
        run_history: where metrics are recorded; an :class:`InMemoryRunHistory` by default.

    >>> import torch
    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> data = TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    >>> model = nn.Linear(3, 1)
    >>> trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    >>> trainer.train(data, num_epochs=2, per_device_batch_size=8)
    >>> trainer.progress.global_step  # optimizer updates: 2 epochs x 4 batches
    8
    """

    def __init__(
        self,
        model: nn.Module,
        loss_func: Callable[..., torch.Tensor] | None,
        optimizer: torch.optim.Optimizer | None,
        callbacks: Iterable[TrainerCallback | type[TrainerCallback]] = DEFAULT_CALLBACKS,
        run_history: RunHistory | None = None,
    ) -> None:
        check_trainer_arguments(model, loss_func, optimizer)
        check_callbacks(callbacks)
        self.model, self.loss_func, self.optimizer = model, loss_func, optimizer
        # Compatibility: PT_ACC_LIMIT_BATCHES (set by utils.LimitBatches) limits every epoch.
        env_limit = limit_batches_callback_from_env()
        self.callback_handler = CallbackHandler(callbacks if env_limit is None else (env_limit, *callbacks))
        self.run_history: RunHistory = run_history if run_history is not None else InMemoryRunHistory()
        check_every_process_joins()  # a launch missing a process fails early, not in a hang
        self._accelerator = self._create_accelerator()
        check_accelerator(self._accelerator, type(self)._create_accelerator.__qualname__)
        destroy_process_group_at_exit(self._accelerator)
        if env_limit is not None:
            self.print(env_limit.announcement())
        # The parts, each with its own state (loaders; what was prepared; training states).
        self.loaders = RunLoaders(self._accelerator)
        self._preparation = Preparation(self._accelerator)
        self.state_store = TrainingStateStore(self._accelerator)
        self.scheduler: Any = None
        self.create_scheduler_fn: Callable[..., Any] | None = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self.run_config: TrainerRunConfig | None = None
        self.progress, self.run_state = RunProgress(), RunState()
        self.last_grad_norm: torch.Tensor | None = None
        runs.run_end_event(self, "on_init_end")

    def _create_accelerator(self) -> Accelerator:
        """Create the ``accelerate.Accelerator``; override to set mixed precision, plugins, etc."""
        return default_accelerator()

    # ------------------------------------------------------------------ public entry points

    def train(
        self,
        train_dataset: Any,
        num_epochs: int,
        eval_dataset: Any = None,
        per_device_batch_size: int = 8,
        max_num_train_steps: int | None = None,
        gradient_accumulation_steps: int = 1,
        gradient_clip_value: float | None = None,
        create_scheduler_fn: Callable[[torch.optim.Optimizer], Any] | None = None,
        train_dataloader_kwargs: dict[str, Any] | None = None,
        eval_dataloader_kwargs: dict[str, Any] | None = None,
        reset_run_history: bool = True,
        collate_fn: Callable[..., Any] | None = None,
        resume_from: str | os.PathLike | None = None,
        *,
        max_grad_norm: float | None = None,
        seed: int | None = 42,
    ) -> None:
        """Train for ``num_epochs`` (or ``max_num_train_steps`` updates), evaluating after each epoch.

        ``resume_from``: None (a new run), a training state or a folder of them (its newest complete
        one), or ``"auto"``: the folder of the Trainer's ``SaveTrainingStateCallback`` when it holds a
        state, else a new run, said in one line; the same script then serves every relaunch, and a
        failure repeated at the same update ends the next launch before training (see
        docs/checkpoints.md, "One script for every launch").

        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
        >>> model = nn.Linear(3, 1)
        >>> trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        >>> trainer.train(data, 3, data, per_device_batch_size=8, gradient_accumulation_steps=2)
        >>> trainer.run_config.num_update_steps_per_epoch  # ceil(5 batches / 2)
        3
        >>> len(trainer.run_history.get_metric_values("eval_loss_epoch"))
        3
        """
        arguments = {name: value for name, value in locals().items() if name != "self"}
        runs.train(self, arguments)  # checked, set up, then run through _run_training

    def find_learning_rate(
        self, train_dataset: Any, **settings: Unpack[lr_finder.RangeTestSettings]
    ) -> lr_finder.LRFinderResult:
        """A learning-rate range test: ``num_steps`` updates with the learning rate rising exponentially
        from ``start_lr`` to ``end_lr``, the loss of each recorded; the model, optimizer, scheduler, RNG
        streams and run history are then put back as they were. Settings (keywords) and defaults:
        :func:`pytorch_accelerated.lr_finder.find_learning_rate`; see docs/recipes/tuning.md."""
        return lr_finder.find_learning_rate(self, train_dataset, **settings)

    evaluate = runs.evaluate

    _create_run_config = runs.create_run_config
    create_scheduler = runs.create_scheduler
    get_default_train_dl_kwargs = runs.get_default_train_dl_kwargs
    get_default_eval_dl_kwargs = runs.get_default_eval_dl_kwargs
    create_train_dataloader = runs.create_train_dataloader
    create_eval_dataloader = runs.create_eval_dataloader

    def _prepare_model_optimizer_and_dataloaders(self) -> None:
        """Wrap the model and optimizer for distribution (once) and prepare the data loaders."""
        self.model, self.optimizer, self.loaders.train = self._preparation.prepare(
            self.model, self.optimizer, self.loaders.train
        )
        self.loaders.eval = prepare_eval_dataloader(self._accelerator, self.loaders.eval)

    # ------------------------------------------------------------------ the loop

    def _run_method_then_event(self, name: str, **event_kwargs: Any) -> None:
        getattr(self, name)()
        self.callback_handler.call_event(f"on_{name}", self, **event_kwargs)

    def _run_training(self) -> None:
        """Start the run, then run every epoch: train, evaluate, ``training_run_epoch_end``, until
        ``num_epochs`` or ``max_num_train_steps``. (``train()`` handles stops and failures.)"""
        self._run_method_then_event("training_run_start")
        self.state_store.apply_pending_resume(self.run_state, self.callback_handler)
        while self.progress.epoch < self._config().num_epochs:
            if not self.run_state.epoch_trained:  # trained already when resumed during evaluation
                self._run_train_epoch(self.loaders.train)
                self.run_state.epoch_trained = True
            if self.loaders.eval is not None:
                self._run_eval_epoch(self.loaders.eval)
            self._end_epoch()
            if self._reached_max_steps():
                break

    def _end_epoch(self) -> None:
        # A training state saved during the epoch-end event resumes at the next epoch.
        self.run_state.epoch_finished = True
        try:
            self._run_method_then_event("training_run_epoch_end")
        finally:  # also when a callback stops the run here (early stopping): the epoch is done
            self.progress.start_next_epoch()
            self.run_state.epoch_finished = self.run_state.epoch_trained = False
            self.run_history.set_current_epoch(self.run_state.history_first_epoch + self.progress.epoch)

    def _config(self) -> TrainerRunConfig:
        if self.run_config is None:
            raise RuntimeError("This needs a training run: call trainer.train(...) first.")
        return self.run_config

    def _run_train_epoch(self, train_dl: Any) -> None:
        """Run one training epoch over ``train_dl``, from ``progress.batch_index`` (0 unless resuming)."""
        train_dl = self._start_train_epoch(train_dl)
        config, progress, step_metrics = self._config(), self.progress, self.run_state.step_metrics
        window_weight: Any = 0
        windows = accumulation_windows(
            train_dl, progress.batch_index, config.gradient_accumulation_steps, batches_per_epoch(train_dl)
        )
        for step, batch, window_size, is_update_step in step_metrics.timed(windows):
            self.callback_handler.call_event("on_train_step_start", self)
            # Gradients are only all-reduced on the batch that completes an update.
            batch_output, weight = self._train_on_batch(
                batch, window_size, sync=is_update_step or window_size == 1
            )
            window_weight = window_weight + weight
            if is_update_step:  # False from here on if fp16's scaler skipped the update
                is_update_step = self._update_parameters(window_weight, window_size)
                window_weight = 0
            progress.batch_index = step + 1
            if is_update_step and step_metrics.is_due(progress.global_step):
                self._record_step_metrics()
            self.callback_handler.call_event(
                "on_train_step_end",
                self,
                batch=batch,
                batch_output=batch_output,
                step=step,
                is_update_step=is_update_step,
            )
            if is_update_step and config.train_steps_limit is not None and self._reached_max_steps():
                break
        check_stream_gave_batches(self.progress.batch_index, self.train_dataset)
        loss = self.run_state.train_loss
        self.run_history.update_metric(
            "train_loss_epoch", mean_over_processes(self._accelerator, loss.running_total, loss.count)
        )
        self._run_method_then_event("train_epoch_end")

    def _start_train_epoch(self, train_dl: Any) -> Any:
        sampler = self.run_state.train_sampler
        if sampler is not None and self.loaders.train_generator is not None:
            # Workers' seeds then depend on the epoch only, as the shuffle order does.
            self.loaders.train_generator.manual_seed(sampler.seed + self.progress.epoch)
        loader_before = self.loaders.train
        self._run_method_then_event("train_epoch_start")
        if self.loaders.train is not loader_before:  # replaced by a callback for this epoch
            train_dl = self.loaders.train
        if self.progress.batch_index == 0 and not (
            sampler is not None and sampler.skipped_in(self.progress.epoch)
        ):
            loss = self.run_state.train_loss
            if self.run_state.step_metrics.active:  # the epoch's sum is reset: keep what is not logged yet
                self.run_state.step_metrics.carry_epoch_loss(loss.running_total, loss.count)
            loss.reset()
        else:  # resuming mid-epoch: skip at the sampler level, so skipped batches are never loaded
            train_dl = skip_first_batches(train_dl, self.progress.batch_index)
        self.loaders.set_epoch(train_dl, self.progress.epoch, self.run_state.train_sampler)
        return train_dl

    def _train_on_batch(self, batch: Any, window_size: int, sync: bool) -> tuple[dict[str, Any], Any]:
        """Forward and backward passes of one batch; returns its output and its weight in the window."""
        if not sync:  # the same, inside accelerate's no_sync (a context manager costs ~3 calls)
            with self._accelerator.no_sync(self.model):
                return self._train_on_batch(batch, window_size, sync=True)
        window, run_state = self.run_state.window, self.run_state
        assert window is not None  # set by train()
        batch_output = self.calculate_train_batch_loss(batch)
        check_batch_output(batch_output, "calculate_train_batch_loss")
        weight, loss = window.weight_of(batch_output), batch_output["loss"]
        run_state.train_loss.update(loss, weight)
        if run_state.step_metrics.every_n_steps is not None:  # (step_metrics.active, inlined)
            run_state.step_metrics.batch_done(batch_output)
        try:
            self.backward_step(window.scale(loss, weight, window_size))
        except RuntimeError as error:  # torch's "element 0 of tensors does not require grad"
            explained = loss_without_grad_error(self.model, error)
            if explained is None:
                raise
            raise explained from error
        return batch_output, weight

    def _update_parameters(self, window_weight: Any, window_size: int) -> bool:
        """The update ending an accumulation window: clip, step, schedule, zero, count. False, counting
        nothing, when fp16's gradient scaler skipped it (inf/NaN gradients; docs/recipes/precision.md)."""
        window = self.run_state.window
        assert window is not None  # set by train()
        window.correct_gradients(self.model, window_weight, window_size)
        self._clip_gradients()
        self.optimizer_step()
        # (direct steps have no gradient scaler: never skipped)
        skipped = not self._preparation.direct_steps and self._accelerator.optimizer_step_was_skipped
        if self.scheduler is not None and not skipped:  # as 0.1.61: an override may assume both
            self.scheduler_step()
        self.optimizer_zero_grad()
        if skipped:
            return False
        self.progress.global_step += 1
        self.progress.epoch_step += 1
        self.run_state.step_metrics.update_done()
        return True

    def _record_step_metrics(self) -> None:
        """Measure the step metrics due now (a collective), record them, then fire ``on_step_metrics``
        (before ``on_train_step_end``: a state saved at this step is published after its point is logged)."""
        step = self.progress.global_step
        loss, grad_norm = self.run_state.train_loss, self.last_grad_norm
        metrics = self.run_state.step_metrics.measure(self._accelerator, self.optimizer, loss, grad_norm)
        for name, value in metrics.items():
            self.run_history.update_step_metric(name, step, value)
        self.callback_handler.call_event("on_step_metrics", self, step=step, metrics=metrics)

    def _run_eval_epoch(
        self, eval_dl: Any, is_intermediate: bool = False, is_evaluation_run: bool = False
    ) -> None:
        """Run one evaluation epoch over ``eval_dl`` under ``torch.no_grad()``."""
        loader_before = self.loaders.eval
        self._run_method_then_event("eval_epoch_start", is_intermediate=is_intermediate)
        if self.loaders.eval is not loader_before:  # replaced by a callback for this epoch
            eval_dl = self.loaders.eval
        eval_loss = self.run_state.eval_loss
        eval_loss.reset()
        with torch.no_grad():
            for batch in self.loaders.eval_batches(eval_dl):
                try:
                    self._run_eval_step(batch, eval_loss)
                except Exception as error:
                    self.loaders.explain_padding_failure(error)
                    raise
        # Computed before the end events: a callback there may run another evaluation.
        mean = self.run_state.last_eval_loss = mean_over_processes(
            self._accelerator, eval_loss.running_total, eval_loss.count
        )
        if is_evaluation_run or not is_intermediate:
            self.run_history.update_metric(
                "evaluation_loss" if is_evaluation_run else "eval_loss_epoch", mean
            )
        self._run_method_then_event("eval_epoch_end", is_intermediate=is_intermediate)

    def _run_eval_step(self, batch: Any, eval_loss: LossTracker) -> None:
        self.callback_handler.call_event("on_eval_step_start", self)
        batch_output = self.calculate_eval_batch_loss(batch)
        check_batch_output(batch_output, "calculate_eval_batch_loss")
        if not self.eval_batch_is_padding:  # zero rows, to even out batch counts
            eval_loss.update(batch_output["loss"], batch_output["batch_size"])
        self.callback_handler.call_event("on_eval_step_end", self, batch=batch, batch_output=batch_output)

    def _reached_max_steps(self) -> bool:
        limit = self.run_config.train_steps_limit if self.run_config else None
        return limit is not None and self.progress.global_step >= limit

    def training_run_start(self) -> None:
        """Called at the start of :meth:`train`, before ``on_training_run_start``."""

    def training_run_epoch_end(self) -> None:
        """Called after each train + eval epoch, before ``on_training_run_epoch_end``."""

    def training_run_end(self) -> None:
        """Called at the end of :meth:`train`, before ``on_training_run_end``."""

    def evaluation_run_start(self) -> None:
        """Called at the start of :meth:`evaluate`."""

    def evaluation_run_end(self) -> None:
        """Called at the end of :meth:`evaluate`."""

    def train_epoch_start(self) -> None:
        """Put the model in training mode."""
        self.model.train()

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Return ``{"loss", "model_outputs", "batch_size"}`` for a training batch (the default unpacks
        ``x, y = batch[0], batch[1]``). ``loss`` must be the mean over the batch; to weight batches by a
        count other than samples (e.g. tokens), also return ``num_items_in_batch`` and make ``loss``
        the mean over those items."""
        inputs, targets = unpack_batch(batch, "calculate_train_batch_loss")
        model_outputs = self.model(inputs)
        return {
            "loss": loss_of(self.loss_func, model_outputs, targets, "calculate_train_batch_loss"),
            "model_outputs": model_outputs,
            "batch_size": batch_size_of(inputs),
        }

    def backward_step(self, loss: torch.Tensor) -> None:
        """Compute gradients of ``loss``."""
        if self._preparation.direct_steps:
            loss.backward()  # all that accelerator.backward(loss) does here, but divide by 1
        else:
            self._accelerator.backward(loss)

    def _clip_gradients(self) -> None:
        """Clip gradients by value and/or total norm (only on update steps, after syncing)."""
        config = self.run_config
        if config is None:
            return
        if config.gradient_clip_value is not None:
            self._accelerator.clip_grad_value_(self.model.parameters(), config.gradient_clip_value)
        if config.max_grad_norm is not None:
            self.last_grad_norm = self._accelerator.clip_grad_norm_(
                self.model.parameters(), config.max_grad_norm
            )
        elif self.run_state.step_metrics.wants_grad_norm(self.progress.global_step + 1):  # a logged update
            self.last_grad_norm = self._accelerator.clip_grad_norm_(self.model.parameters(), math.inf)

    def optimizer_step(self) -> None:
        """Update the parameters."""
        self.optimizer.step()  # type: ignore[union-attr]

    def scheduler_step(self) -> None:
        """Step the scheduler; called after each update when there is a scheduler, unless fp16's
        scaler skipped the update."""
        self.scheduler.step()

    def optimizer_zero_grad(self) -> None:
        """Reset the gradients."""
        self.optimizer.zero_grad()  # type: ignore[union-attr]

    def train_epoch_end(self) -> None:
        """Called after each training epoch, once ``train_loss_epoch`` is recorded."""

    def eval_epoch_start(self) -> None:
        """Put the model in evaluation mode."""
        self.model.eval()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        """Return ``{"loss", "model_outputs", "batch_size"}`` for an evaluation batch (for a batch
        of zero rows, a padding batch, the loss is 0 and ``loss_func`` is not called)."""
        inputs, targets = unpack_batch(batch, "calculate_eval_batch_loss")
        model_outputs, batch_size = self.model(inputs), batch_size_of(inputs)
        loss = (
            loss_of(self.loss_func, model_outputs, targets, "calculate_eval_batch_loss")
            if batch_size
            else torch.zeros((), device=self.device)
        )
        return {"loss": loss, "model_outputs": model_outputs, "batch_size": batch_size}

    def eval_epoch_end(self) -> None:
        """Called after each evaluation epoch, once the evaluation loss is recorded."""

    def calculate_predict_batch_outputs(self, batch: Any) -> Any:
        """Return the model's outputs for one batch of :meth:`predict` (one row per sample along dim 0)."""
        return model_outputs(self.model, batch)

    # ------------------------------------------------------------------ utilities, prediction, checkpoints

    def predict(
        self,
        dataset: Any,
        per_device_batch_size: int = 8,
        dataloader_kwargs: dict[str, Any] | None = None,
        collate_fn: Any = None,
        *,
        padding_value: float = 0,
    ) -> Any:
        """The model's outputs for every sample of ``dataset``, in data-set order.

        Each batch goes through :meth:`calculate_predict_batch_outputs` under
        ``torch.no_grad()`` with the model in eval mode (its train/eval mode is restored
        afterwards). Every sample is predicted exactly once, whatever the number of processes,
        and every process gets the same, whole result, **on the CPU**: a tensor for tensor
        outputs (the batches concatenated along dim 0), or the same structure of dicts
        (including a transformers ``ModelOutput``), tuples and lists with each tensor
        concatenated. Every process must call this.

        Works on a fresh Trainer (``optimizer`` and ``loss_func`` may be None; it then sets
        ``run_config`` as :meth:`evaluate` does) and after :meth:`train`. It leaves the run's
        ``eval_dataset``, ``collate_fn`` and evaluation loader as they were, records nothing in
        the run history and fires no callback event.

        Args:
            dataset: a map-style data set (with ``__len__``) of at least one sample.
            per_device_batch_size: samples per batch on each process.
            dataloader_kwargs: ``DataLoader`` arguments merged over
                :meth:`get_default_eval_dl_kwargs` (e.g. ``num_workers``); not ``sampler``,
                ``batch_sampler``, ``shuffle`` or ``drop_last``, which would change the samples
                or their order (to predict on some samples, pass a ``Subset``).
            collate_fn: makes a batch from a list of samples (default: the Trainer's
                ``collate_fn`` from the last ``train``/``evaluate``, else torch's default).
            padding_value: outputs whose sizes beyond dim 0 differ between batches or processes
                (e.g. sequences as long as the longest of their batch) are padded at the end of
                each such dim, up to the largest size seen, with this value.

        Raises:
            ValueError: ``dataset`` is empty, an argument's value is not allowed, or an output
                tensor does not have one row per sample (each message says how to fix it).
            TypeError: ``dataset`` is not map-style, an argument has the wrong type, or an
                output is not made of tensors.

        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> from pytorch_accelerated import Trainer
        >>> model = nn.Linear(2, 1)
        >>> _ = nn.init.ones_(model.weight), nn.init.zeros_(model.bias)  # predicts x0 + x1
        >>> data = TensorDataset(torch.arange(10.0).reshape(5, 2))
        >>> trainer = Trainer(model, loss_func=None, optimizer=None, callbacks=())
        >>> trainer.predict(data, per_device_batch_size=2).flatten().tolist()
        [1.0, 5.0, 9.0, 13.0, 17.0]
        """
        prediction.check_predict_arguments(
            dataset, per_device_batch_size, dataloader_kwargs, collate_fn, padding_value
        )
        check_same_data_on_every_process(self._accelerator, {"dataset": dataset})
        loaders = self.loaders
        saved = self.eval_dataset, self.collate_fn, loaders.merged_kwargs
        self.eval_dataset = dataset
        self.collate_fn = collate_fn if collate_fn is not None else self.collate_fn
        try:
            loader = self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs)
            runs.set_evaluation_run_config(self, per_device_batch_size, dataloader_kwargs)
        finally:
            self.eval_dataset, self.collate_fn, loaders.merged_kwargs = saved
        prediction.check_predict_loader(loader)
        self._prepare_model_optimizer_and_dataloaders()
        loader = prepare_eval_dataloader(self._accelerator, loader)
        batches, padding = loaders.eval_batches(loader), lambda: loaders.eval_batch_is_padding

        def step(batch: Any) -> Any:
            try:
                return self.calculate_predict_batch_outputs(batch)
            except Exception as error:
                loaders.explain_padding_failure(error)
                raise

        return prediction.predict(
            self._accelerator, self.model, loader, batches, step, padding, len(dataset), padding_value
        )

    @property
    def accelerator(self) -> Accelerator:
        """The ``accelerate.Accelerator`` this Trainer runs on (read-only)."""
        return self._accelerator

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._accelerator.device

    @property
    def is_local_process_zero(self) -> bool:
        """True on the main process of each node."""
        return self._accelerator.is_local_main_process

    @property
    def is_world_process_zero(self) -> bool:
        """True on the main process of the whole job."""
        return self._accelerator.is_main_process

    # Methods and properties that only hand over to a part: members of runs
    print = runs.print
    gather = runs.gather
    gather_for_metrics = runs.gather_for_metrics
    any_process = runs.any_process
    get_model = runs.get_model
    running_loss = runs.running_loss
    eval_batch_is_padding = runs.eval_batch_is_padding
    train_dataloader = runs.train_dataloader
    eval_dataloader = runs.eval_dataloader
    run_eval_epoch = runs.run_eval_epoch
    save_checkpoint = runs.save_checkpoint
    load_checkpoint = runs.load_checkpoint
    save_training_state = runs.save_training_state
    wait_for_training_state = runs.wait_for_training_state
    load_training_state = runs.load_training_state


from .timm_schedulers import TrainerWithTimmScheduler  # noqa: E402 (a subclass of the Trainer above)
