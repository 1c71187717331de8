"""Checks of user input, each with a message that names the value received and the fix."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType
from accelerate.utils.deepspeed import DummyOptim
from torch import nn

from .errors import StopTrainingError

if TYPE_CHECKING:
    from ..train_arguments import TrainArguments


def check_whole_number(
    value: Any, name: str, *, minimum: int = 1, optional: bool = False, owner: str = "", hint: str = ""
) -> Any:
    """Return ``value`` as an ``int`` if it is a whole number >= ``minimum`` (or None if ``optional``).

    The one check of counts in the package, with one wording, e.g.
    ``"LimitBatchesCallback: num_batches must be a whole number >= 1, got 0."``.

    Raises:
        ValueError: naming ``owner`` (the class or function that takes the argument), ``name``,
            what is allowed and the value seen, then ``hint``.

    >>> check_whole_number(3, "num_epochs")
    3
    >>> check_whole_number(0, "num_batches", owner="LimitBatchesCallback")
    Traceback (most recent call last):
    ...
    ValueError: LimitBatchesCallback: num_batches must be a whole number >= 1, got 0.
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        allowed = f"a whole number >= {minimum}" + (" or None" if optional else "")
        where = f"{owner}: " if owner else ""
        raise ValueError(f"{where}{name} must be {allowed}, got {value!r}." + (f" {hint}" if hint else ""))
    return int(value)


def check_trainer_arguments(model: Any, loss_func: Any, optimizer: Any) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"model must be a torch.nn.Module, got {type(model).__name__}. Wrap your function in "
            f"an nn.Module subclass whose forward() computes the model outputs."
        )
    if loss_func is not None and not callable(loss_func):
        raise TypeError(f"loss_func must be callable (e.g. nn.CrossEntropyLoss()), got {loss_func!r}.")
    # A torch optimizer, accelerate's DummyOptim, or anything with step and zero_grad.
    if not (
        optimizer is None
        or isinstance(optimizer, (torch.optim.Optimizer, DummyOptim))
        or (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None)))
    ):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, accelerate's DummyOptim (DeepSpeed with "
            f"the optimizer in its config) or an object with step() and zero_grad() methods, got "
            f"{type(optimizer).__name__}. Create it from the model's parameters, e.g. "
            f"torch.optim.SGD(model.parameters(), lr=0.01)."
        )


def check_positive_number(value: Any, name: str) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise ValueError(f"{name} must be a number > 0 or None, got {value!r}.")


def check_callbacks(callbacks: Any) -> None:
    """Check that ``callbacks`` is a collection (each one is checked when it is added)."""
    if isinstance(callbacks, Iterable) and not isinstance(callbacks, (str, bytes)):
        return
    if callbacks is None:
        raise TypeError(
            "callbacks must be a list of callbacks, got None: pass callbacks=() for none, or "
            "DEFAULT_CALLBACKS (the default) for the progress bar and printed metrics."
        )
    if hasattr(callbacks, "custom_events"):  # one TrainerCallback, or one class of them
        name = callbacks.__name__ if isinstance(callbacks, type) else type(callbacks).__name__
        raise TypeError(
            f"callbacks must be a list of callbacks, got one {name}: pass a list: "
            f"callbacks=[{name if isinstance(callbacks, type) else f'{name}()'}]."
        )
    raise TypeError(f"callbacks must be a list of TrainerCallback instances or classes, got {callbacks!r}.")


def check_optimizer_holds_model_parameters(model: nn.Module, optimizer: Any) -> None:
    """Fail when ``optimizer`` holds none of ``model``'s trainable parameters (some suffice).

    An optimizer accelerate has already wrapped is not checked again: it may hold copies
    (DeepSpeed); neither is anything but a torch optimizer (e.g. accelerate's ``DummyOptim``).
    """
    if isinstance(optimizer, AcceleratedOptimizer) or not isinstance(optimizer, torch.optim.Optimizer):
        return
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if trainable and not trainable & held:
        raise ValueError(
            f"optimizer holds none of the model's {len(trainable)} trainable parameter tensors (it "
            f"holds {len(held)} others), so training would change nothing: it was probably built over "
            f"another model or a copy of this one. To fix it, create the optimizer from this model's "
            f"parameters: torch.optim.SGD(model.parameters(), ...)."
        )


def check_optional_callable(value: Any, name: str, what: str, example: str = "") -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be {what} (or None), got {value!r} ({type(value).__name__}).{example}")


def check_seed(seed: Any) -> None:
    """A seed is a whole number numpy accepts (0 to 2**32 - 1), or None to leave the RNGs alone."""
    check_whole_number(seed, "seed", minimum=0, optional=True)
    if seed is not None and seed > 2**32 - 1:
        raise ValueError(f"seed must be at most 2**32 - 1 (numpy's limit), got {seed}.")


def check_dataloader_kwargs(kwargs: Any, name: str) -> None:
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(
            f"{name} must be a dict of DataLoader arguments (or None), got {type(kwargs).__name__}: "
            f"{kwargs!r}. E.g. {name}={{'batch_size': 4}}."
        )
    if kwargs is not None and "batch_size" in kwargs:
        check_whole_number(kwargs["batch_size"], f"{name}['batch_size']", optional=True)


def check_flag(value: Any, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__}).")


def check_collate_fn(collate_fn: Any) -> None:
    check_optional_callable(collate_fn, "collate_fn", "a function that makes a batch from a list of samples")


def check_evaluate_arguments(
    dataset: Any, per_device_batch_size: Any, dataloader_kwargs: Any, collate_fn: Any, seed: Any
) -> None:
    """Check the arguments of ``evaluate()``."""
    check_whole_number(per_device_batch_size, "per_device_batch_size")
    check_dataset(dataset, "dataset")
    check_dataloader_kwargs(dataloader_kwargs, "dataloader_kwargs")
    check_collate_fn(collate_fn)
    check_seed(seed)


def check_epoch_has_batches(loader: Any, dataset: Any, name: str, num_processes: int) -> None:
    """Fail when the prepared ``loader`` over ``dataset`` (the argument ``name`` of ``train()`` or
    ``evaluate()``; the loader's arguments are named after it) would give an epoch of 0 batches on
    one process of ``num_processes`` (all have the same count). A stream is not checked. No
    collective call is made."""
    try:
        if loader is None or len(loader) > 0:
            return
    except TypeError:  # a stream: its length is not known
        return
    kwargs_name = name.replace("dataset", "dataloader_kwargs")
    batch_sampler = getattr(loader, "batch_sampler", None)
    batch_size, drop_last = (
        getattr(batch_sampler, "batch_size", None),
        getattr(batch_sampler, "drop_last", False),
    )
    num_samples = len(dataset)
    if not drop_last or batch_size is None:
        raise ValueError(
            f"{name} has {num_samples} samples but its data loader gives 0 batches per epoch on each "
            f"process. Check the sampler or batch_sampler in {kwargs_name}."
        )
    raise ValueError(
        f"{name} has {num_samples} samples but per_device_batch_size x processes is {batch_size} x "
        f"{num_processes} = {batch_size * num_processes} and drop_last=True: every epoch would have 0 "
        f"batches. Pass drop_last=False in {kwargs_name}, "
        + (
            f"a per_device_batch_size of at most {num_samples // num_processes}, "
            if num_samples >= num_processes
            else "fewer processes, "
        )
        + "or more data."
    )


def nothing_left_to_train(progress: Any, config: Any) -> bool:
    """Whether a run at ``progress`` (a ``RunProgress``) has already reached the ``num_epochs`` or
    ``max_num_train_steps`` of ``config``."""
    limit = config.train_steps_limit
    return progress.epoch >= config.num_epochs or (limit is not None and progress.global_step >= limit)


def epochs_trained(progress: Any, epoch_trained: bool, batches_per_epoch: int | None) -> str:
    """What a run at ``progress`` has trained, in words: its whole epochs (an epoch whose batches
    are all trained counts, though its end has not come; ``epoch_trained``: its training part is
    done), and the batches of the epoch it is in."""
    batches, epoch = progress.batch_index, progress.epoch
    whole = epoch + int(epoch_trained or (batches_per_epoch is not None and batches >= batches_per_epoch))
    trained = f"{whole} epoch{'s' if whole != 1 else ''}"
    if whole > epoch or batches == 0:
        return trained
    if batches_per_epoch is None:  # a stream: its length is not known
        return f"{trained} and {batches} batch{'es' if batches != 1 else ''} of epoch {epoch + 1}"
    return f"{trained} and {batches} of the {batches_per_epoch} batches of epoch {epoch + 1}"


def check_something_left_to_train(
    progress: Any, config: Any, state: str, trained: str, auto: tuple[str, Any] | None = None
) -> None:
    """After a resume: stop (a :class:`StopTrainingError`, which ends ``train()`` before it starts and
    prints its message once) when the resumed ``state`` (as the message names it) already reached
    ``num_epochs`` or ``max_num_train_steps``, so that nothing would be trained; ``trained``: what it
    trained, in words (:func:`epochs_trained`); ``auto``: the run id and folder of states, when
    ``resume_from="auto"`` chose it (the message says how to start a new run instead)."""
    if not nothing_left_to_train(progress, config):
        return
    limit = config.train_steps_limit
    done, setting, value = (
        (
            f"{progress.global_step} optimizer update{'s' if progress.global_step != 1 else ''}",
            "max_num_train_steps",
            limit,
        )
        if limit is not None
        else (trained, "num_epochs", config.num_epochs)
    )
    message = (
        f"Nothing to train: the state resumed from {state} already completed {done} ({setting}={value}). "
        f"Pass a larger {setting} to continue."
    )
    if auto is not None:  # a relaunch of a finished run: it ends here, and the states stay as they are
        message += (
            f' resume_from="auto" continues run {auto[0]}, whose states are in {auto[1]}; to start a new '
            f"run, save into another (or an empty) folder."
        )
    raise StopTrainingError(message)


def check_train_arguments(accelerator: Any, model: Any, optimizer: Any, arguments: TrainArguments) -> None:
    """Check every argument of ``train()`` before anything is set up; ``accelerator`` tells which
    clipping and accumulation its set-up supports.

    Raises:
        ValueError / TypeError: naming the argument, the value seen and the fix.
    """
    if optimizer is None:
        raise ValueError(
            "train() needs an optimizer, but the Trainer was created with optimizer=None. Pass "
            "one, e.g. Trainer(model, loss_func, torch.optim.AdamW(model.parameters()))."
        )
    check_optimizer_holds_model_parameters(model, optimizer)
    check_whole_number(arguments.num_epochs, "num_epochs")
    check_whole_number(arguments.per_device_batch_size, "per_device_batch_size")
    check_whole_number(arguments.gradient_accumulation_steps, "gradient_accumulation_steps")
    check_whole_number(arguments.max_num_train_steps, "max_num_train_steps", optional=True)
    check_positive_number(arguments.gradient_clip_value, "gradient_clip_value")
    check_positive_number(arguments.max_grad_norm, "max_grad_norm")
    check_clipping_supported(accelerator, arguments.gradient_clip_value)
    check_accumulation_supported(accelerator, arguments.gradient_accumulation_steps)
    check_dataset(arguments.train_dataset, "train_dataset")
    if arguments.eval_dataset is not None:
        check_dataset(arguments.eval_dataset, "eval_dataset")
    check_optional_callable(
        arguments.create_scheduler_fn,
        "create_scheduler_fn",
        "a function optimizer -> scheduler",
        " E.g. create_scheduler_fn=CosineLrScheduler.create_scheduler_fn() or "
        "functools.partial(torch.optim.lr_scheduler.StepLR, step_size=10).",
    )
    check_collate_fn(arguments.collate_fn)
    check_seed(arguments.seed)
    check_flag(arguments.reset_run_history, "reset_run_history")
    resume_from = arguments.resume_from
    if resume_from is not None and not isinstance(resume_from, (str, os.PathLike)):
        raise TypeError(
            f"resume_from must be a path (str or os.PathLike) to a training state or a folder of "
            f'them, "auto" (the folder of the SaveTrainingStateCallback, or a new run), or None; got '
            f"{resume_from!r} ({type(resume_from).__name__})."
        )
    check_dataloader_kwargs(arguments.train_dataloader_kwargs, "train_dataloader_kwargs")
    check_dataloader_kwargs(arguments.eval_dataloader_kwargs, "eval_dataloader_kwargs")


def check_clipping_supported(accelerator: Any, gradient_clip_value: Any) -> None:
    """Refuse clipping by value where accelerate refuses it (DeepSpeed, FSDP version 1), before
    anything is set up, instead of at the first update."""
    if gradient_clip_value is None:
        return
    engine = accelerator.distributed_type
    if engine == DistributedType.DEEPSPEED:
        raise ValueError(
            f"gradient_clip_value={gradient_clip_value!r} clips each gradient element, which accelerate "
            f"does not support under DeepSpeed (its engine holds the gradients). Clip the total norm "
            f"instead: remove gradient_clip_value and set the norm in the DeepSpeed config "
            f"(gradient_clipping: 1.0, or DeepSpeedPlugin(gradient_clipping=1.0)), which DeepSpeed "
            f"applies; train(max_grad_norm=...) then records the norm DeepSpeed measured."
        )
    if engine == DistributedType.FSDP and not accelerator.is_fsdp2:
        raise ValueError(
            f"gradient_clip_value={gradient_clip_value!r} clips each gradient element, which accelerate "
            f"does not support under FSDP (version 1; the gradients are sharded). Clip the total norm "
            f"instead: train(max_grad_norm=1.0, ...) in place of gradient_clip_value."
        )


def check_accumulation_supported(accelerator: Any, gradient_accumulation_steps: int) -> None:
    """Refuse gradient accumulation under DeepSpeed, where it would be silently wrong.

    accelerate tells DeepSpeed's engine at each ``backward`` whether the batch ends an
    accumulation window from its own ``accumulate()`` state, which the Trainer does not drive:
    the engine would update after every batch (and divide the loss by its own accumulation).
    """
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    plugin = accelerator.deepspeed_plugin
    configured = plugin.deepspeed_config.get("gradient_accumulation_steps") if plugin is not None else None
    if gradient_accumulation_steps != 1 or configured not in (None, "auto", 1):
        raise ValueError(
            f"Gradient accumulation is not supported under DeepSpeed (train(gradient_accumulation_steps="
            f"{gradient_accumulation_steps}), DeepSpeed config gradient_accumulation_steps={configured!r}): "
            f"DeepSpeed's engine would update after every batch. Set gradient_accumulation_steps to 1 in "
            f"both, and raise per_device_batch_size (or the number of processes) for more samples per update."
        )


def check_not_a_dataloader(dataset: Any, name: str) -> None:
    """A ``DataLoader`` passed where the Trainer wants the data set it would load from."""
    if isinstance(dataset, torch.utils.data.DataLoader):
        raise TypeError(
            f"{name} must be a data set (a torch Dataset), got a DataLoader: the Trainer builds its own "
            f"loaders. Pass the loader's data set ({name}=loader.dataset), with its batch size as "
            f"per_device_batch_size and other loader arguments in the *dataloader_kwargs; to use your "
            f"own loader, override create_train_dataloader / create_eval_dataloader "
            f"(docs/inside-the-trainer.md, 'Your own data loader')."
        )


def check_dataset(dataset: Any, name: str) -> None:
    check_not_a_dataloader(dataset, name)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return
    try:
        if len(dataset) == 0:
            raise ValueError(
                f"{name} is empty (len 0): there is nothing to iterate over. Check how it was built or filtered."
            )
    except TypeError:
        raise TypeError(
            f"{name} must be a torch Dataset with __len__ (or an IterableDataset), got "
            f"{type(dataset).__name__}."
        ) from None


def check_batch_output(batch_output: Any, method: str) -> None:
    """Check what calculate_*_batch_loss returned (cheap: attribute reads only, no sync)."""
    if not isinstance(batch_output, dict) or "loss" not in batch_output or "batch_size" not in batch_output:
        keys = sorted(batch_output) if isinstance(batch_output, dict) else type(batch_output).__name__
        raise TypeError(
            f"{method} must return a dict with at least 'loss' and 'batch_size' (and usually "
            f"'model_outputs'), got {keys}."
        )
    loss = batch_output["loss"]
    if isinstance(loss, tuple):
        raise TypeError(
            f"{method} returned a loss that is a tuple of {len(loss)} ({', '.join(type(v).__name__ for v in loss)}): "
            f"the loss function probably returns extra outputs beside the loss. The Trainer needs the "
            f"loss as a scalar tensor: override {method} to return {{'loss': loss, ...}} from the "
            f"tuple (put the extra outputs in the returned dict under keys of your own, or record "
            f"them with trainer.run_history.update_metric)."
        )
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"{method} returned a loss that is not a scalar tensor (got {shape}). Reduce it to one "
            f"number per batch, e.g. use reduction='mean' in the loss function or call .mean()."
        )
