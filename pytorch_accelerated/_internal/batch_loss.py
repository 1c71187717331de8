"""What the default ``calculate_train_batch_loss`` and ``calculate_eval_batch_loss`` do with a
batch: take it apart into inputs and targets, count its samples, and compute its loss, with an
error that says how to fix a batch or model outputs of another shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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


def loss_of(loss_func: Any, model_outputs: Any, targets: Any) -> Any:
    """``loss_func(model_outputs, targets)``; when it fails on outputs that are not a tensor (a
    tuple, a ``ModelOutput``), the error says so and how to fix it (chained to the original)."""
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
        returned = f"a {kind} (a dict with keys {list(model_outputs)}{model_output})"
        pick = "outputs.logits" if has_logits else "outputs[key]"
    else:
        returned, pick = f"a {kind}", "the logits"
    return TypeError(
        f"The model returned {returned}, not a tensor, and the loss function could not take it "
        f"({type(error).__name__}: {error}). The default calculate_*_batch_loss passes the model's "
        f"outputs to loss_func as they are: override calculate_train_batch_loss and "
        f"calculate_eval_batch_loss to pass the logits ({pick}) to the loss, or wrap the model so "
        f"that its forward() returns the logits."
    )
