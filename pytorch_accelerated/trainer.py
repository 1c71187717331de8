"""The Trainer: ``train`` -> ``_run_training`` -> ``_run_train_epoch`` -> one method per ML step.

Methods without a prefix are meant to be overridden (``create_*`` / ``calculate_*`` / ``get_*``
return a value, the others change state); each is followed by the callback event of the same
name with ``on_`` in front. The order of events is documented in docs/inside-the-trainer.md
and pinned by tests/test_event_order.py.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from accelerate import Accelerator, skip_first_batches
from torch import nn

from ._internal.accelerator_checks import check_accelerator, has_accelerator_device
from ._internal.accumulation import WindowWeighting, accumulation_windows
from ._internal.batch_loss import batch_size_of, loss_of, unpack_batch
from ._internal.distributed import ProcessUtilities, mean_over_processes
from ._internal.hangs import explain_collective_failure
from ._internal.launch_checks import check_every_process_joins
from ._internal.process_group import destroy_process_group_at_exit, process_group_kwargs
from ._internal.validation import (
    check_batch_output,
    check_callbacks,
    check_epochs_have_batches,
    check_evaluate_arguments,
    check_something_left_to_train,
    check_train_arguments,
    check_trainer_arguments,
)
from .callbacks import (  # the default callbacks are re-exported, as in 0.1.61
    DEFAULT_CALLBACKS,
    CallbackHandler,
    LimitBatchesCallback,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    StopTrainingError,
    TerminateOnNaNCallback,
    TrainerCallback,
)
from .callbacks.limits import limit_batches_callback_from_env
from .checkpoints import trainer_io
from .checkpoints.trainer_io import CheckpointMethods
from .data import (
    batches_per_epoch,
    check_same_data_on_every_process,
    check_stream_gave_batches,
)
from .loaders import DataLoaderMethods
from .placeholders import TrainerPlaceholderValues, replace_trainer_placeholder_values
from .prediction import PredictionMethods
from .run_config import RunProgress, RunState, TrainerRunConfig
from .tracking import InMemoryRunHistory, LossTracker, RunHistory
from .utils import remove_padding, worker_init_fn  # re-exported, as in 0.1.61

__all__ = [
    "Trainer",
    "TrainerPlaceholderValues",
    "DEFAULT_CALLBACKS",
    "TrainerWithTimmScheduler",
    "replace_trainer_placeholder_values",
    # 0.1.61 also exported these from this module:
    "MoveModulesToDeviceCallback",
    "TerminateOnNaNCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "LogMetricsCallback",
    "LimitBatchesCallback",
    "remove_padding",
    "worker_init_fn",
]


class Trainer(PredictionMethods, ProcessUtilities, DataLoaderMethods, CheckpointMethods):
    """Trains and evaluates a model with a complete, distributed-ready loop.

    Args:
        model: the ``nn.Module`` to train.
        loss_func: called as ``loss_func(model_outputs, targets)`` by the default
            ``calculate_*_batch_loss``; may be None if those are overridden.
        optimizer: a ``torch.optim.Optimizer`` (accelerate's ``DummyOptim`` under DeepSpeed, or
            anything with ``step()`` and ``zero_grad()``); may be None for evaluation only.
        callbacks: callback instances or classes, called in this order. Replaces
            :data:`DEFAULT_CALLBACKS`; to add to them use ``(*DEFAULT_CALLBACKS, MyCallback())``.
        run_history: where metrics are recorded; an :class:`InMemoryRunHistory` by default.

    Example (``callbacks=()`` keeps it quiet; the defaults print progress and metrics):

    >>> import torch
    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> _ = torch.manual_seed(0)
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
        check_accelerator(self._accelerator)
        if self._accelerator.num_processes > 1:
            destroy_process_group_at_exit()
        if env_limit is not None:
            self.print(env_limit.announcement())
        self.scheduler: Any = None
        self.create_scheduler_fn: Callable[..., Any] | None = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self.run_config: TrainerRunConfig | None = None
        self.progress = RunProgress()
        self.run_state = RunState()
        self.last_grad_norm: torch.Tensor | None = None
        self._train_dataloader: Any = None
        self._eval_dataloader: Any = None
        self._train_generator: torch.Generator | None = None
        self._seed: int | None = None
        self._prepared_model: nn.Module | None = None
        self._prepared_optimizer: Any = None
        self._direct_steps = False
        self._last_eval_loss = float("nan")
        self._run_end_event("on_init_end")

    # ------------------------------------------------------------------ set-up

    def _create_accelerator(self) -> Accelerator:
        """Create the ``accelerate.Accelerator``; override to set mixed precision, plugins, etc.

        Configuration from ``accelerate config``, ``accelerate launch`` or the environment
        applies as usual. Do not set accelerate's ``gradient_accumulation_steps``: pass
        ``gradient_accumulation_steps`` to :meth:`train` instead.

        When the script was launched as a group of processes (``WORLD_SIZE`` > 1) on a machine
        with no accelerator, the processes form a CPU (gloo) group, as ``ACCELERATE_USE_CPU=1``
        would make them: accelerate alone would leave each one training the whole run.
        """
        launched_as_group = int(os.environ.get("WORLD_SIZE", "1")) > 1
        # Collectives time out after PT_ACC_COLLECTIVE_TIMEOUT s, not 30 min (inside-the-trainer.md).
        return Accelerator(
            cpu=launched_as_group and not has_accelerator_device(), kwargs_handlers=process_group_kwargs()
        )

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
        """Train for ``num_epochs`` (or ``max_num_train_steps`` optimizer updates), evaluating
        on ``eval_dataset`` after each epoch.

        Args:
            per_device_batch_size: samples per batch on each process.
            max_num_train_steps: stop after this many optimizer updates (the same number on
                one process and on many); the number of epochs then follows from it.
            gradient_accumulation_steps: batches per optimizer update.
            gradient_clip_value: clip each gradient element to [-v, v] before each update.
            max_grad_norm: clip the total gradient norm to this value before each update.
            create_scheduler_fn: ``f(optimizer) -> scheduler``; stepped once per update.
            resume_from: a directory written by :meth:`save_training_state` (or a folder of
                them: the newest complete one is taken) to continue from, exactly where it was.
            seed: seeds every RNG (python, numpy, torch) and the shuffle order; None leaves
                the RNGs alone.

        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
        >>> model = nn.Linear(3, 1)
        >>> trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        >>> trainer.train(data, num_epochs=3, eval_dataset=data, per_device_batch_size=8,
        ...               gradient_accumulation_steps=2)
        >>> trainer.run_config.num_update_steps_per_epoch  # ceil(5 batches / 2)
        3
        >>> len(trainer.run_history.get_metric_values("eval_loss_epoch"))
        3
        """
        settings: dict[str, Any] = {
            "num_epochs": num_epochs,
            "per_device_batch_size": per_device_batch_size,
            "max_num_train_steps": max_num_train_steps,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "gradient_clip_value": gradient_clip_value,
            "max_grad_norm": max_grad_norm,
        }
        set_up = functools.partial(
            self._set_up_training,
            settings,
            datasets=(train_dataset, eval_dataset),
            dataloader_kwargs=(train_dataloader_kwargs, eval_dataloader_kwargs),
            create_scheduler_fn=create_scheduler_fn,
            collate_fn=collate_fn,
            seed=seed,
            reset_run_history=reset_run_history,
            resume_from=resume_from,
        )
        check_train_arguments(self._accelerator, self.model, self.optimizer, settings, **set_up.keywords)
        self._run_guarded(set_up, self._run_training, end="training_run_end", stopped="Training stopped")

    def _set_up_training(
        self,
        settings: dict[str, Any],
        datasets: tuple[Any, Any],
        dataloader_kwargs: tuple[dict[str, Any] | None, dict[str, Any] | None],
        create_scheduler_fn: Callable[..., Any] | None,
        collate_fn: Callable[..., Any] | None,
        seed: int | None,
        reset_run_history: bool,
        resume_from: str | os.PathLike | None,
    ) -> None:
        """Everything before the run starts: loaders, preparation, run config, scheduler, resume."""
        self._start_run(datasets, collate_fn, seed, reset_run_history)
        check_same_data_on_every_process(
            self._accelerator, {"train_dataset": datasets[0], "eval_dataset": datasets[1]}
        )
        self.create_scheduler_fn = create_scheduler_fn
        self._create_dataloaders(settings["per_device_batch_size"], *dataloader_kwargs)
        self._prepare_model_optimizer_and_dataloaders()
        check_epochs_have_batches(self)
        self.run_config = self._create_run_config(
            **settings, **self._run_config_dl_kwargs(*dataloader_kwargs)
        )
        self.scheduler = self.create_scheduler() if create_scheduler_fn is not None else None
        self.run_state.window = WindowWeighting(
            self._accelerator, self.run_config.train_per_device_batch_size
        )
        if resume_from is not None:
            trainer_io.resume_training(self, resume_from)  # through the overridable load_training_state
            check_something_left_to_train(self.progress, self.run_config, resume_from)

    def _start_run(
        self, datasets: tuple[Any, Any], collate_fn: Any, seed: int | None, reset_run_history: bool
    ) -> None:
        self.train_dataset, self.eval_dataset = datasets
        self.collate_fn = collate_fn
        self._eval_dataloader = None
        self._set_seed(seed)
        if reset_run_history:
            self.run_history.reset()
            self.run_history.reset_step_metrics()
        self.last_grad_norm = None
        self.progress = RunProgress()
        self.run_state = RunState(history_first_epoch=self.run_history.current_epoch)

    def evaluate(
        self,
        dataset: Any = None,
        per_device_batch_size: int = 8,
        dataloader_kwargs: dict[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        *,
        seed: int | None = 42,
    ) -> dict[str, Any]:
        """Run one evaluation epoch over ``dataset`` (default: the last ``eval_dataset``).

        Records ``evaluation_loss`` in the run history, leaving the training history intact,
        and returns every metric recorded during the evaluation. A ``StopTrainingError`` raised
        during it ends the evaluation at that batch; nothing partial is recorded.

        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(10, 3), torch.zeros(10, 1))
        >>> model = nn.Linear(3, 1)
        >>> _ = nn.init.zeros_(model.weight), nn.init.ones_(model.bias)  # predicts 1 everywhere
        >>> Trainer(model, nn.MSELoss(), optimizer=None, callbacks=()).evaluate(data)
        {'evaluation_loss': 1.0}
        """
        dataset = dataset if dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError(
                "evaluate() needs a dataset: pass evaluate(dataset=...) or train with an eval_dataset."
            )
        check_evaluate_arguments(dataset, per_device_batch_size, dataloader_kwargs, collate_fn, seed)
        recorded_before = self._metric_counts()
        set_up = functools.partial(
            self._set_up_evaluation, dataset, per_device_batch_size, dataloader_kwargs, collate_fn, seed
        )
        self._run_guarded(
            set_up, self._run_evaluation, end="evaluation_run_end", stopped="Evaluation stopped"
        )
        return {
            name: self.run_history.get_latest_metric(name)
            for name, count in self._metric_counts().items()
            if count > recorded_before.get(name, 0)
        }

    def _set_up_evaluation(
        self,
        dataset: Any,
        batch_size: int,
        dataloader_kwargs: dict[str, Any] | None,
        collate_fn: Any,
        seed: int | None,
    ) -> None:
        check_same_data_on_every_process(self._accelerator, {"dataset": dataset})
        self.eval_dataset = dataset
        if collate_fn is not None:
            self.collate_fn = collate_fn
        self._set_seed(seed)
        self._eval_dataloader = self.create_eval_dataloader(batch_size, dataloader_kwargs)
        self._set_evaluation_run_config(batch_size, dataloader_kwargs)
        self._prepare_model_optimizer_and_dataloaders()
        check_epochs_have_batches(self, evaluation=True)

    def _run_evaluation(self) -> None:
        self._run_method_then_event("evaluation_run_start")
        self._run_eval_epoch(self._eval_dataloader, is_evaluation_run=True)

    def _metric_counts(self) -> dict[str, int]:
        history = self.run_history
        return {name: len(history.get_metric_values(name)) for name in history.get_metric_names()}

    # ------------------------------------------------------------------ run config and scheduler

    def _create_run_config(
        self,
        per_device_batch_size: int,
        num_epochs: int,
        gradient_accumulation_steps: int,
        max_num_train_steps: int | None,
        gradient_clip_value: float | None,
        train_dl_kwargs: dict[str, Any] | None = None,
        eval_dl_kwargs: dict[str, Any] | None = None,
        max_grad_norm: float | None = None,
    ) -> TrainerRunConfig:
        """Return the frozen :class:`TrainerRunConfig` for this run."""
        return TrainerRunConfig.for_run(
            self._accelerator,
            num_batches_per_epoch=batches_per_epoch(self._train_dataloader),
            per_device_batch_size=per_device_batch_size,
            num_epochs=num_epochs,
            gradient_accumulation_steps=gradient_accumulation_steps,
            max_num_train_steps=max_num_train_steps,
            gradient_clip_value=gradient_clip_value,
            max_grad_norm=max_grad_norm,
            train_dl_kwargs=train_dl_kwargs,
            eval_dl_kwargs=eval_dl_kwargs,
            seed=self._seed,
        )

    def create_scheduler(self) -> Any:
        """Return the scheduler made by ``create_scheduler_fn`` with placeholders resolved."""
        scheduler_fn = replace_trainer_placeholder_values(self, self.create_scheduler_fn)
        return scheduler_fn(self.optimizer)

    # ------------------------------------------------------------------ the loop

    def _run_method_then_event(self, name: str, **event_kwargs: Any) -> None:
        getattr(self, name)()
        self.callback_handler.call_event(f"on_{name}", self, **event_kwargs)

    def _run_guarded(
        self, set_up: Callable[[], None], body: Callable[[], None], end: str, stopped: str
    ) -> None:
        """Set up, run ``body`` (which fires the start hooks), then the end hook ``end`` and its event.

        Set-up fires no event: a :class:`StopTrainingError` there ends it before anything started,
        any other exception reaches the caller as it is. From ``body`` on, a ``StopTrainingError``
        ends it cleanly (``on_stop_training_error``, then the end hooks) and any other exception
        fires ``on_exception``, then reaches the caller unchanged.
        """
        try:
            set_up()
        except StopTrainingError as error:
            self.print(f"{stopped} before it started: {error}")
            return
        with self._announcing_failures(), trainer_io.finishing_background_saves(self):
            try:
                body()
            except StopTrainingError as error:
                self.print(f"{stopped}: {error}")
                self._run_end_event("on_stop_training_error")
            self._run_end_event(end)

    @contextmanager
    def _announcing_failures(self) -> Iterator[None]:
        try:
            yield
        except StopTrainingError:
            raise
        except BaseException as error:
            explain_collective_failure(self, error)  # a note: which rank, where, probably why
            self.callback_handler.call_exception_event(self, error)
            raise

    def _run_end_event(self, name: str) -> None:
        """Run the end hook ``name`` (an overridable method, if there is one) and its event; a
        :class:`StopTrainingError` raised in it skips the rest of it."""
        try:
            if not name.startswith("on_"):
                getattr(self, name)()
            self.callback_handler.call_event(name if name.startswith("on_") else f"on_{name}", self)
        except StopTrainingError as error:
            self.print(f"Stopped during {name}: {error}")

    def _run_training(self) -> None:
        """Start the run, then run every epoch: train, evaluate, ``training_run_epoch_end``, until
        ``num_epochs`` or ``max_num_train_steps``. (``train()`` handles stops and failures.)"""
        self._run_method_then_event("training_run_start")
        trainer_io.apply_pending_resume(self)
        while self.progress.epoch < self._config().num_epochs:
            if not self.run_state.epoch_trained:  # trained already when resumed during evaluation
                self._run_train_epoch(self._train_dataloader)
                self.run_state.epoch_trained = True
            if self._eval_dataloader is not None:
                self._run_eval_epoch(self._eval_dataloader)
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
        accumulation = self._config().gradient_accumulation_steps
        window_weight: Any = 0
        windows = accumulation_windows(
            train_dl, self.progress.batch_index, accumulation, batches_per_epoch(train_dl)
        )
        for step, batch, window_size, is_update_step in self.run_state.step_metrics.timed(windows):
            self.callback_handler.call_event("on_train_step_start", self)
            # Gradients are only all-reduced on the batch that completes an update.
            batch_output, weight = self._train_on_batch(
                batch, window_size, sync=is_update_step or window_size == 1
            )
            window_weight = window_weight + weight
            if is_update_step:  # False from here on if fp16's scaler skipped the update
                is_update_step = self._update_parameters(window_weight, window_size)
                window_weight = 0
            self.progress.batch_index = step + 1
            if is_update_step and self.run_state.step_metrics.is_due(self.progress.global_step):
                self._record_step_metrics()
            self.callback_handler.call_event(
                "on_train_step_end",
                self,
                batch=batch,
                batch_output=batch_output,
                step=step,
                is_update_step=is_update_step,
            )
            if is_update_step and self._reached_max_steps():
                break
        check_stream_gave_batches(self.progress.batch_index, self.train_dataset)
        self._record_mean_loss(self.run_state.train_loss, "train_loss_epoch")
        self._run_method_then_event("train_epoch_end")

    def _start_train_epoch(self, train_dl: Any) -> Any:
        sampler = self.run_state.train_sampler
        if sampler is not None and self._train_generator is not None:
            # Workers' seeds then depend on the epoch only, as the shuffle order does.
            self._train_generator.manual_seed(sampler.seed + self.progress.epoch)
        loader_before = self._train_dataloader
        self._run_method_then_event("train_epoch_start")
        if self._train_dataloader is not loader_before:  # replaced by a callback for this epoch
            train_dl = self._train_dataloader
        if self.progress.batch_index == 0 and not (
            sampler is not None and sampler.skipped_in(self.progress.epoch)
        ):
            loss = self.run_state.train_loss
            if self.run_state.step_metrics.active:  # the epoch's sum is reset: keep what is not logged yet
                self.run_state.step_metrics.carry_epoch_loss(loss.running_total, loss.count)
            loss.reset()
        else:  # resuming mid-epoch: skip at the sampler level, so skipped batches are never loaded
            train_dl = skip_first_batches(train_dl, self.progress.batch_index)
        self._set_epoch(train_dl, self.progress.epoch)
        return train_dl

    def _train_on_batch(self, batch: Any, window_size: int, sync: bool) -> tuple[dict[str, Any], Any]:
        """Forward and backward passes of one batch; returns its output and its weight in the window."""
        window = self.run_state.window
        assert window is not None  # set by train()
        with nullcontext() if sync else self._accelerator.no_sync(self.model):
            batch_output = self.calculate_train_batch_loss(batch)
            check_batch_output(batch_output, "calculate_train_batch_loss")
            weight = window.weight_of(batch_output)
            self.run_state.train_loss.update(batch_output["loss"], weight)
            if self.run_state.step_metrics.active:
                self.run_state.step_metrics.batch_done(batch_output)
            self.backward_step(window.scale(batch_output["loss"], weight, window_size))
        return batch_output, weight

    def _update_parameters(self, window_weight: Any, window_size: int) -> bool:
        """The update at the end of an accumulation window: clip, step, schedule, zero, count.

        Returns False, counting nothing, when the update was skipped (fp16's gradient scaler
        found inf/NaN gradients): the parameters did not change (docs/recipes/precision.md).
        """
        window = self.run_state.window
        assert window is not None  # set by train()
        window.correct_gradients(self.model.parameters(), window_weight, window_size)
        self._clip_gradients()
        self.optimizer_step()
        self.scheduler_step()
        self.optimizer_zero_grad()
        if not self._direct_steps and self._accelerator.optimizer_step_was_skipped:  # no scaler: never
            return False
        self.progress.global_step += 1
        self.progress.epoch_step += 1
        self.run_state.step_metrics.update_done()
        return True

    def _record_step_metrics(self) -> None:
        """Measure the step metrics due now (a collective), record them in the run history,
        then fire ``on_step_metrics``: before ``on_train_step_end``, so a state saved at this
        step is published after its point was logged."""
        step = self.progress.global_step
        metrics = self.run_state.step_metrics.measure(self)
        for name, value in metrics.items():
            self.run_history.update_step_metric(name, step, value)
        self.callback_handler.call_event("on_step_metrics", self, step=step, metrics=metrics)

    def _set_epoch(self, dataloader: Any, epoch: int) -> None:
        # accelerate's loaders pass their own iteration count to the sampler when iterated, so
        # they must be told the epoch too (a fresh or resumed loader would start again at 0).
        if hasattr(dataloader, "set_epoch"):
            dataloader.set_epoch(epoch)
        if self.run_state.train_sampler is not None:
            self.run_state.train_sampler.set_epoch(epoch)

    def _run_eval_epoch(
        self, eval_dl: Any, is_intermediate: bool = False, is_evaluation_run: bool = False
    ) -> None:
        """Run one evaluation epoch over ``eval_dl`` under ``torch.no_grad()``."""
        loader_before = self._eval_dataloader
        self.eval_epoch_start()
        self.callback_handler.call_event("on_eval_epoch_start", self, is_intermediate=is_intermediate)
        if self._eval_dataloader is not loader_before:  # replaced by a callback for this epoch
            eval_dl = self._eval_dataloader
        eval_loss = self.run_state.eval_loss
        eval_loss.reset()
        with torch.no_grad():
            for batch in self._eval_batches(eval_dl):
                self.callback_handler.call_event("on_eval_step_start", self)
                batch_output = self.calculate_eval_batch_loss(batch)
                check_batch_output(batch_output, "calculate_eval_batch_loss")
                if not self.eval_batch_is_padding:  # a repeated sample, to even out batch counts
                    eval_loss.update(batch_output["loss"], batch_output["batch_size"])
                self.callback_handler.call_event(
                    "on_eval_step_end", self, batch=batch, batch_output=batch_output
                )
        # Computed before the end events: a callback there may run another evaluation.
        self._last_eval_loss = self._mean_over_processes(eval_loss)
        if is_evaluation_run:
            self.run_history.update_metric("evaluation_loss", self._last_eval_loss)
        elif not is_intermediate:
            self.run_history.update_metric("eval_loss_epoch", self._last_eval_loss)
        self.eval_epoch_end()
        self.callback_handler.call_event("on_eval_epoch_end", self, is_intermediate=is_intermediate)

    def run_eval_epoch(
        self,
        dataloader: Any = None,
        *,
        model: nn.Module | None = None,
        is_intermediate: bool = True,
        metric_name_prefix: str = "",
    ) -> float:
        """Run an extra evaluation epoch during training, for callbacks; return its mean loss.

        Args:
            dataloader: what to evaluate on (default: the run's evaluation loader).
            model: evaluate this model (e.g. an EMA copy) in place of ``trainer.model``.
            is_intermediate: passed to the eval events; an intermediate evaluation records no
                ``eval_loss_epoch``.
            metric_name_prefix: prefix for every metric recorded during this epoch.

        The model's train/eval mode, ``trainer.model`` and the history's prefix are restored
        afterwards, so training continues exactly as before. Every process must call this.
        """
        dataloader = dataloader if dataloader is not None else self._eval_dataloader
        if dataloader is None:
            raise ValueError("run_eval_epoch() needs a dataloader: this run has no eval_dataset.")
        original_model, original_loader = self.model, self._eval_dataloader
        previous_prefix = self.run_history.metric_name_prefix
        was_training = original_model.training
        self.model, self._eval_dataloader = model if model is not None else original_model, dataloader
        self.run_history.set_metric_name_prefix(metric_name_prefix)
        try:
            self._run_eval_epoch(dataloader, is_intermediate=is_intermediate)
            return self._last_eval_loss
        finally:
            self.model, self._eval_dataloader = original_model, original_loader
            self.run_history.set_metric_name_prefix(previous_prefix)
            original_model.train(was_training)

    def _reached_max_steps(self) -> bool:
        limit = self.run_config.train_steps_limit if self.run_config else None
        return limit is not None and self.progress.global_step >= limit

    # ------------------------------------------------------------------ loss means

    def _mean_over_processes(self, tracker: LossTracker) -> float:
        return mean_over_processes(self._accelerator, tracker.running_total, tracker.count)

    def _record_mean_loss(self, tracker: LossTracker, metric_name: str) -> None:
        self.run_history.update_metric(metric_name, self._mean_over_processes(tracker))

    # ------------------------------------------------------------------ overridable: steps

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
        """Return ``{"loss", "model_outputs", "batch_size"}`` for a training batch.

        The default unpacks ``x, y = batch[0], batch[1]``. ``loss`` must be the mean over the
        batch; to weight batches by a count other than samples (e.g. tokens), also return
        ``num_items_in_batch`` and make ``loss`` the mean over those items.
        """
        inputs, targets = unpack_batch(batch, "calculate_train_batch_loss")
        model_outputs = self.model(inputs)
        return {
            "loss": self._loss(model_outputs, targets, "calculate_train_batch_loss"),
            "model_outputs": model_outputs,
            "batch_size": batch_size_of(inputs),
        }

    def backward_step(self, loss: torch.Tensor) -> None:
        """Compute gradients of ``loss``."""
        if self._direct_steps:
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
        """Step the scheduler once per update, unless the update was skipped (fp16 overflow)."""
        if self.scheduler is not None and not self._accelerator.optimizer_step_was_skipped:
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
        """Return ``{"loss", "model_outputs", "batch_size"}`` for an evaluation batch."""
        inputs, targets = unpack_batch(batch, "calculate_eval_batch_loss")
        model_outputs = self.model(inputs)
        return {
            "loss": self._loss(model_outputs, targets, "calculate_eval_batch_loss"),
            "model_outputs": model_outputs,
            "batch_size": batch_size_of(inputs),
        }

    def eval_epoch_end(self) -> None:
        """Called after each evaluation epoch, once the evaluation loss is recorded."""

    def _loss(self, model_outputs: Any, targets: Any, method: str) -> torch.Tensor:
        if self.loss_func is None:
            raise ValueError(
                f"The default {method} needs a loss function, but the Trainer was created with "
                f"loss_func=None. Pass one, e.g. Trainer(model, nn.CrossEntropyLoss(), optimizer), "
                f"or override {method}."
            )
        return loss_of(self.loss_func, model_outputs, targets)

    # ------------------------------------------------------------------ utilities

    @property
    def running_loss(self) -> float:
        """The mean training loss of the current epoch so far on this process.

        Reading it copies a value from the device: a sync point, so read it sparingly.
        """
        return self.run_state.train_loss.average


class TrainerWithTimmScheduler(Trainer):
    """A Trainer for timm schedulers, which are stepped per update and per epoch.

    timm schedulers take the number of the update or epoch that comes next:
    ``step_update(num_updates)`` after each optimizer update and ``step(epoch)`` after each
    epoch (with the evaluation loss, when there is one, as the metric).
    """

    def scheduler_step(self) -> None:
        if self.scheduler is not None and not self._accelerator.optimizer_step_was_skipped:
            self.scheduler.step_update(num_updates=self.progress.global_step + 1)

    def training_run_epoch_end(self) -> None:
        if self.scheduler is None:
            return
        metric = None
        if self._eval_dataloader is not None:  # this run evaluated: its loss is the metric
            metric = self.run_history.get_latest_metric("eval_loss_epoch")
        self.scheduler.step(epoch=self.progress.epoch + 1, metric=metric)
