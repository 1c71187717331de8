"""Experiment trackers: :class:`TrackingCallback`, which logs a run to accelerate's tracker
classes and to :class:`~.csv_tracker.CSVTracker`, a dependency-free tracker of our own.

Trackers are created, written and finished on the main process only. Every tracker is
accelerate's own class (``accelerate.tracking``), so any tracker accelerate knows works here;
the callback adds what a training library must do around them: choosing the step (the number
of completed optimizer updates), checking values, logging the run configuration as
hyperparameters, flushing before a training state is published, continuing the same series on
resume, and finishing on every exit path. The trackers it knows by name are in
:mod:`.tracker_registry`; the MLflow and W&B adapters in :mod:`.tracker_adapters`.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from accelerate.tracking import GeneralTracker

from .._internal.argument_checks import check_whole_number
from .._internal.intervals import every
from .events import TrainerCallback
from .tracker_registry import check_tracker, create_tracker, flush_tracker, tracker_state

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["TrackingCallback"]


def as_float(value: Any) -> float | None:
    """``value`` as a float, or None when it is not one number."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().reshape(()))  # a device read: only at logging points
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else None


def number(name: str, value: Any) -> float:
    """``value`` as a float; a value that is not a number is an error naming the metric."""
    if (result := as_float(value)) is None:
        raise TypeError(
            f"TrackingCallback cannot log metric {name!r}: its value {value!r} ({type(value).__name__}) "
            f"is not a number. Trackers take numbers (a float, an int or a one-element tensor); record "
            f"other values elsewhere, or log them with the tracker's own API."
        )
    return result


def flat_hyperparameters(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` flattened to ``{"a.b": v}`` with every value a bool, int, float or str: a
    ``torch.Generator`` as its ``initial_seed()``, an object whose text is the default
    ``<... object at 0x...>`` as its class name (what every tracker logs: one path)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hyperparameters(value, f"{name}."))
        elif isinstance(value, torch.Generator):
            flat[name] = value.initial_seed()
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            text = str(value)
            flat[name] = type(value).__qualname__ if " object at 0x" in text else text
    return flat


class TrackingCallback(TrainerCallback):
    """Log the run to experiment trackers: step metrics every ``log_every_n_steps`` optimizer
    updates, every epoch-level metric at the end of each epoch, and the run configuration as
    hyperparameters, all at the step of the number of completed updates.

    Args:
        trackers: tracker names (``"csv"``, ``"tensorboard"``, ``"mlflow"``, ``"wandb"`` or any
            name accelerate knows, see :func:`~.tracker_registry.tracker_names`) or accelerate tracker objects
            (``accelerate.tracking.GeneralTracker``, e.g. your own subclass), started here.
        log_every_n_steps: updates between two points of the step metrics (see
            :mod:`pytorch_accelerated.step_metrics`); they are also recorded in the run history.
        run_name: the run's name (TensorBoard sub-directory, MLflow experiment, W&B run name,
            CSV sub-directory).
        logging_dir: where file-based trackers write (``"runs"`` by default).
        init_kwargs: per tracker name, keyword arguments for its accelerate class, e.g.
            ``{"wandb": {"mode": "offline"}}``; ``{"mlflow": {"tracking_uri": ...}}`` replaces
            the default local store ``file:<logging_dir>/mlruns`` (see :class:`~.tracker_adapters.LocalMLflowTracker`).
        hyperparameters: extra values logged with the run configuration.
        log_grad_norm: log the total gradient norm also when not clipping by norm (it is
            computed on the logged updates only).

    Only the main process creates and writes trackers; the others take part in measuring (one
    collective per point) and write nothing. Trackers are finished when the run ends, is
    stopped, or fails. Resuming with ``train(resume_from=...)`` continues the same series: the
    points logged after the saved state by the interrupted run are removed (TensorBoard's
    ``purge_step``, the CSV file truncated) or not logged twice (MLflow, W&B offline: the steps
    the run already holds are read back and skipped), the points of the saved state's own step
    are logged again where they were removed, and points the tracker lost (W&B's service buffers
    what it writes, so a killed process loses its last points) are logged again from the run
    history. See docs/recipes/tracking.md.
    """

    def __init__(
        self,
        trackers: Iterable[str | GeneralTracker] = ("csv",),
        log_every_n_steps: int = 50,
        *,
        run_name: str = "pytorch-accelerated",
        logging_dir: str | os.PathLike = "runs",
        init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        hyperparameters: Mapping[str, Any] | None = None,
        log_grad_norm: bool = False,
    ) -> None:
        self.tracker_specs = [trackers] if isinstance(trackers, (str, GeneralTracker)) else list(trackers)
        for tracker in self.tracker_specs:
            check_tracker(tracker)
        self.log_every_n_steps = check_whole_number(
            log_every_n_steps, "log_every_n_steps", owner="TrackingCallback"
        )
        self.run_name, self.logging_dir = run_name, str(logging_dir)
        self.init_kwargs = {name: dict(kwargs) for name, kwargs in (init_kwargs or {}).items()}
        self.hyperparameters = dict(hyperparameters or {})
        self.log_grad_norm = log_grad_norm
        self.trackers: list[GeneralTracker] = []
        self._trainer: Trainer | None = None
        self._logged_counts: dict[str, int] = {}
        self._last_points: dict[str, Any] = {"step": None, "values": {}}
        self._epoch_points: list[tuple[int, dict[str, float]]] = []  # (step, values) of each epoch's metrics
        self._started = False

    # ------------------------------------------------------------------ run start and resume

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.loop_state.step_metrics.request(self.log_every_n_steps, grad_norm=self.log_grad_norm)
        self._trainer = trainer
        self._logged_counts = (
            trainer.run_history.metric_counts()
        )  # a kept history's earlier epochs are not logged
        self._last_points = {"step": None, "values": {}}
        self._epoch_points = []
        self._started = False
        if trainer.resumed_from is None:  # a resumed run starts them in load_state_dict
            self._start_trackers(trainer)
            config = trainer.run_config.to_dict() if trainer.run_config is not None else {}
            values = flat_hyperparameters({**config, **self.hyperparameters})
            for tracker in self.trackers:
                tracker.store_init_configuration(values)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        step = trainer.progress.global_step
        self._logged_counts = dict(state.get("logged_counts", {}))
        self._epoch_points = [
            (point_step, dict(values)) for point_step, values in state.get("epoch_points", [])
        ]
        self._start_trackers(trainer, step, state.get("trackers", []))
        last = state.get("last_points", {"step": None, "values": {}})
        if last.get("step") == step and last.get("values"):
            self._log(last["values"], step, removed_only=True)  # the saved step's own points
        self._last_points = last
        self._log_missing_points(trainer, step)

    def _log_missing_points(self, trainer: Trainer, step: int) -> None:
        """Give trackers that keep what the interrupted run wrote (MLflow, W&B offline) the
        points up to ``step`` that they do not hold: e.g. those W&B's service had not written
        yet when the process was killed. Their ``log`` skips the steps they already have."""
        missing = [
            tracker for tracker in self.trackers if getattr(tracker, "written_steps", None) is not None
        ]
        if not missing:
            return
        history = trainer.run_history
        step_points = [
            (point_step, {name: value})
            for name in history.get_step_metric_names()
            for point_step, value in history.get_step_metric_values(name)
            if every(self.log_every_n_steps, point_step)
        ]
        points: dict[int, dict[str, Any]] = {}
        for point_step, values in [*step_points, *self._epoch_points]:
            if point_step <= step:
                points.setdefault(point_step, {}).update(values)
        for point_step in sorted(points):  # in step order: W&B takes steps that only grow
            values = {name: number(name, value) for name, value in points[point_step].items()}
            for tracker in missing:
                tracker.log(values, step=point_step)

    def _start_trackers(
        self, trainer: Trainer, resume_step: int | None = None, states: list[dict[str, Any]] | None = None
    ) -> None:
        """Create and start the trackers; on resume, at ``resume_step`` with their saved ``states``."""
        self.trackers, self._started = [], True
        if not trainer.is_world_process_zero:
            return
        for index, spec in enumerate(self.tracker_specs):
            tracker = (
                spec
                if isinstance(spec, GeneralTracker)
                else create_tracker(
                    spec,
                    self.run_name,
                    self.logging_dir,
                    self.init_kwargs.get(spec, {}),
                    resume_step,
                    states[index] if states is not None and index < len(states) else None,
                )
            )
            tracker.start()
            self.trackers.append(tracker)

    # ------------------------------------------------------------------ logging

    def on_step_metrics(
        self, trainer: Trainer, step: int = 0, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if metrics and every(self.log_every_n_steps, step):
            self._log(metrics, step)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._log_epoch_metrics(trainer)

    def _log_epoch_metrics(self, trainer: Trainer) -> None:
        """Log the epoch-level metrics recorded since the last call (not through the event, which a
        subclass may override: a state save calls this too)."""
        counts = trainer.run_history.metric_counts()
        new = {
            name: trainer.run_history.get_latest_metric(name)
            for name, count in counts.items()
            if count > self._logged_counts.get(name, 0)
        }
        self._logged_counts = counts
        if new:
            self._log(new, trainer.progress.global_step)
            self._epoch_points.append(
                (trainer.progress.global_step, {name: number(name, value) for name, value in new.items()})
            )

    def _log(self, metrics: Mapping[str, Any], step: int, removed_only: bool = False) -> None:
        if self._trainer is not None and not self._started:
            # A run resumed from a state saved without this callback (no ``load_state_dict``
            # call): start the trackers as a resume at the current step, with no saved run ids.
            self._start_trackers(self._trainer, self._trainer.progress.global_step)
        values = {name: number(name, value) for name, value in metrics.items()}
        if not removed_only:
            earlier = self._last_points["values"] if self._last_points.get("step") == step else {}
            self._last_points = {"step": step, "values": {**earlier, **values}}
        # MLflow and W&B keep what the interrupted run logged at the step of removed_only points.
        for tracker in self.trackers:
            if not removed_only or tracker.name in ("csv", "tensorboard"):
                tracker.log(values, step=step)

    def state_dict(self) -> dict[str, Any]:
        """Called on the main process while a training state is written: log what is pending
        and flush every tracker first, so the state is published after its points."""
        if self._trainer is not None:
            self._log_epoch_metrics(self._trainer)
        for tracker in self.trackers:
            flush_tracker(tracker)
        return {
            "trackers": [tracker_state(tracker) for tracker in self.trackers],
            "logged_counts": dict(self._logged_counts),
            "epoch_points": [[point_step, dict(values)] for point_step, values in self._epoch_points],
            "last_points": {"step": self._last_points["step"], "values": dict(self._last_points["values"])},
        }

    # ------------------------------------------------------------------ every way a run ends

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._finish()

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._finish()

    def _finish(self) -> None:
        """Finish every tracker, even when one of them fails (the first error is raised after)."""
        trackers, self.trackers = self.trackers, []
        errors = []
        for tracker in trackers:
            try:
                tracker.finish()
            except Exception as error:  # noqa: BLE001 (the others must still be finished)
                errors.append(error)
        if errors:
            raise errors[0]
