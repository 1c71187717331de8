"""The one module besides the callbacks that takes the Trainer: how its runs start and end, and
its methods that only hand over to one of its parts.

Before ``train()``, ``evaluate()`` or ``predict()`` runs, this sets up the data sets and seed, the
loaders through the Trainer's overridable ``create_*_dataloader``, preparation through
``_prepare_model_optimizer_and_dataloaders``, the run config through ``_create_run_config``, the
scheduler through ``create_scheduler`` and a resume through ``load_training_state``, so an override
of any of them runs. :func:`run_guarded` runs a set-up and a body with the end hooks, stops and
failures handled; :func:`training_objects` hands the checkpoint layer the run's objects.

The functions that take ``self`` (``evaluate``, ``predict``, ``run_eval_epoch``, the set-up
defaults, ``print``, ``gather``, ``get_model``, the checkpoint methods, ...) and the properties
(``running_loss``, ``train_dataloader``, ...) are the Trainer's members of those names: each is
bound in its class body (``evaluate = runs.evaluate``), an ordinary method that a subclass
overrides as any other, so that trainer.py holds the loop. Everything this module calls on the
Trainer is public or an extension point that the docs name.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

import torch
from accelerate.utils import broadcast_object_list
from torch import nn
from torch.utils.data import DataLoader

from ._internal import distributed
from ._internal.accumulation import WindowWeighting
from ._internal.hangs import describe_position, explain_collective_failure
from ._internal.validation import (
    check_epoch_has_batches,
    check_evaluate_arguments,
    check_something_left_to_train,
    check_train_arguments,
    check_whole_number,
)
from .callbacks import StopTrainingError
from .callbacks.training_state import auto_resume_folder
from .checkpoints import model_files
from .checkpoints.auto_resume import AUTO, AutoResume, training_began
from .checkpoints.resume import accumulation_keeping_global_batch
from .checkpoints.training_objects import TrainingObjects
from .data import batches_per_epoch, check_same_data_on_every_process
from .placeholders import replace_trainer_placeholder_values
from .run_config import RunProgress, RunState, TrainerRunConfig

if TYPE_CHECKING:
    from .trainer import Trainer


T = TypeVar("T")

#: The arguments of ``train()`` that the run config records.
RUN_SETTINGS = (
    "num_epochs",
    "per_device_batch_size",
    "max_num_train_steps",
    "gradient_accumulation_steps",
    "gradient_clip_value",
    "max_grad_norm",
)


def train(trainer: Trainer, arguments: dict[str, Any]) -> None:
    """What ``Trainer.train`` does with its ``arguments`` (by name): check them all, then set up
    and run ``trainer._run_training`` guarded (see :func:`run_guarded`)."""
    check_train_arguments(trainer.accelerator, trainer.model, trainer.optimizer, arguments)
    relaunch, body = None, trainer._run_training
    if arguments["resume_from"] == AUTO:  # decided now, by every process alike
        relaunch = AutoResume(trainer.accelerator, auto_resume_folder(trainer.callback_handler))
        arguments = {**arguments, "resume_from": relaunch.choose()}
        body = functools.partial(_recording_failures, trainer, relaunch)
    set_up = functools.partial(set_up_training, trainer, arguments, relaunch)
    run_guarded(trainer, set_up, body, end="training_run_end", stopped="Training stopped")
    if trainer.run_state.exit_code is not None:  # a signal's stop under torchrun: see its line
        raise SystemExit(trainer.run_state.exit_code)


def _recording_failures(trainer: Trainer, relaunch: AutoResume) -> None:
    """``trainer._run_training()``, its failure (an exception, not a stop) recorded for the next
    ``resume_from="auto"`` launch; a run that ends without one clears this process's record."""
    try:
        trainer._run_training()
    except StopTrainingError:
        raise
    except Exception as error:
        progress = trainer.progress
        position = {"update": trainer.run_state.run_step(progress), "epoch": progress.epoch + 1}
        began = training_began(trainer.callback_handler)  # a refusal before training records nothing
        relaunch.record_failure(error, {**position, "batch": progress.batch_index}, began)
        raise
    relaunch.clear_failure()


def evaluate(
    self: Trainer,
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
        check_same_data_on_every_process(self.accelerator, {"dataset": dataset})
        self.eval_dataset = dataset
        if collate_fn is not None:
            self.collate_fn = collate_fn
        self.loaders.set_seed(seed)
        self.loaders.eval = self.create_eval_dataloader(per_device_batch_size, dataloader_kwargs)
        set_evaluation_run_config(self, per_device_batch_size, dataloader_kwargs)
        self._prepare_model_optimizer_and_dataloaders()
        check_epoch_has_batches(self.loaders.eval, dataset, "dataset", self.accelerator.num_processes)

    def body() -> None:
        self.evaluation_run_start()
        self.callback_handler.call_event("on_evaluation_run_start", self)
        self._run_eval_epoch(self.loaders.eval, is_evaluation_run=True)

    run_guarded(self, set_up, body, end="evaluation_run_end", stopped="Evaluation stopped")
    counts = history.metric_counts()
    return {name: history.get_latest_metric(name) for name in counts if counts[name] > before.get(name, 0)}


def set_up_training(trainer: Trainer, arguments: dict[str, Any], relaunch: AutoResume | None = None) -> None:
    """Everything before a training run starts: loaders, preparation, run config, scheduler, resume
    (``relaunch``: the state was chosen by ``resume_from="auto"``, which may end the launch here
    when it would repeat a failure)."""
    auto = relaunch is not None
    _start_run(trainer, arguments)
    check_same_data_on_every_process(
        trainer.accelerator, {name: arguments[name] for name in ("train_dataset", "eval_dataset")}
    )
    trainer.create_scheduler_fn = arguments["create_scheduler_fn"]
    loaders, batch_size = trainer.loaders, arguments["per_device_batch_size"]
    train_kwargs, eval_kwargs = arguments["train_dataloader_kwargs"], arguments["eval_dataloader_kwargs"]
    loaders.merged_kwargs = {}
    loaders.train = trainer.create_train_dataloader(batch_size, train_kwargs)
    if trainer.eval_dataset is not None:
        loaders.eval = trainer.create_eval_dataloader(batch_size, eval_kwargs)
    trainer._prepare_model_optimizer_and_dataloaders()
    processes = trainer.accelerator.num_processes
    check_epoch_has_batches(loaders.train, trainer.train_dataset, "train_dataset", processes)
    check_epoch_has_batches(loaders.eval, trainer.eval_dataset, "eval_dataset", processes)
    settings = {name: arguments[name] for name in RUN_SETTINGS}
    trainer.run_state.asked_accumulation = arguments["gradient_accumulation_steps"]
    settings["gradient_accumulation_steps"] = _run_accumulation(trainer, arguments, auto)
    settings["train_dl_kwargs"] = loaders.recorded_kwargs("train", train_kwargs)
    settings["eval_dl_kwargs"] = loaders.recorded_kwargs("eval", eval_kwargs)
    config = trainer.run_config = trainer._create_run_config(**settings)
    trainer.scheduler = trainer.create_scheduler() if trainer.create_scheduler_fn is not None else None
    trainer.run_state.window = WindowWeighting(trainer.accelerator, config.train_per_device_batch_size)
    if arguments["resume_from"] is not None:
        with trainer.state_store.resuming(auto):  # through the overridable load_training_state
            loaded = trainer.load_training_state(arguments["resume_from"])
        if trainer.run_state.pending_resume is None:  # an override that restored the state itself
            _start_at_returned_epoch(trainer, loaded)
        check_something_left_to_train(trainer.progress, config, arguments["resume_from"], auto)
    if relaunch is not None:
        resumed = arguments["resume_from"] is not None
        origin = {"run_id": trainer.run_state.run_id, "update": trainer.run_state.run_step(trainer.progress)}
        relaunch.check_not_repeating(origin if resumed else None)


def _run_accumulation(trainer: Trainer, arguments: dict[str, Any], auto: bool) -> int:
    """The run's ``gradient_accumulation_steps``: the one given, but where ``resume_from="auto"``
    (``auto``) resumes a state saved on another number of processes, the one that keeps its global
    batch (elastic membership; docs: "Resuming on another number of processes")."""
    asked = arguments["gradient_accumulation_steps"]
    if not auto or arguments["resume_from"] is None:
        return asked
    return accumulation_keeping_global_batch(
        arguments["resume_from"], trainer.accelerator, arguments["per_device_batch_size"], asked
    )


def _start_at_returned_epoch(trainer: Trainer, loaded: Any) -> None:
    """As in 0.1.61: an override of ``load_training_state`` that does not call ``super()`` and
    returns ``{"current_epoch": E, ...}`` starts the run at the start of epoch E (counted from 1)."""
    epoch = loaded.get("current_epoch") if isinstance(loaded, Mapping) else None
    if epoch is None:
        return
    owner = f"{type(trainer).__name__}.load_training_state returned"
    check_whole_number(epoch, "current_epoch", owner=owner, hint="It is the epoch to start at, from 1.")
    trainer.progress.epoch = epoch - 1
    trainer.run_history.set_current_epoch(trainer.run_state.history_first_epoch + trainer.progress.epoch)


def _start_run(trainer: Trainer, arguments: dict[str, Any]) -> None:
    trainer.train_dataset, trainer.eval_dataset = arguments["train_dataset"], arguments["eval_dataset"]
    trainer.collate_fn = arguments["collate_fn"]
    trainer.loaders.eval = None
    trainer.loaders.set_seed(arguments["seed"])
    run_state = RunState()
    if arguments["reset_run_history"]:
        trainer.run_history.reset()
        trainer.run_history.reset_step_metrics()
    else:  # the run goes on: its id, and its updates' count (its states' names follow the earlier calls')
        run_state.run_id, run_state.steps_before = (
            trainer.run_state.run_id,
            trainer.run_state.run_step(trainer.progress),
        )
    run_state.history_first_epoch = trainer.run_history.current_epoch
    if trainer.accelerator.num_processes > 1:  # one id for the run: the main process's
        run_state.run_id = broadcast_object_list([run_state.run_id])[0]
    trainer.last_grad_norm = None
    trainer.progress, trainer.run_state = RunProgress(), run_state


def set_evaluation_run_config(trainer: Trainer, batch_size: int, eval_kwargs: dict[str, Any] | None) -> None:
    """Give an evaluation on a Trainer that has not trained its own run config (callbacks
    read e.g. ``run_config.is_world_process_zero``); a training run's config is kept."""
    if trainer.run_config is None or trainer.run_config.evaluation_only:
        trainer.run_config = TrainerRunConfig.for_evaluation(
            trainer.accelerator,
            per_device_batch_size=batch_size,
            eval_dl_kwargs=trainer.loaders.recorded_kwargs("eval", eval_kwargs),
            seed=trainer.loaders.seed,
        )


def run_guarded(
    trainer: Trainer, set_up: Callable[[], None], body: Callable[[], None], end: str, stopped: str
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
        trainer.print(f"{stopped} before it started: {error}")
        return
    with _announcing_failures(trainer), trainer.state_store.finishing_run():
        try:
            body()
        except StopTrainingError as error:
            trainer.print(f"{stopped}: {error}")
            run_end_event(trainer, "on_stop_training_error")
        run_end_event(trainer, end)


@contextlib.contextmanager
def _announcing_failures(trainer: Trainer) -> Iterator[None]:
    try:
        yield
    except StopTrainingError:
        raise
    except BaseException as error:
        # A note: which rank, where, probably why.
        explain_collective_failure(
            trainer.accelerator, describe_position(trainer.callback_handler, trainer.progress), error
        )
        trainer.callback_handler.call_exception_event(trainer, error)
        raise


def run_end_event(trainer: Trainer, name: str) -> None:
    """Run the end hook ``name`` (the Trainer's overridable method of that name, if ``name`` does
    not start with ``on_``) and its event; a :class:`StopTrainingError` raised in it skips the rest."""
    try:
        if not name.startswith("on_"):
            getattr(trainer, name)()
        trainer.callback_handler.call_event(name if name.startswith("on_") else f"on_{name}", trainer)
    except StopTrainingError as error:
        trainer.print(f"Stopped during {name}: {error}")


def run_eval_epoch(
    self: Trainer,
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
        return self.run_state.last_eval_loss
    finally:
        self.model, self.loaders.eval = original_model, original_loader
        self.run_history.set_metric_name_prefix(previous_prefix)
        original_model.train(was_training)


def training_objects(trainer: Trainer) -> TrainingObjects:
    """The parts of ``trainer``'s run that a training state saves and restores, as they are now."""
    return TrainingObjects(
        trainer.accelerator,
        trainer.model,
        trainer.optimizer,
        trainer.scheduler,
        trainer.progress,
        trainer.run_state,
        trainer.run_history,
        trainer.callback_handler,
        trainer.run_config,
        trainer.loaders.train,
        trainer.train_dataset,
    )


# ---------------------------------------------------------------------------- the Trainer's set-up
# defaults, which only hand over to a part: bound in its class body (``create_scheduler =
# runs.create_scheduler``), ordinary methods, overridable as any other.


def create_run_config(
    self: Trainer,
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
    settings = {name: value for name, value in locals().items() if name != "self"}
    return TrainerRunConfig.for_run(
        self.accelerator,
        num_batches_per_epoch=batches_per_epoch(self.loaders.train),
        seed=self.loaders.seed,
        **settings,
    )


def create_scheduler(self: Trainer) -> Any:
    """Return the scheduler made by ``create_scheduler_fn`` with placeholders resolved."""
    return replace_trainer_placeholder_values(self, self.create_scheduler_fn)(self.optimizer)


def get_default_train_dl_kwargs(self: Trainer, batch_size: int) -> dict[str, Any]:
    """Data-loader arguments for training; ``train_dataloader_kwargs`` are merged over them."""
    return self.loaders.default_kwargs(self.train_dataset, batch_size, shuffle=True)


def get_default_eval_dl_kwargs(self: Trainer, batch_size: int) -> dict[str, Any]:
    """Data-loader arguments for evaluation; ``eval_dataloader_kwargs`` are merged over them."""
    return self.loaders.default_kwargs(self.eval_dataset, batch_size, shuffle=False)


def create_train_dataloader(
    self: Trainer, batch_size: int, train_dl_kwargs: dict[str, Any] | None = None
) -> DataLoader:
    """Return the training ``DataLoader`` (before it is prepared for distribution)."""
    kwargs = self.loaders.merge("train", self.get_default_train_dl_kwargs(batch_size), train_dl_kwargs)
    return self.loaders.make_train_loader(self.train_dataset, self.collate_fn, kwargs, self.run_state)


def create_eval_dataloader(
    self: Trainer, batch_size: int, eval_dl_kwargs: dict[str, Any] | None = None
) -> DataLoader:
    """Return the evaluation ``DataLoader``: each process gets its share of the samples, each once."""
    kwargs = self.loaders.merge("eval", self.get_default_eval_dl_kwargs(batch_size), eval_dl_kwargs)
    return self.loaders.make_eval_loader(
        self.eval_dataset, self.collate_fn, kwargs, batch_size, eval_dl_kwargs
    )


# ---------------------------------------------------------------------------- processes


def print(self: Trainer, *args: Any, **kwargs: Any) -> None:  # (shadows the built-in in this module)
    """``print`` once per node (on each node's main process), above any open progress bar."""
    distributed.print_once_per_node(self.accelerator, *args, **kwargs)


def gather(self: Trainer, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0 (see :func:`.distributed.gather`)."""
    return distributed.gather(self.accelerator, tensor, padding_value)


def gather_for_metrics(self: Trainer, data: Any) -> Any:
    """Gather nested tensors from every process, each sample once (nothing from a padding batch,
    not even a 0-d tensor)."""
    return distributed.gather_ragged(self.accelerator, data, padding=self.loaders.eval_batch_is_padding)


def any_process(self: Trainer, flag: bool | torch.Tensor) -> bool:
    """True on every process if ``flag`` is true on any (every process must call this)."""
    return bool(distributed.ranks_where(self.accelerator, flag))


def get_model(self: Trainer, keep_torch_compile: bool = True) -> nn.Module:
    """Return the model without its distributed wrappers."""
    return self.accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)


class part_property(property, Generic[T]):
    """A property of the Trainer that reads (and may set) an attribute of one of its parts, typed ``T``."""

    if TYPE_CHECKING:

        @overload
        def __get__(self, trainer: None, owner: type | None = None) -> part_property[T]: ...
        @overload
        def __get__(self, trainer: Any, owner: type | None = None) -> T: ...
        def __get__(self, trainer: Any, owner: type | None = None) -> Any: ...


running_loss: part_property[float] = part_property(
    attrgetter("run_state.train_loss.average"),
    doc="The mean training loss of the epoch so far on this process (a device read: a sync point).",
)
eval_batch_is_padding: part_property[bool] = part_property(
    attrgetter("loaders.eval_batch_is_padding"),
    doc="True while an evaluation batch is a padding batch of zero rows (that evens out the processes' "
    'batch counts; docs/inside-the-trainer.md, "Evaluation").',
)
train_dataloader: part_property[Any] = part_property(
    attrgetter("loaders.train"),
    lambda self, loader: setattr(self.loaders, "train", loader),
    doc="The prepared training loader of the run (one set in ``on_train_epoch_start`` is used).",
)
eval_dataloader: part_property[Any] = part_property(
    attrgetter("loaders.eval"),
    lambda self, loader: setattr(self.loaders, "eval", loader),
    doc="The prepared evaluation loader (one set in ``on_eval_epoch_start`` is used).",
)

# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    self: Trainer,
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
        training_objects(self),
        save_path,
        checkpoint_kwargs,
        (save_optimizer, save_scheduler, save_per_node),
        model,
    )


def load_checkpoint(
    self: Trainer,
    checkpoint_path: str | os.PathLike,
    load_optimizer: bool = True,
    load_scheduler: bool = True,
    *,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """Load a file written by :meth:`save_checkpoint` (see :func:`.model_files.load_checkpoint`)."""
    return model_files.load_checkpoint(
        training_objects(self), checkpoint_path, (load_optimizer, load_scheduler), model
    )


def save_training_state(
    self: Trainer,
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
    self.state_store.save(training_objects(self), output_dir, checkpoint_kwargs, asynchronous)


def wait_for_training_state(self: Trainer) -> None:
    """Wait for a state saved with ``asynchronous=True`` (see :meth:`.TrainingStateStore.wait`)."""
    self.state_store.wait()


def load_training_state(self: Trainer, input_dir: str | os.PathLike) -> dict[str, Any]:
    """Restore a state saved by :meth:`save_training_state` (see :meth:`.TrainingStateStore.load`)."""
    return self.state_store.load(training_objects(self), input_dir)
