"""Run history and loss tracking.

The run history holds one value per epoch for each metric (``train_loss_epoch``,
``eval_loss_epoch``, anything a callback records) and step-indexed series of ``(step, value)``
points (the step metrics); :class:`LossTracker` averages per-batch
losses without forcing a device-to-host copy on every step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from typing import Any

import torch

__all__ = ["RunHistory", "InMemoryRunHistory", "LossTracker", "MetricNotFoundError"]


class MetricNotFoundError(KeyError, ValueError):
    """Raised by ``get_latest_metric`` for a metric with no recorded values.

    It is both a :class:`KeyError` (as a missing key) and a :class:`ValueError` (what
    pytorch-accelerated 0.1.61 raised), so ``except`` clauses written for either catch it.
    """

    def __str__(self) -> str:
        # KeyError's own __str__ would show the message in quotes, as if it were the key.
        return str(self.args[0]) if self.args else ""


class RunHistory(ABC):
    """The interface of a store for the metrics recorded during training runs."""

    @abstractmethod
    def get_metric_names(self) -> set[str]:
        """Return the names of every metric recorded so far."""

    @abstractmethod
    def get_metric_values(self, metric_name: str) -> list[Any]:
        """Return every value recorded for ``metric_name``, oldest first."""

    @abstractmethod
    def get_latest_metric(self, metric_name: str) -> Any:
        """Return the most recent value of ``metric_name``.

        Raises:
            MetricNotFoundError: (a KeyError and a ValueError) if nothing was recorded for it.
        """

    @abstractmethod
    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        """Record ``metric_value`` for ``metric_name`` (with the current prefix)."""

    @abstractmethod
    def delete_metric(self, metric_name: str) -> None:
        """Forget every value of ``metric_name``."""

    @abstractmethod
    def set_metric_name_prefix(self, prefix: str = "") -> None:
        """Prepend ``prefix`` to the names of metrics recorded from now on."""

    @property
    @abstractmethod
    def metric_name_prefix(self) -> str:
        """The prefix added to metric names when they are recorded."""

    @property
    @abstractmethod
    def current_epoch(self) -> int:
        """The epoch being run, starting at 1."""

    @abstractmethod
    def _increment_epoch(self) -> None:
        """Move on to the next epoch (called by the Trainer at the end of each epoch)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every metric and start again at epoch 1."""

    def set_current_epoch(self, epoch: int) -> None:
        """Make :attr:`current_epoch` equal ``epoch`` (counted from 1).

        The Trainer calls this as a run moves on and when a training state is restored, so the
        history's epoch always follows ``trainer.progress``. The default moves forward with
        :meth:`_increment_epoch`, so subclasses need not override it; one that can also move
        back (as :class:`InMemoryRunHistory` does) may.

        Raises:
            ValueError: if ``epoch`` is before :attr:`current_epoch` and this history cannot
                move back.
        """
        while self.current_epoch < epoch:
            self._increment_epoch()
        if self.current_epoch != epoch:
            raise ValueError(
                f"{type(self).__name__} is at epoch {self.current_epoch} and cannot move back to "
                f"epoch {epoch}; override set_current_epoch to allow it."
            )

    # ------------------------------------------------------------------ step-indexed series

    def metric_counts(self) -> dict[str, int]:
        """How many values each metric has so far, by name."""
        return {name: len(self.get_metric_values(name)) for name in self.get_metric_names()}

    def update_step_metric(self, metric_name: str, step: int, metric_value: Any) -> None:
        """Record ``metric_value`` of the step-indexed series ``metric_name`` (with the current
        prefix) at optimizer update ``step`` (the number of completed updates).

        The Trainer records the step metrics (:mod:`pytorch_accelerated.step_metrics`) here when
        a callback asks for them; the per-epoch metrics stay in :meth:`update_metric`. This and
        the other ``*step_metric*`` methods work for every subclass, with nothing to override.
        """
        self._step_series().setdefault(f"{self.metric_name_prefix}{metric_name}", []).append(
            (int(step), metric_value)
        )

    def get_step_metric_names(self) -> set[str]:
        """Return the names of every step-indexed series recorded so far."""
        return set(self._step_series())

    def get_step_metric_values(self, metric_name: str) -> list[tuple[int, Any]]:
        """Return the ``(step, value)`` points of ``metric_name``, oldest first (empty if none)."""
        return list(self._step_series().get(metric_name, []))

    def reset_step_metrics(self) -> None:
        """Forget every step-indexed series."""
        self._step_series().clear()

    def _step_series(self) -> dict[str, list[tuple[int, Any]]]:
        # Created on first use, so that subclasses need not call an __init__ of this class.
        series: dict[str, list[tuple[int, Any]]] = self.__dict__.setdefault("_step_metrics", {})
        return series

    # ------------------------------------------------------------------ saving

    def state_dict(self) -> dict[str, Any]:
        """Return the history as plain Python values, for saving training state."""
        return {
            "metrics": {name: list(self.get_metric_values(name)) for name in self.get_metric_names()},
            "current_epoch": self.current_epoch,
            "step_metrics": {
                name: [list(point) for point in points] for name, points in self._step_series().items()
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a history saved by :meth:`state_dict`."""
        self.reset()
        self.reset_step_metrics()
        prefix = self.metric_name_prefix
        self.set_metric_name_prefix("")
        for name, values in state["metrics"].items():
            for value in values:
                self.update_metric(name, value)
        for name, points in state.get("step_metrics", {}).items():
            for step, value in points:
                self.update_step_metric(name, step, value)
        self.set_metric_name_prefix(prefix)
        self.set_current_epoch(int(state["current_epoch"]))


class InMemoryRunHistory(RunHistory):
    """A :class:`RunHistory` that keeps every value in memory."""

    def __init__(self) -> None:
        self._metrics: defaultdict[str, list[Any]] = defaultdict(list)
        self._current_epoch = 1
        self._prefix = ""

    def get_metric_names(self) -> set[str]:
        return set(self._metrics)

    def get_metric_values(self, metric_name: str) -> list[Any]:
        return self._metrics.get(metric_name, [])

    def get_latest_metric(self, metric_name: str) -> Any:
        values = self._metrics.get(metric_name)
        if not values:
            known = ", ".join(sorted(self._metrics)) or "none yet"
            raise MetricNotFoundError(
                f"No values recorded for metric {metric_name!r}. Recorded metrics: {known}."
            )
        return values[-1]

    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        self._metrics[f"{self._prefix}{metric_name}"].append(metric_value)

    def delete_metric(self, metric_name: str) -> None:
        self._metrics.pop(metric_name, None)

    def set_metric_name_prefix(self, prefix: str = "") -> None:
        self._prefix = prefix

    @property
    def metric_name_prefix(self) -> str:
        return self._prefix

    @property
    def current_epoch(self) -> int:
        return self._current_epoch

    def _increment_epoch(self) -> None:
        self._current_epoch += 1

    def set_current_epoch(self, epoch: int) -> None:
        self._current_epoch = int(epoch)

    def reset(self) -> None:
        self._metrics = defaultdict(list)
        self._current_epoch = 1
        self._prefix = ""
        self.reset_step_metrics()


class LossTracker:
    """A weighted running average of batch losses.

    Values may be tensors on any device: they are summed on that device, so that nothing is
    copied to the host until :attr:`average` is read (a device-to-host copy is a sync point,
    which would stall the GPU on every step).

    ``total_loss`` and ``running_count`` (pytorch-accelerated 0.1.61's names) are read/write
    aliases of ``running_total`` and ``count``.

    >>> tracker = LossTracker()
    >>> tracker.update(2.0, 4)
    >>> tracker.update(1.0, 1)
    >>> tracker.total_loss, tracker.running_count, tracker.average
    (9.0, 5, 1.8)
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new average."""
        self.loss_value: Any = 0.0
        self.running_total: Any = 0.0
        self.count: Any = 0

    def update(self, loss_batch_value: Any, batch_size: Any = 1) -> None:
        """Add a batch whose mean loss is ``loss_batch_value`` over ``batch_size`` items."""
        # (A loss computed under no_grad, as in evaluation, has no graph: no detached copy needed.)
        if isinstance(loss_batch_value, torch.Tensor) and loss_batch_value.requires_grad:
            loss_batch_value = loss_batch_value.detach()
        self.loss_value = loss_batch_value
        if isinstance(self.running_total, torch.Tensor) and isinstance(batch_size, (int, float)):
            # One device op per step instead of two (a multiply, then an add).
            self.running_total = self.running_total.add(loss_batch_value, alpha=batch_size)
        else:
            self.running_total = self.running_total + loss_batch_value * batch_size
        self.count = self.count + batch_size

    @property
    def total(self) -> float:
        """The weighted sum of every loss added (a host float)."""
        return float(self.running_total)

    @property
    def average(self) -> float:
        """The weighted mean of every loss added, or ``nan`` before the first update."""
        count = float(self.count)
        return float(self.running_total) / count if count else float("nan")

    @property
    def total_loss(self) -> Any:
        """The weighted sum of every loss added, as stored (0.1.61's name for ``running_total``)."""
        return self.running_total

    @total_loss.setter
    def total_loss(self, value: Any) -> None:
        self.running_total = value

    @property
    def running_count(self) -> Any:
        """The number of items added (0.1.61's name for ``count``)."""
        return self.count

    @running_count.setter
    def running_count(self, value: Any) -> None:
        self.count = value
