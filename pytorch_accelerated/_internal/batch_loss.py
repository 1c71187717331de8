"""What the default ``calculate_train_batch_loss`` and ``calculate_eval_batch_loss`` do with a
batch: take it apart into inputs and targets, count its samples, and compute its loss, with an
error that says how to fix a batch or model outputs of another shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def unpack_batch(batch: Any, method: str) -> tuple[Any, Any]:
    if isinstance(batch, Mapping):
        raise TypeError(
            f"The default {method} unpacks each batch as inputs, targets = batch[0], batch[1], but "
            f"got a {type(batch).__name__} batch with keys {list(batch)}. For dict batches, override "
            f"calculate_train_batch_loss and calculate_eval_batch_loss to take the inputs and targets "
            f"by key, e.g. self.model(batch['input']) and batch['label']."
        )
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


def loss_of(loss_func: Any, model_outputs: Any, targets: Any, method: str) -> Any:
    """``loss_func(model_outputs, targets)`` for the Trainer's default ``method``; when it fails on
    outputs that are not a tensor (a tuple, a ``ModelOutput``), the error says so and how to fix it
    (chained to the original)."""
    if loss_func is None:
        raise ValueError(
            f"The default {method} needs a loss function, but the Trainer was created with "
            f"loss_func=None. Pass one, e.g. Trainer(model, nn.CrossEntropyLoss(), optimizer), "
            f"or override {method}."
        )
    try:
        return loss_func(model_outputs, targets)
    except (TypeError, AttributeError) as error:
        if isinstance(model_outputs, torch.Tensor):
            raise
        raise _model_outputs_error(model_outputs, error) from error


def _model_outputs_error(model_outputs: Any, error: Exception) -> TypeError:
    kind = type(model_outputs).__name__
    if isinstance(model_outputs, tuple):
        returned, pick = f"a tuple of {len(model_outputs)}", "outputs[0]"
    elif isinstance(model_outputs, Mapping):
        has_logits = hasattr(model_outputs, "logits")
        model_output = "; a transformers ModelOutput?" if has_logits else ""
        returned, pick = (
            f"a {kind} (a dict with keys {list(model_outputs)}{model_output})",
            "outputs.logits" if has_logits else "outputs[key]",
        )
    else:
        returned, pick = f"a {kind}", "the logits"
    return TypeError(
        f"The model returned {returned}, not a tensor, and the loss function could not take it "
        f"({type(error).__name__}: {error}). The default calculate_*_batch_loss passes the model's "
        f"outputs to loss_func as they are: override calculate_train_batch_loss and "
        f"calculate_eval_batch_loss to pass the logits ({pick}) to the loss, or wrap the model so "
        f"that its forward() returns the logits."
    )


def loss_without_grad_error(model: Any, error: RuntimeError) -> RuntimeError | None:
    """For ``error`` from the backward pass of a loss that did not require grad, an error that
    says why (every parameter frozen, or a loss cut off from them) and how to fix it; else None."""
    if "does not require grad" not in str(error):
        return None
    parameters = dict(model.named_parameters())
    if any(parameter.requires_grad for parameter in parameters.values()):
        return RuntimeError(
            f"The training loss does not require grad, so there is nothing to compute gradients of "
            f"({error}): the model has trainable parameters, but the loss was computed without them, "
            f"under torch.no_grad() or from detached values (.detach(), .item(), a new tensor). "
            f"Compute the loss in calculate_train_batch_loss from the model's outputs, with grad enabled."
        )
    return RuntimeError(
        f"No parameter of the model requires grad: all {len(parameters)} parameter tensors "
        f"({', '.join(list(parameters)[:5]) + (', ...' if len(parameters) > 5 else '')}) "
        f"are frozen (requires_grad=False), so the loss has no gradient ({error}). Unfreeze the ones "
        f"to train before training (parameter.requires_grad_(True), or ModelFreezer's unfreeze()); "
        f"an optimizer built over them trains them once they are unfrozen."
    )
