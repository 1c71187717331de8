"""How the batches of a gradient-accumulation window are cut and weighted.

An update's gradient must be the mean over every item (sample, or token when
``num_items_in_batch`` is given) of its window, on every process. Each batch's mean loss is
scaled by ``weight / reference`` before backward, where the reference is the weight a window of
full batches would have; after the window, gradients are corrected by ``reference / true
weight`` when the two differ (a smaller last batch, a partial last window, token counts). For
the usual full windows of equal batches the correction is exactly 1 and costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from accelerate import Accelerator


def accumulation_windows(
    batches: Iterable[Any], start: int, accumulation: int, num_batches: int | None
) -> Iterator[tuple[int, Any, int, bool]]:
    """Yield ``(step, batch, window_size, is_update_step)`` for each batch, counting from ``start``.

    With ``num_batches`` (this epoch's batches after ``start``) known, the last window is cut to
    the batches left. Without it (a stream), each batch is fetched one ahead to tell the last
    one, which then completes its window; windows are weighted as full, and the gradient
    correction after a short last window makes up the difference.
    """
    if num_batches is not None:
        end = start + num_batches
        for step, batch in enumerate(batches, start=start):
            window_start = step - step % accumulation
            window_size = min(accumulation, end - window_start)
            yield step, batch, window_size, step + 1 == window_start + window_size
        return
    iterator = iter(batches)
    sentinel = object()
    batch, step = next(iterator, sentinel), start
    while batch is not sentinel:
        following = next(iterator, sentinel)
        yield step, batch, accumulation, following is sentinel or (step + 1) % accumulation == 0
        batch, step = following, step + 1


class WindowWeighting:
    """Scales batch losses and corrects gradients so each update averages over its items.

    Args:
        accelerator: used to agree on item counts across processes.
        per_device_batch_size: the weight of a full batch when batches are weighted by samples.
    """

    def __init__(self, accelerator: Accelerator, per_device_batch_size: int) -> None:
        self.accelerator = accelerator
        self.per_device_batch_size = per_device_batch_size
        # Read once: accelerate's num_processes is a property that looks up the shared state,
        # and scale() and correct_gradients() ask on every batch.
        self._multi_process = accelerator.num_processes > 1
        #: The reference weight of one batch; saved with the training state.
        self.unit: float | None = None
        #: Batches are weighted by ``num_items_in_batch``, which may differ between processes.
        self.counts_items = False

    def weight_of(self, batch_output: dict[str, Any]) -> Any:
        """The weight of a batch in its window: ``num_items_in_batch`` if given, else ``batch_size``.

        A one-element tensor count is taken as a scalar, so the scaled loss stays a scalar.
        """
        if "num_items_in_batch" not in batch_output:
            return batch_output["batch_size"]
        self.counts_items = True
        weight = batch_output["num_items_in_batch"]
        return weight.reshape(()) if isinstance(weight, torch.Tensor) else weight

    def scale(self, loss: torch.Tensor, weight: Any, window_size: int) -> torch.Tensor:
        """Return the batch's mean ``loss`` scaled for its share of the window."""
        if window_size == 1 and not self._multi_process:  # one batch, one process: nothing to do
            return loss
        return loss * (weight / (self._unit(weight) * window_size))

    def correct_gradients(self, model: torch.nn.Module, window_weight: Any, window_size: int) -> None:
        """After a window's backward passes, rescale the gradients of ``model``'s parameters by
        reference / true weight.

        Item counts may differ between processes, so with several processes their total is
        summed over all of them (one all-reduce per update, only when counting items).
        """
        if window_size == 1 and not self._multi_process:  # as in scale(): nothing to correct
            return
        reference = self._unit(window_weight) * window_size
        processes = self.accelerator.num_processes
        if isinstance(window_weight, torch.Tensor) or (self.counts_items and processes > 1):
            local = torch.as_tensor(window_weight, device=self.accelerator.device).detach().float().reshape(1)
            total = self.accelerator.reduce(local, reduction="sum")
            factor: Any = reference * processes / total
        else:
            # Sample counts are equal on every process (accelerate gives each the same batches).
            if window_weight == reference:
                return
            factor = reference / window_weight
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if grads:
            if isinstance(factor, torch.Tensor):
                factor = factor.to(grads[0].device).reshape(())
            torch._foreach_mul_(grads, factor)

    def _unit(self, weight: Any) -> float:
        if self.unit is None:
            if isinstance(weight, torch.Tensor) or self.counts_items:
                # Once per run: the reference must be the same number on every process.
                local = torch.as_tensor(weight, device=self.accelerator.device).detach().float().reshape(1)
                mean = self.accelerator.reduce(local, reduction="mean")
                self.unit = float(mean.item()) or 1.0
            else:
                self.unit = float(self.per_device_batch_size)
        return self.unit
