"""How the batches of a gradient-accumulation window are weighted.

An update's gradient must be the mean over every item (sample, or token when
``num_items_in_batch`` is given) of its window, on every process. Each batch's mean loss is
scaled by ``weight / reference`` before backward, where the reference is the weight a window of
full batches would have; after the window, gradients are corrected by ``reference / true
weight`` when the two differ (a smaller last batch, a partial last window, token counts). For
the usual full windows the correction is exactly 1 and costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from accelerate import Accelerator


class WindowWeighting:
    """Scales batch losses and corrects gradients so each update averages over its items.

    Args:
        accelerator: used to agree on token counts across processes.
        per_device_batch_size: the weight of a full batch when batches are weighted by samples.
    """

    def __init__(self, accelerator: Accelerator, per_device_batch_size: int) -> None:
        self.accelerator = accelerator
        self.per_device_batch_size = per_device_batch_size
        #: The reference weight of one batch; saved with the training state.
        self.unit: float | None = None

    def _needed(self, window_size: int) -> bool:
        return window_size > 1 or self.accelerator.num_processes > 1

    def scale(self, loss: torch.Tensor, weight: Any, window_size: int) -> torch.Tensor:
        """Return the batch's mean ``loss`` scaled for its share of the window."""
        if not self._needed(window_size):
            return loss
        return loss * (weight / (self._unit(weight) * window_size))

    def correct_gradients(self, parameters: Iterable[torch.nn.Parameter], window_weight: Any, window_size: int) -> None:
        """After a window's backward passes, rescale gradients by reference / true weight."""
        if not self._needed(window_size):
            return
        reference = self._unit(window_weight) * window_size
        if isinstance(window_weight, torch.Tensor):
            # Token counts differ between processes, so the total is summed over all of them.
            total = self.accelerator.reduce(window_weight.detach().float().reshape(1), reduction="sum")
            factor: Any = reference * self.accelerator.num_processes / total
        else:
            # Sample counts are equal on every process (accelerate gives each the same batches).
            if window_weight == reference:
                return
            factor = reference / window_weight
        grads = [p.grad for p in parameters if p.grad is not None]
        if grads:
            if isinstance(factor, torch.Tensor):
                factor = factor.to(grads[0].device).reshape(())
            torch._foreach_mul_(grads, factor)

    def _unit(self, weight: Any) -> float:
        if self.unit is None:
            if isinstance(weight, torch.Tensor):
                # One host read per run: the reference must be the same number on every process.
                mean = self.accelerator.reduce(weight.detach().float().reshape(1), reduction="mean")
                self.unit = float(mean.item()) or 1.0
            else:
                self.unit = float(self.per_device_batch_size)
        return self.unit
