"""The Trainer: ``train`` -> ``_run_training`` -> ``_run_train_epoch`` -> one method per ML step.

Every member of the Trainer is written in its class, which reads as the table of contents of the
library: the entry points, what a run is made of (overridable factories), how a run starts and ends,
the loop, the steps, the process utilities and the checkpoint methods. It holds its parts as objects
(``loaders``, ``state_store``, what was prepared); a member that hands its work to a part is a few
lines. See docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator, skip_first_batches
from accelerate.utils import broadcast_object_list
from torch import nn
from torch.utils.data import DataLoader

from . import lr_finder, prediction
from ._internal import distributed
from ._internal.accelerator_checks import check_accelerator
from ._internal.accumulation import WindowWeighting, accumulation_windows
from ._internal.argument_checks import (
    check_batch_output,
    check_callbacks,
    check_epoch_has_batches,
    check_evaluate_arguments,
    check_something_left_to_train,
    check_train_arguments,
    check_trainer_arguments,
    check_whole_number,
    epochs_trained,
)
from ._internal.batch_loss import batch_size_of, loss_of, loss_without_grad_error, unpack_batch
from ._internal.distributed import mean_over_processes, print_once_per_node
from ._internal.errors import ends_run_on_purpose
from ._internal.hangs import describe_position, explain_collective_failure
from ._internal.launch_checks import check_every_process_joins
from ._internal.preparation import Preparation
from ._internal.process_group import default_accelerator, destroy_process_group_at_exit
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
from .callbacks.training_state import auto_resume_folder, stopped_by_signal
from .checkpoints import model_files
from .checkpoints.auto_resume import AUTO, AutoResume, training_began
from .checkpoints.resume import Resumed, ResumePlan
from .checkpoints.rng import capture_rng_states
from .checkpoints.store import TrainingStateStore
from .checkpoints.training_objects import TrainingObjects
from .data import (
    batches_per_epoch,
    check_same_data_on_every_process,
    check_stream_gave_batches,
    prepare_eval_dataloader,
)
from .loaders import TrainerLoaders
from .placeholders import TrainerPlaceholderValues, replace_trainer_placeholder_values
from .prediction import model_outputs
from .run_config import CutShort, LoopState, RunIdentity, RunProgress, TrainerRunConfig
from .run_history import InMemoryRunHistory, LossTracker, RunHistory
from .train_arguments import TrainArguments
from .utils import remove_padding, worker_init_fn  # re-exported, as in 0.1.61

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
        self.loaders = TrainerLoaders(self._accelerator)
        self._preparation = Preparation(self._accelerator)
        self.state_store = TrainingStateStore(self._accelerator)
        self.scheduler: Any = None
        self.create_scheduler_fn: Callable[..., Any] | None = None
        self.collate_fn: Callable[..., Any] | None = None
        self.train_dataset: Any = None
        self.eval_dataset: Any = None
        self.run_config: TrainerRunConfig | None = None
        self.progress, self.run_identity, self.loop_state = RunProgress(), RunIdentity(), LoopState()
        self.last_grad_norm: torch.Tensor | None = None
        self._resumed: Resumed | None = None  # what train(resume_from=...) restored, for the run's start
        self._train_calls = 0  # train() calls so far: each is a stage of the script (resume_from="auto")
        self._run_end_event("on_init_end")

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
        arguments = TrainArguments(
            train_dataset=train_dataset,
            num_epochs=num_epochs,
            eval_dataset=eval_dataset,
            per_device_batch_size=per_device_batch_size,
            max_num_train_steps=max_num_train_steps,
            gradient_accumulation_steps=gradient_accumulation_steps,
            gradient_clip_value=gradient_clip_value,
            create_scheduler_fn=create_scheduler_fn,
            train_dataloader_kwargs=train_dataloader_kwargs,
            eval_dataloader_kwargs=eval_dataloader_kwargs,
            reset_run_history=reset_run_history,
            collate_fn=collate_fn,
            resume_from=resume_from,
            max_grad_norm=max_grad_norm,
            seed=seed,
        )
        check_train_arguments(self._accelerator, self.model, self.optimizer, arguments)
        self._train(arguments)

    def _train(self, arguments: TrainArguments) -> None:
        """What ``train()`` does with its checked ``arguments``: choose the state to resume, once
        (:class:`~.checkpoints.resume.ResumePlan`), set up, then ``_run_training`` guarded (stops,
        failures and the end hooks; see :meth:`_run_guarded`)."""
        stage = self._train_calls + 1  # this call's stage (states record it); a refused call is none
        plan, relaunch, body = None, None, self._run_training
        if arguments.resume_from == AUTO:  # decided now, by every process alike
            folder = auto_resume_folder(self.callback_handler)
            if stage > 1 and stopped_by_signal(self.callback_handler):
                self.print(
                    f'resume_from="auto": stage {stage} does not start: stage {stage - 1} was stopped by a '
                    f"signal before it finished (its state is saved in {folder}). End the script when "
                    f"SaveTrainingStateCallback.signal_received is set; its relaunch resumes stage {stage - 1}."
                )
                return
            relaunch = AutoResume(self._accelerator, folder, stage=stage)
            plan = relaunch.choose()
            body = functools.partial(self._recording_failures, relaunch)
        elif arguments.resume_from is not None:
            plan = ResumePlan.of(arguments.resume_from)
        self._train_calls = stage
        if relaunch is not None and relaunch.stage_finished:  # a later stage resumes its own state
            return
        set_up = functools.partial(self._set_up_training, arguments, plan, relaunch)
        stop = self._run_guarded(set_up, body, end="training_run_end", stopped="Training stopped")
        if stop is not None and stop.exit_code is not None:  # a signal's stop under torchrun: see its line
            raise SystemExit(stop.exit_code)

    def find_learning_rate(
        self,
        train_dataset: Any,
        per_device_batch_size: int = 8,
        start_lr: float = 1e-7,
        end_lr: float = 10.0,
        num_steps: int = 100,
        gradient_accumulation_steps: int = 1,
        collate_fn: Callable[..., Any] | None = None,
        train_dataloader_kwargs: dict[str, Any] | None = None,
        *,
        divergence_factor: float | None = lr_finder.DIVERGENCE_FACTOR,
        smoothing: float = lr_finder.SMOOTHING,
        gradient_clip_value: float | None = None,
        max_grad_norm: float | None = None,
        seed: int | None = 42,
    ) -> lr_finder.LRFinderResult:
        """A learning-rate range test: ``num_steps`` updates with the learning rate rising exponentially.

        Train ``num_steps`` updates with the learning rate of every param group rising exponentially
        from ``start_lr`` to ``end_lr`` and record each update's loss; then put the model, optimizer,
        scheduler, RNG streams and run history back as they were, so that a later ``train()`` is the
        one it would have been without the test (see :mod:`pytorch_accelerated.lr_finder` for how; docs/recipes/tuning.md).

        The test runs through the Trainer's own loop (its loaders, accumulation, batch-loss and step
        methods, on every process: every process must call it). None of its callbacks is told of it
        but those that place modules on the device (``MoveModulesToDeviceCallback``): no state is
        saved, nothing is logged or drawn. The loss of each update is its mean over all processes;
        the test stops once the smoothed loss exceeds ``divergence_factor`` times its lowest value
        (checked every 10 updates; the result ends at the update where it first did). It prints one
        line saying how it ended and what it suggests.

        Args:
            train_dataset: the data set to train on, as for ``train()``.
            per_device_batch_size: samples per batch on each process (the global batch is this times
                the number of processes times ``gradient_accumulation_steps``).
            start_lr: the learning rate of the first update, > 0.
            end_lr: the learning rate of the last update, > ``start_lr``.
            num_steps: optimizer updates, >= 2 (the data set is passed over again as needed).
            gradient_accumulation_steps: batches per update, as for ``train()``.
            collate_fn: makes a batch from a list of samples, as for ``train()``.
            train_dataloader_kwargs: ``DataLoader`` arguments, as for ``train()``.
            divergence_factor: stop once the smoothed loss exceeds this many times its lowest value
                so far (> 1), or None to run every update (a loss that is not finite always stops
                it). The rule assumes a positive loss.
            smoothing: the weight of the past in the loss's exponential moving average, from 0
                (none) to below 1.
            gradient_clip_value: clip gradients by value, as for ``train()``.
            max_grad_norm: clip gradients by total norm, as for ``train()``.
            seed: seeds the shuffle order and every RNG during the test (they are put back
                afterwards); None leaves them as they are.

        Returns:
            The :class:`LRFinderResult`: ``learning_rates``, ``losses`` and ``smoothed_losses`` (one
            entry per update), ``suggestion`` (:func:`suggest_learning_rate`), ``diverged``, ``plot(path)``.

        Raises:
            ValueError: an argument is out of range (the message names it, the value and what is
                allowed), or the run uses DeepSpeed or FSDP, whose engines hold the state the test
                must put back.

        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> from pytorch_accelerated import Trainer
        >>> x = torch.randn(256, 3, generator=torch.Generator().manual_seed(0))
        >>> data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        >>> _ = torch.manual_seed(0)
        >>> model = nn.Linear(3, 1)
        >>> trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        >>> result = trainer.find_learning_rate(data, per_device_batch_size=16, start_lr=1e-4, end_lr=10.0, num_steps=40)
        Training stopped: the learning-rate range test ends at update 38 (lr 5.54): the loss diverged (...)
        Learning-rate range test from 0.0001 to 10 over 40 updates: the loss diverged at update 38 (lr 5.54); suggestion 0.307
        >>> len(result.losses), round(result.learning_rates[0], 6), result.suggestion < 2.0  # SGD diverges above 2 here
        (38, 0.0001, True)
        >>> group = trainer.optimizer.param_groups[0]
        >>> group["lr"], trainer.progress.global_step  # as before the test
        (0.1, 0)
        """
        settings = lr_finder.RangeTestSettings(
            per_device_batch_size,
            start_lr,
            end_lr,
            num_steps,
            gradient_accumulation_steps,
            collate_fn,
            train_dataloader_kwargs,
            divergence_factor,
            smoothing,
            gradient_clip_value,
            max_grad_norm,
            seed,
        )
        return lr_finder.find_learning_rate(self, train_dataset, settings)

    def evaluate(
        self,
        dataset: Any = None,
        per_device_batch_size: int = 8,
        dataloader_kwargs: dict[str, Any] | None = None,
        collate_fn: Callable[..., Any] | None = None,
        *,
        seed: int | None = 42,
    ) -> dict[str, Any]:
        """Run one evaluation epoch over ``dataset`` (default: the last ``eval_dataset``); return its metrics.

        >>> import torch
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> from pytorch_accelerated import Trainer
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
        history = self.run_history
        before = history.metric_counts()

        def set_up() -> None:  # everything before the evaluation runs: the data set, its loader, preparation
            check_same_data_on_every_process(self._accelerator, {"dataset": dataset})
            self.eval_dataset = dataset
            if collate_fn is not None:
                self.collate_fn = collate_fn
            self.loaders.set_seed(seed)
            self.loaders.eval = self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs)
            self._set_evaluation_run_config(per_device_batch_size, dataloader_kwargs)
            self._prepare_model_optimizer_and_dataloaders()
            check_epoch_has_batches(self.loaders.eval, dataset, "dataset", self._accelerator.num_processes)

        def body() -> None:
            self.evaluation_run_start()
            self.callback_handler.call_event("on_evaluation_run_start", self)
            self._run_eval_epoch(self.loaders.eval, is_evaluation_run=True)

        self._run_guarded(set_up, body, end="evaluation_run_end", stopped="Evaluation stopped")
        counts = history.metric_counts()
        return {
            name: history.get_latest_metric(name) for name in counts if counts[name] > before.get(name, 0)
        }

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
            self._set_evaluation_run_config(per_device_batch_size, dataloader_kwargs)
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

    def run_eval_epoch(
        self,
        dataloader: Any = None,
        *,
        model: nn.Module | None = None,
        is_intermediate: bool = True,
        metric_name_prefix: str = "",
    ) -> float:
        """Run an extra evaluation epoch during training, for callbacks (on ``model``, e.g. an EMA
        copy; with its metrics' names prefixed); return its mean loss.

        Args:
            dataloader: what to evaluate on (default: the run's evaluation loader).
            model: evaluate this model (e.g. an EMA copy) in place of ``trainer.model``.
            is_intermediate: passed to the eval events; an intermediate evaluation records no
                ``eval_loss_epoch``.
            metric_name_prefix: prefix for every metric recorded during this epoch.

        The model's train/eval mode, ``trainer.model`` and the history's prefix are restored
        afterwards, so training continues exactly as before. Every process must call this.
        """
        dataloader = dataloader if dataloader is not None else self.loaders.eval
        if dataloader is None:
            raise ValueError("run_eval_epoch() needs a dataloader: this run has no eval_dataset.")
        original_model, original_loader = self.model, self.loaders.eval
        previous_prefix = self.run_history.metric_name_prefix
        was_training = original_model.training
        self.model, self.loaders.eval = model if model is not None else original_model, dataloader
        self.run_history.set_metric_name_prefix(metric_name_prefix)
        try:
            self._run_eval_epoch(dataloader, is_intermediate=is_intermediate)
            return self.loop_state.last_eval_loss
        finally:
            self.model, self.loaders.eval = original_model, original_loader
            self.run_history.set_metric_name_prefix(previous_prefix)
            original_model.train(was_training)

    # ------------------------------------------------------------------ what a run is made of (overridable)

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
            num_batches_per_epoch=batches_per_epoch(self.loaders.train),
            per_device_batch_size=per_device_batch_size,
            num_epochs=num_epochs,
            gradient_accumulation_steps=gradient_accumulation_steps,
            max_num_train_steps=max_num_train_steps,
            gradient_clip_value=gradient_clip_value,
            max_grad_norm=max_grad_norm,
            train_dl_kwargs=train_dl_kwargs,
            eval_dl_kwargs=eval_dl_kwargs,
            seed=self.loaders.seed,
        )

    def create_scheduler(self) -> Any:
        """Return the scheduler made by ``create_scheduler_fn`` with placeholders resolved."""
        return replace_trainer_placeholder_values(self, self.create_scheduler_fn)(self.optimizer)

    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Data-loader arguments for training; ``train_dataloader_kwargs`` are merged over them."""
        return self.loaders.default_kwargs(self.train_dataset, batch_size, shuffle=True)

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Data-loader arguments for evaluation; ``eval_dataloader_kwargs`` are merged over them."""
        return self.loaders.default_kwargs(self.eval_dataset, batch_size, shuffle=False)

    def create_train_dataloader(
        self, batch_size: int, train_dl_kwargs: dict[str, Any] | None = None
    ) -> DataLoader:
        """Return the training ``DataLoader`` (before it is prepared for distribution)."""
        kwargs = self.loaders.merge("train", self.get_default_train_dl_kwargs(batch_size), train_dl_kwargs)
        return self.loaders.make_train_loader(self.train_dataset, self.collate_fn, kwargs)

    def create_eval_dataloader(
        self, batch_size: int, eval_dl_kwargs: dict[str, Any] | None = None
    ) -> DataLoader:
        """Return the evaluation ``DataLoader``: each process gets its own share of the samples, each once."""
        kwargs = self.loaders.merge("eval", self.get_default_eval_dl_kwargs(batch_size), eval_dl_kwargs)
        return self.loaders.make_eval_loader(
            self.eval_dataset, self.collate_fn, kwargs, batch_size, eval_dl_kwargs
        )

    def _prepare_model_optimizer_and_dataloaders(self) -> None:
        """Wrap the model and optimizer for distribution (once) and prepare the data loaders."""
        self.model, self.optimizer, self.loaders.train = self._preparation.prepare(
            self.model, self.optimizer, self.loaders.train
        )
        self.loaders.eval = prepare_eval_dataloader(self._accelerator, self.loaders.eval)

    # ------------------------------------------------------------------ how a run starts and ends

    def _set_up_training(
        self, arguments: TrainArguments, plan: ResumePlan | None, relaunch: AutoResume | None
    ) -> None:
        """Everything before a training run starts: loaders, preparation, run config, scheduler, the
        resume ``plan`` applied (``relaunch``: chosen by ``resume_from="auto"``, which may end the
        launch here when it would repeat a failure)."""
        self._start_run(arguments)
        datasets = {"train_dataset": arguments.train_dataset, "eval_dataset": arguments.eval_dataset}
        check_same_data_on_every_process(self._accelerator, datasets)
        self.create_scheduler_fn = arguments.create_scheduler_fn
        loaders, batch_size = self.loaders, arguments.per_device_batch_size
        train_kwargs, eval_kwargs = arguments.train_dataloader_kwargs, arguments.eval_dataloader_kwargs
        loaders.merged_kwargs = {}
        loaders.train = self.create_train_dataloader(batch_size, train_kwargs)
        if self.eval_dataset is not None:
            loaders.eval = self.create_eval_dataloader(batch_size, eval_kwargs)
        self._prepare_model_optimizer_and_dataloaders()
        processes = self._accelerator.num_processes
        check_epoch_has_batches(loaders.train, self.train_dataset, "train_dataset", processes)
        check_epoch_has_batches(loaders.eval, self.eval_dataset, "eval_dataset", processes)
        self.run_identity.asked_accumulation = arguments.gradient_accumulation_steps
        config = self.run_config = self._create_run_config(
            per_device_batch_size=batch_size,
            num_epochs=arguments.num_epochs,
            gradient_accumulation_steps=self._run_accumulation(arguments, plan),
            max_num_train_steps=arguments.max_num_train_steps,
            gradient_clip_value=arguments.gradient_clip_value,
            train_dl_kwargs=loaders.recorded_kwargs("train", train_kwargs),
            eval_dl_kwargs=loaders.recorded_kwargs("eval", eval_kwargs),
            max_grad_norm=arguments.max_grad_norm,
        )
        self.scheduler = self.create_scheduler() if self.create_scheduler_fn is not None else None
        self.loop_state.window = WindowWeighting(self._accelerator, config.train_per_device_batch_size)
        if plan is not None:
            self._resume(plan)
            self._check_something_left_to_train(plan)
        if relaunch is not None:
            # A resume starts where the state it resumed left the run; a new run, or a stage that
            # starts after an earlier stage's state, where choose() said.
            origin = self.run_identity.origin(self.progress) if plan is not None else relaunch.origin
            relaunch.check_not_repeating(origin)

    def _run_accumulation(self, arguments: TrainArguments, plan: ResumePlan | None) -> int:
        """The run's ``gradient_accumulation_steps``: the one given, but where ``resume_from="auto"``
        resumes a state saved on another number of processes, the one that keeps its global batch
        (elastic membership; docs: "Resuming on another number of processes")."""
        asked = arguments.gradient_accumulation_steps
        if plan is None or not plan.auto:
            return asked
        return plan.accumulation_keeping_global_batch(self._accelerator, arguments.train_batch_size, asked)

    def _resume(self, plan: ResumePlan) -> None:
        """Apply ``plan`` through the overridable ``load_training_state`` (it is given the plan, a
        path: the one asked). The default resumes the run at the saved position and returns a
        :class:`~.checkpoints.resume.Resumed`, whose callback and RNG states go in once the run's start
        events have fired; as in 0.1.61, an override that restores the state itself, without
        ``super()``, and returns ``{"current_epoch": E}`` starts the run at epoch E."""
        loaded = self.load_training_state(plan)
        if isinstance(loaded, Resumed):
            self._resumed = loaded
        else:
            self._start_at_returned_epoch(loaded)

    def _check_something_left_to_train(self, plan: ResumePlan) -> None:
        """End ``train()`` before it starts, saying so in one line, when the state resumed by ``plan``
        already reached ``num_epochs`` or ``max_num_train_steps`` (the resume printed no line then)."""
        state = self.resumed_from or plan.asked
        named = (
            f"{state} (the newest usable state in {plan.asked})" if state.parent == plan.asked else str(state)
        )
        trained = epochs_trained(
            self.progress, self.loop_state.epoch_trained, batches_per_epoch(self.loaders.train)
        )
        auto = (self.run_identity.run_id, plan.asked) if plan.auto else None
        check_something_left_to_train(self.progress, self._config(), named, trained, auto)

    def _start_at_returned_epoch(self, loaded: Any) -> None:
        """As in 0.1.61: an override of ``load_training_state`` that does not call ``super()`` and
        returns ``{"current_epoch": E, ...}`` starts the run at the start of epoch E (counted from 1)."""
        epoch = loaded.get("current_epoch") if isinstance(loaded, Mapping) else None
        if epoch is None:
            return
        owner = f"{type(self).__name__}.load_training_state returned"
        check_whole_number(epoch, "current_epoch", owner=owner, hint="It is the epoch to start at, from 1.")
        self.progress.epoch = epoch - 1
        self.run_history.set_current_epoch(self.run_identity.history_first_epoch + self.progress.epoch)

    def _start_run(self, arguments: TrainArguments) -> None:
        self.train_dataset, self.eval_dataset = arguments.train_dataset, arguments.eval_dataset
        self.collate_fn = arguments.collate_fn
        self.loaders.eval = None
        self.loaders.set_seed(arguments.seed)
        identity = RunIdentity()
        if arguments.reset_run_history:
            self.run_history.reset()
            self.run_history.reset_step_metrics()
        else:  # the run goes on: its id, and its updates' count (its states' names follow the earlier calls')
            identity.run_id, identity.steps_before = (
                self.run_identity.run_id,
                self.run_identity.run_step(self.progress),
            )
        identity.history_first_epoch, identity.stage = self.run_history.current_epoch, self._train_calls
        if self._accelerator.num_processes > 1:  # one id for the run: the main process's
            identity.run_id = broadcast_object_list([identity.run_id])[0]
        self.last_grad_norm, self._resumed = None, None
        self.progress, self.run_identity, self.loop_state = RunProgress(), identity, LoopState()

    def _set_evaluation_run_config(self, batch_size: int, eval_kwargs: dict[str, Any] | None) -> None:
        """Give an evaluation on a Trainer that has not trained its own run config (callbacks
        read e.g. ``run_config.is_world_process_zero``); a training run's config is kept."""
        if self.run_config is None or self.run_config.evaluation_only:
            self.run_config = TrainerRunConfig.for_evaluation(
                self._accelerator,
                per_device_batch_size=batch_size,
                eval_dl_kwargs=self.loaders.recorded_kwargs("eval", eval_kwargs),
                seed=self.loaders.seed,
            )

    def _run_guarded(
        self, set_up: Callable[[], None], body: Callable[[], None], end: str, stopped: str
    ) -> StopTrainingError | None:
        """Set up, run ``body`` (which fires the start hooks), then the end hook ``end`` and its event;
        return the :class:`StopTrainingError` that ended ``body``, if one did.

        Set-up fires no event: a ``StopTrainingError`` there ends it before anything started,
        any other exception reaches the caller as it is. From ``body`` on, a ``StopTrainingError``
        ends it cleanly (``on_stop_training_error``, then the end hooks) and any other exception
        fires ``on_exception``, then reaches the caller unchanged.
        """
        try:
            set_up()
        except StopTrainingError as error:
            self.print(f"{stopped} before it started: {error}")
            return None
        stop = None
        with self._announcing_failures(), self.state_store.finishing_run():
            try:
                body()
            except StopTrainingError as error:
                self.print(f"{stopped}: {error}")
                self._run_end_event("on_stop_training_error")
                stop = error
            self._run_end_event(end)
        return stop

    @contextlib.contextmanager
    def _announcing_failures(self) -> Iterator[None]:
        try:
            yield
        except StopTrainingError:
            raise
        except BaseException as error:
            # A note: which rank, where, probably why.
            explain_collective_failure(
                self._accelerator, describe_position(self.callback_handler, self.progress), error
            )
            self.callback_handler.call_exception_event(self, error)
            raise

    def _run_end_event(self, name: str) -> None:
        """Run the end hook ``name`` (the overridable method of that name, if ``name`` does not start
        with ``on_``) and its event; a :class:`StopTrainingError` raised in it skips the rest."""
        try:
            if not name.startswith("on_"):
                getattr(self, name)()
            self.callback_handler.call_event(name if name.startswith("on_") else f"on_{name}", self)
        except StopTrainingError as error:
            self.print(f"Stopped during {name}: {error}")

    def _recording_failures(self, relaunch: AutoResume) -> None:
        """``self._run_training()``, its failure recorded for the next ``resume_from="auto"`` launch; a
        run that ends without one clears this process's record, as does one ended on purpose (a stop,
        a pruned Optuna trial: see :func:`~._internal.errors.ends_run_on_purpose`)."""
        try:
            self._run_training()
        except Exception as error:
            if ends_run_on_purpose(error):
                relaunch.clear_failure()
                raise
            progress = self.progress
            position = {"update": self.run_identity.run_step(progress), "epoch": progress.epoch + 1}
            began = training_began(self.callback_handler)  # a refusal before training records nothing
            relaunch.record_failure(error, {**position, "batch": progress.batch_index}, began)
            raise
        relaunch.clear_failure()

    # ------------------------------------------------------------------ the loop

    def _run_method_then_event(self, name: str, **event_kwargs: Any) -> None:
        getattr(self, name)()
        self.callback_handler.call_event(f"on_{name}", self, **event_kwargs)

    def _run_training(self) -> None:
        """Start the run, then run every epoch: train, evaluate, ``training_run_epoch_end``, until
        ``num_epochs`` or ``max_num_train_steps``. (``train()`` handles stops and failures.)"""
        self._run_method_then_event("training_run_start")
        if self._resumed is not None:  # a resumed state's callback and RNG states, after the start events
            self._resumed.restore_after_start(self.callback_handler)
        while self.progress.epoch < self._config().num_epochs:
            if not self.loop_state.epoch_trained:  # trained already when resumed during evaluation
                self._run_train_epoch(self.loaders.train)
                self.loop_state.epoch_trained = True
            if self.loaders.eval is not None:
                self._run_eval_epoch(self.loaders.eval)
            self._end_epoch()
            if self._reached_max_steps():
                break

    def _end_epoch(self) -> None:
        # A training state saved during the epoch-end event resumes at the next epoch.
        self.loop_state.epoch_finished = True
        try:
            self._run_method_then_event("training_run_epoch_end")
        finally:  # also when a callback stops the run here (early stopping): the epoch is done
            self.progress.start_next_epoch()
            self.loop_state.epoch_finished = self.loop_state.epoch_trained = False
            self.run_history.set_current_epoch(self.run_identity.history_first_epoch + self.progress.epoch)

    def _config(self) -> TrainerRunConfig:
        if self.run_config is None:
            raise RuntimeError("This needs a training run: call trainer.train(...) first.")
        return self.run_config

    def _run_train_epoch(self, train_dl: Any) -> None:
        """Run one training epoch over ``train_dl``, from ``progress.batch_index`` (0 unless resuming)."""
        train_dl = self._start_train_epoch(train_dl)
        config, progress, step_metrics = self._config(), self.progress, self.loop_state.step_metrics
        window_weight: Any = 0
        start, num_batches = progress.batch_index, batches_per_epoch(train_dl)
        windows = accumulation_windows(train_dl, start, config.gradient_accumulation_steps, num_batches)
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
            if (
                is_update_step
                and config.train_steps_limit is not None
                and self._stops_at_limit(start, num_batches)
            ):
                break
        check_stream_gave_batches(self.progress.batch_index, self.train_dataset)
        loss = self.loop_state.train_loss
        self.run_history.update_metric(
            "train_loss_epoch", mean_over_processes(self._accelerator, loss.running_total, loss.count)
        )
        self._run_method_then_event("train_epoch_end")

    def _start_train_epoch(self, train_dl: Any) -> Any:
        sampler = self.loaders.train_sampler
        if sampler is not None and self.loaders.train_generator is not None:
            # Workers' seeds then depend on the epoch only, as the shuffle order does.
            self.loaders.train_generator.manual_seed(sampler.seed + self.progress.epoch)
        loader_before = self.loaders.train
        self._run_method_then_event("train_epoch_start")
        # Parameters unfrozen since the model was wrapped (by now, or by a resume) train in sync too.
        self.model = self._preparation.rewrap_if_trainable_changed(self.model)
        if self.loaders.train is not loader_before:  # replaced by a callback for this epoch
            train_dl = self.loaders.train
        if self.progress.batch_index == 0 and not (
            sampler is not None and sampler.skipped_in(self.progress.epoch)
        ):
            loss = self.loop_state.train_loss
            if self.loop_state.step_metrics.active:  # the epoch's sum is reset: keep what is not logged yet
                self.loop_state.step_metrics.carry_epoch_loss(loss.running_total, loss.count)
            loss.reset()
        else:  # resuming mid-epoch: skip at the sampler level, so skipped batches are never loaded
            train_dl = skip_first_batches(train_dl, self.progress.batch_index)
        self.loaders.set_epoch(train_dl, self.progress.epoch, sampler)
        return train_dl

    def _train_on_batch(self, batch: Any, window_size: int, sync: bool) -> tuple[dict[str, Any], Any]:
        """Forward and backward passes of one batch; returns its output and its weight in the window."""
        if not sync:  # the same, inside accelerate's no_sync (a context manager costs ~3 calls)
            with self._accelerator.no_sync(self.model):
                return self._train_on_batch(batch, window_size, sync=True)
        window, loop_state = self.loop_state.window, self.loop_state
        assert window is not None  # set by train()
        batch_output = self.calculate_train_batch_loss(batch)
        check_batch_output(batch_output, "calculate_train_batch_loss")
        weight, loss = window.weight_of(batch_output), batch_output["loss"]
        loop_state.train_loss.update(loss, weight)
        if loop_state.step_metrics.every_n_steps is not None:  # (step_metrics.active, inlined)
            loop_state.step_metrics.batch_done(batch_output)
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
        window = self.loop_state.window
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
        self.loop_state.step_metrics.update_done()
        return True

    def _record_step_metrics(self) -> None:
        """Measure the step metrics due now (a collective), record them, then fire ``on_step_metrics``
        (before ``on_train_step_end``: a state saved at this step is published after its point is logged)."""
        step = self.progress.global_step
        loss, grad_norm = self.loop_state.train_loss, self.last_grad_norm
        metrics = self.loop_state.step_metrics.measure(self._accelerator, self.optimizer, loss, grad_norm)
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
        eval_loss = self.loop_state.eval_loss
        eval_loss.reset()
        with torch.no_grad():
            for batch in self.loaders.eval_batches(eval_dl):
                try:
                    self._run_eval_step(batch, eval_loss)
                except Exception as error:
                    self.loaders.explain_padding_failure(error)
                    raise
        # Computed before the end events: a callback there may run another evaluation.
        mean = self.loop_state.last_eval_loss = mean_over_processes(
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

    def _stops_at_limit(self, start: int, num_batches: int | None) -> bool:
        """Whether ``max_num_train_steps`` ends the run at this update; where it ends it before the
        last of the epoch's ``num_batches`` after ``start`` (None: a stream's, not known), the run as it
        is now is what its states record (:class:`~.run_config.CutShort`)."""
        if not self._reached_max_steps():
            return False
        if num_batches is None or self.progress.batch_index < start + num_batches:
            self.loop_state.cut_short = CutShort(
                self.progress.state_dict(), self.run_history.state_dict(), capture_rng_states()
            )
        return True

    def _reached_max_steps(self) -> bool:
        limit = self.run_config.train_steps_limit if self.run_config else None
        return limit is not None and self.progress.global_step >= limit

    # ------------------------------------------------------------------ the hooks and steps (overridable)

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
        elif self.loop_state.step_metrics.wants_grad_norm(self.progress.global_step + 1):  # a logged update
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

    # ------------------------------------------------------------------ the accelerator

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

    # ------------------------------------------------------------------ processes

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per node (on each node's main process), above any open progress bar."""
        print_once_per_node(self._accelerator, *args, **kwargs)

    def gather(self, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
        """Concatenate ``tensor`` from every process along dim 0 (see :func:`.distributed.gather`)."""
        return distributed.gather(self._accelerator, tensor, padding_value)

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather nested tensors from every process, each sample once (nothing from a padding batch,
        not even a 0-d tensor)."""
        return distributed.gather_ragged(self._accelerator, data, padding=self.loaders.eval_batch_is_padding)

    def any_process(self, flag: bool | torch.Tensor) -> bool:
        """True on every process if ``flag`` is true on any (every process must call this)."""
        return bool(distributed.ranks_where(self._accelerator, flag))

    def get_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """Return the model without its distributed wrappers."""
        return self._accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)

    @property
    def running_loss(self) -> float:
        """The mean training loss of the epoch so far on this process (a device read: a sync point)."""
        return self.loop_state.train_loss.average

    @property
    def eval_batch_is_padding(self) -> bool:
        """True while an evaluation batch is a padding batch of zero rows (that evens out the processes'
        batch counts; docs/inside-the-trainer.md, "Evaluation")."""
        return self.loaders.eval_batch_is_padding

    @property
    def train_dataloader(self) -> Any:
        """The prepared training loader of the run (one set in ``on_train_epoch_start`` is used)."""
        return self.loaders.train

    @train_dataloader.setter
    def train_dataloader(self, loader: Any) -> None:
        self.loaders.train = loader

    @property
    def eval_dataloader(self) -> Any:
        """The prepared evaluation loader (one set in ``on_eval_epoch_start`` is used)."""
        return self.loaders.eval

    @eval_dataloader.setter
    def eval_dataloader(self, loader: Any) -> None:
        self.loaders.eval = loader

    # ------------------------------------------------------------------ checkpoints

    def _training_objects(self) -> TrainingObjects:
        """The parts of the run that a training state saves and restores, as they are now."""
        return TrainingObjects(
            accelerator=self._accelerator,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            progress=self.progress,
            run_identity=self.run_identity,
            loop_state=self.loop_state,
            run_history=self.run_history,
            callbacks=self.callback_handler,
            run_config=self.run_config,
            train_dataloader=self.loaders.train,
            train_dataset=self.train_dataset,
            train_sampler=self.loaders.train_sampler,
        )

    def save_checkpoint(
        self,
        save_path: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        save_per_node: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> None:
        """Save the model (and optimizer, scheduler) in one file (see :func:`.model_files.save_checkpoint`)."""
        model_files.save_checkpoint(
            self._training_objects(),
            save_path,
            checkpoint_kwargs,
            (save_optimizer, save_scheduler, save_per_node),
            model,
        )

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike,
        load_optimizer: bool = True,
        load_scheduler: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> dict[str, Any]:
        """Load a file written by :meth:`save_checkpoint` (see :func:`.model_files.load_checkpoint`)."""
        return model_files.load_checkpoint(
            self._training_objects(), checkpoint_path, (load_optimizer, load_scheduler), model
        )

    def save_training_state(
        self,
        output_dir: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        *,
        asynchronous: bool = False,
    ) -> None:
        """Save all that decides the rest of the run in ``output_dir`` (see :meth:`.TrainingStateStore.save`).

        >>> import tempfile, torch
        >>> from pytorch_accelerated import Trainer
        >>> from torch import nn
        >>> from torch.utils.data import TensorDataset
        >>> data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
        >>> def new_trainer():
        ...     model = nn.Linear(3, 1)
        ...     return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        >>> trainer = new_trainer()
        >>> trainer.train(data, num_epochs=1, per_device_batch_size=4)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     trainer.save_training_state(f"{folder}/after-epoch-1", checkpoint_kwargs={"note": "hi"})
        ...     resumed = new_trainer()
        ...     resumed.train(data, num_epochs=3, per_device_batch_size=4, resume_from=folder)
        Resumed from .../after-epoch-1, the newest usable state in ... (update 4; training continues with epoch 2)
        >>> resumed.progress.global_step  # 4 updates restored, then 2 more epochs of 4
        12
        """
        self.state_store.save(self._training_objects(), output_dir, checkpoint_kwargs, asynchronous)

    def wait_for_training_state(self) -> None:
        """Wait for a state saved with ``asynchronous=True`` (see :meth:`.TrainingStateStore.wait`)."""
        self.state_store.wait()

    def load_training_state(self, input_dir: str | os.PathLike) -> dict[str, Any]:
        """Restore a state saved by :meth:`save_training_state` (see :meth:`.TrainingStateStore.load`).

        ``train(resume_from=...)`` calls this with its :class:`~.checkpoints.resume.ResumePlan` (a
        path), so an override runs there too: one that calls ``super()`` returns what it returned (the
        run continues at the exact position saved); one that restores the state itself returns
        ``{"current_epoch": E}``, and the run starts at epoch E."""
        return self.state_store.load(self._training_objects(), input_dir)

    @property
    def resumed_from(self) -> Path | None:
        """The training state this run was resumed from (None: a new run, or a state that an override
        of :meth:`load_training_state` restored itself); set before ``on_training_run_start``."""
        return self._resumed.directory if self._resumed is not None else None


class TrainerWithTimmScheduler(Trainer):
    """A Trainer for timm schedulers, which are stepped per update and per epoch.

    timm schedulers take the number of the update or epoch that comes next:
    ``step_update(num_updates)`` after each optimizer update and ``step(epoch)`` after each
    epoch (with the evaluation loss, when there is one, as the metric).
    """

    def scheduler_step(self) -> None:
        self.scheduler.step_update(num_updates=self.progress.global_step + 1)

    def training_run_epoch_end(self) -> None:
        if self.scheduler is None:
            return
        metric = None
        if self.loaders.eval is not None:  # this run evaluated: its loss is the metric
            metric = self.run_history.get_latest_metric("eval_loss_epoch")
        self.scheduler.step(epoch=self.progress.epoch + 1, metric=metric)
