"""Step-level metrics of the training loop, measured without device-to-host syncs in between.

A callback that wants metrics every N optimizer updates asks for them when a run starts
(``trainer.loop_state.step_metrics.request(N)``; :class:`~pytorch_accelerated.callbacks.TrackingCallback`
does). From then on the loop keeps host-side counters (clock readings, sample counts) and, on
the updates where a point is due, the Trainer calls :meth:`StepMetrics.measure`: one collective
call and one device-to-host read for the whole point. On the other updates nothing is read
from the device. With no request, the loop does no extra work at all.

The metrics of a point at update ``k`` (the number of completed updates) cover the updates
since the previous point:

====================== ===============================================================
``train_loss``          mean training loss over those updates, on every process (weighted as
                        the epoch loss is: by samples, or by ``num_items_in_batch``)
``lr`` / ``lr_group_i`` learning rate of the param group (``lr`` with one group)
``grad_norm``           total gradient norm of update ``k`` (when clipping by norm, or when
                        asked for with ``grad_norm=True``)
``samples_per_second``  samples trained on by every process per second of training steps
``tokens_per_second``   the same for ``num_items_in_batch`` (when batches give it)
``step_time_seconds``   wall time per update on the main process (data loading included)
``data_wait_fraction``  the part of that time spent waiting for the next batch
``peak_memory_mb``      peak device memory allocated by the main process (CUDA/XPU only)
====================== ===============================================================

Time is measured on the host without synchronising: in steady state the host waits for the
device every few steps (at the latest at the point's read), so the rates are those of the device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from accelerate import Accelerator

    from .run_history import LossTracker

__all__ = ["StepMetrics"]


class StepMetrics:
    """The loop's step-metric counters and the measurement of a point (see the module docstring).

    Attributes:
        every_n_steps: updates between two points, or None when no callback asked for metrics.
        grad_norm_requested: compute the gradient norm of the updates where a point is due,
            also when not clipping by norm.
    """

    def __init__(self) -> None:
        self.every_n_steps: int | None = None
        self.grad_norm_requested = False
        # The epoch loss sum and count at the last point, and the part of the interval carried
        # over from earlier epochs (float64, on the device: subtracting never reads anything).
        self._loss_mark: tuple[Any, Any] = (0.0, 0)
        self._loss_carry: tuple[Any, Any] = (0.0, 0)
        self._start_interval()

    def _start_interval(self) -> None:
        self._busy = 0.0
        self._wait = 0.0
        self._step_start: float | None = None
        self._updates = 0
        self._samples: Any = 0
        self._items: Any = 0
        self._has_items = False

    # ------------------------------------------------------------------ asking

    def request(self, every_n_steps: int, grad_norm: bool = False) -> None:
        """Ask for a point every ``every_n_steps`` updates (the smallest interval asked for in a
        run wins); ``grad_norm`` asks for the gradient norm even when not clipping by norm."""
        current = self.every_n_steps
        self.every_n_steps = every_n_steps if current is None else min(current, every_n_steps)
        self.grad_norm_requested = self.grad_norm_requested or grad_norm

    @property
    def active(self) -> bool:
        return self.every_n_steps is not None

    def wants_grad_norm(self, global_step: int) -> bool:
        """Whether the update that completes ``global_step`` updates should measure its norm."""
        return self.grad_norm_requested and self.is_due(global_step)

    def is_due(self, global_step: int) -> bool:
        """Whether a point is due once ``global_step`` updates are complete: the rule of
        :func:`~pytorch_accelerated._internal.intervals.every`, inlined because the loop calls
        this after every update, where a nested call would add its cost (a test keeps the two
        the same)."""
        return self.every_n_steps is not None and global_step % self.every_n_steps == 0

    # ------------------------------------------------------------------ counting (host side)

    def timed(self, batches: Iterable[Any]) -> Iterable[Any]:
        """``batches``, timing the wait for each one and the step that follows (when active)."""
        return self._timed(batches) if self.active else batches

    def _timed(self, batches: Iterable[Any]) -> Iterator[Any]:
        clock = time.perf_counter
        iterator = iter(batches)
        while True:
            start = self._step_start = clock()
            try:
                item = next(iterator)
            except StopIteration:
                self._step_start = None
                return
            self._wait += clock() - start
            yield item  # the step runs here (a point measured during it moves _step_start on)
            self._busy += clock() - (self._step_start or start)
            self._step_start = None

    def batch_done(self, batch_output: dict[str, Any]) -> None:
        """Count the samples (and ``num_items_in_batch``) of a trained batch: no device read."""
        self._samples = self._samples + batch_output["batch_size"]
        items = batch_output.get("num_items_in_batch")
        if items is not None:
            self._has_items = True
            self._items = self._items + (items.detach() if isinstance(items, torch.Tensor) else items)

    def update_done(self) -> None:
        self._updates += 1

    def carry_epoch_loss(self, total: Any, count: Any) -> None:
        """Keep the loss since the last point of an epoch that ends (its sum is reset)."""
        self._loss_carry = self._pending_loss(total, count)
        self._loss_mark = (0.0, 0)

    def _pending_loss(self, total: Any, count: Any) -> tuple[Any, Any]:
        carry_total, carry_count = self._loss_carry
        mark_total, mark_count = self._loss_mark
        return carry_total + (_as_float64(total) - mark_total), carry_count + (count - mark_count)

    # ------------------------------------------------------------------ measuring a point

    def measure(
        self, accelerator: Accelerator, optimizer: Any, tracker: LossTracker, grad_norm: torch.Tensor | None
    ) -> dict[str, float]:
        """The metrics of the point due now, from the training loss's ``tracker`` (the epoch's
        sum), the ``optimizer``'s learning rates and the last ``grad_norm``: one collective call
        and one device-to-host read. Every process must call it; it starts the next interval."""
        loss_sum, loss_count = self._pending_loss(tracker.running_total, tracker.count)
        summed = [loss_sum, loss_count, self._samples, self._items]
        values = _reduce_sum(accelerator, summed + ([grad_norm] if grad_norm is not None else []))
        busy = self._busy + (time.perf_counter() - self._step_start if self._step_start is not None else 0.0)
        metrics = {"train_loss": values[0] / values[1] if values[1] else math.nan}
        metrics.update(_learning_rates(optimizer))
        if grad_norm is not None:
            metrics["grad_norm"] = values[4] / accelerator.num_processes  # the same on every process
        if busy > 0:
            metrics["samples_per_second"] = values[2] / busy
            if self._has_items:
                metrics["tokens_per_second"] = values[3] / busy
            metrics["data_wait_fraction"] = min(self._wait / busy, 1.0)
        if self._updates:
            metrics["step_time_seconds"] = busy / self._updates
        metrics.update(_peak_memory(accelerator.device))
        self._loss_mark, self._loss_carry = (_as_float64(tracker.running_total), tracker.count), (0.0, 0)
        step_start = self._step_start
        self._start_interval()
        if step_start is not None:  # measured during a step: the rest of it counts in the next interval
            self._step_start = time.perf_counter()
        return metrics

    # ------------------------------------------------------------------ saving and resuming

    def process_state_dict(self, total: Any, count: Any) -> dict[str, Any]:
        """This process's loss since the last point, given the epoch's sum and count now."""
        pending_total, pending_count = self._pending_loss(total, count)
        return {"loss_since_point": {"total": pending_total, "count": pending_count}}

    def load_process_state_dict(
        self, state: dict[str, Any] | None, total: Any, count: Any, device: Any
    ) -> None:
        """Restore :meth:`process_state_dict`, given the restored epoch sum and count."""
        pending = (state or {}).get("loss_since_point")
        if pending is None:
            self._loss_carry, self._loss_mark = (0.0, 0), (_as_float64(total), count)
            return
        saved_total = pending["total"]
        self._loss_carry = (
            saved_total.to(device) if isinstance(saved_total, torch.Tensor) else saved_total,
            pending["count"],
        )
        self._loss_mark = (_as_float64(total), count)


def _as_float64(value: Any) -> Any:
    return value.detach().to(torch.float64) if isinstance(value, torch.Tensor) else float(value)


def _reduce_sum(accelerator: Accelerator, values: list[Any]) -> list[float]:
    """Sum ``values`` (host numbers or device tensors) over the processes with one collective
    call, and read the result with one device-to-host copy."""
    device = accelerator.device
    # The host numbers in one tensor, then the device values: a few ops rather than a few per value.
    host = [float(value) for value in values if not isinstance(value, torch.Tensor)]
    on_device = [
        v.detach().to(device=device, dtype=torch.float64).reshape(1)
        for v in values
        if isinstance(v, torch.Tensor)
    ]
    stacked = torch.cat([torch.tensor(host, dtype=torch.float64, device=device), *on_device])
    if accelerator.num_processes > 1:
        stacked = accelerator.reduce(stacked, reduction="sum")
    read = stacked.tolist()
    host_read, device_read = iter(read[: len(host)]), iter(read[len(host) :])
    return [next(device_read) if isinstance(value, torch.Tensor) else next(host_read) for value in values]


def _learning_rates(optimizer: Any) -> dict[str, float]:
    groups = getattr(optimizer, "param_groups", None) or []
    if len(groups) == 1:
        return {"lr": float(groups[0]["lr"])}
    return {f"lr_group_{index}": float(group["lr"]) for index, group in enumerate(groups)}


def _peak_memory(device: torch.device) -> dict[str, float]:
    """Peak memory allocated on ``device`` since the last point, where the device reports it."""
    module = getattr(torch, device.type, None) if device.type in ("cuda", "xpu") else None
    if module is None or not module.is_available():
        return {}
    peak = module.max_memory_allocated(device) / 2**20
    module.reset_peak_memory_stats(device)
    return {"peak_memory_mb": peak}
