"""Checks of user input, each with a message that names the value received and the fix."""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import nn


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
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}. Create "
            f"it from the model's parameters, e.g. torch.optim.SGD(model.parameters(), lr=0.01)."
        )


def check_positive_number(value: Any, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0 or None, got {value!r}.")


def check_train_arguments(
    *,
    optimizer: Any,
    train_dataset: Any,
    eval_dataset: Any,
    num_epochs: Any,
    per_device_batch_size: Any,
    max_num_train_steps: Any,
    gradient_accumulation_steps: Any,
    gradient_clip_value: Any,
    max_grad_norm: Any,
) -> None:
    if optimizer is None:
        raise ValueError(
            "train() needs an optimizer, but the Trainer was created with optimizer=None. Pass "
            "one, e.g. Trainer(model, loss_func, torch.optim.AdamW(model.parameters()))."
        )
    check_whole_number(num_epochs, "num_epochs")
    check_whole_number(per_device_batch_size, "per_device_batch_size")
    check_whole_number(gradient_accumulation_steps, "gradient_accumulation_steps")
    check_whole_number(max_num_train_steps, "max_num_train_steps", optional=True)
    check_positive_number(gradient_clip_value, "gradient_clip_value")
    check_positive_number(max_grad_norm, "max_grad_norm")
    check_dataset(train_dataset, "train_dataset")
    if eval_dataset is not None:
        check_dataset(eval_dataset, "eval_dataset")


def check_dataset(dataset: Any, name: str) -> None:
    if isinstance(dataset, torch.utils.data.IterableDataset):
        return
    try:
        length = len(dataset)
    except TypeError:
        raise TypeError(
            f"{name} must be a torch Dataset with __len__ (or an IterableDataset), got "
            f"{type(dataset).__name__}."
        ) from None
    if length == 0:
        raise ValueError(f"{name} is empty (len 0): there is nothing to iterate over. Check how it was built or filtered.")


def check_batch_output(batch_output: Any, method: str) -> None:
    """Check what calculate_*_batch_loss returned (cheap: attribute reads only, no sync)."""
    if not isinstance(batch_output, dict) or "loss" not in batch_output or "batch_size" not in batch_output:
        keys = sorted(batch_output) if isinstance(batch_output, dict) else type(batch_output).__name__
        raise TypeError(
            f"{method} must return a dict with at least 'loss' and 'batch_size' (and usually "
            f"'model_outputs'), got {keys}."
        )
    loss = batch_output["loss"]
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(
            f"{method} returned a loss that is not a scalar tensor (got {shape}). Reduce it to one "
            f"number per batch, e.g. use reduction='mean' in the loss function or call .mean()."
        )


def unpack_batch(batch: Any, method: str) -> tuple[Any, Any]:
    try:
        return batch[0], batch[1]
    except (TypeError, IndexError, KeyError) as error:
        raise TypeError(
            f"The default {method} expects each batch to be a pair (inputs, targets), but got "
            f"{type(batch).__name__}: {error}. Return (inputs, targets) from your dataset or "
            f"collate_fn, or override {method} to unpack your batches."
        ) from error


def batch_size_of(inputs: Any) -> int:
    if isinstance(inputs, torch.Tensor):
        return inputs.shape[0] if inputs.dim() > 0 else 1
    return len(inputs)
