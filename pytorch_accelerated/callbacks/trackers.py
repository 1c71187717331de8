"""Experiment trackers: :class:`TrackingCallback` on accelerate's tracker classes, and
:class:`CSVTracker`, a dependency-free tracker of our own.

Trackers are created, written and finished on the main process only. Every tracker is
accelerate's own class (``accelerate.tracking``), so any tracker accelerate knows works here;
this module adds what a training library must do around them: choosing the step (the number of
completed optimizer updates), checking values, logging the run configuration as
hyperparameters, flushing before a training state is published, continuing the same series on
resume, and finishing on every exit path.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import numbers
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker, MLflowTracker, WandBTracker

from .._internal.validation import check_whole_number
from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["TrackingCallback", "CSVTracker", "tracker_names"]

#: The package each tracker needs (what ``pip install`` takes), by tracker name.
TRACKER_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "mlflow": ("mlflow", "mlflow-skinny"),
    "wandb": ("wandb", "wandb"),
    "comet_ml": ("comet_ml", "comet-ml"),
    "aim": ("aim", "aim"),
    "clearml": ("clearml", "clearml"),
    "dvclive": ("dvclive", "dvclive"),
    "swanlab": ("swanlab", "swanlab"),
    "trackio": ("trackio", "trackio"),
}

#: The trackers whose packages the ``trackers`` extra installs.
TRACKERS_EXTRA = ("tensorboard", "mlflow", "wandb")


class CSVTracker(GeneralTracker):
    """A tracker with no dependencies: one row ``step,name,value`` per logged value in
    ``<logging_dir>/<run_name>/metrics.csv``, hyperparameters in ``hparams.json`` next to it.

    ``resume_step``: continue a run resumed at that many updates; rows of that step and later
    ones (logged by the interrupted run) are removed first, and the resumed run logs them again.
    """

    name = "csv"
    requires_logging_directory = True
    main_process_only = True

    def __init__(
        self, run_name: str, logging_dir: str | os.PathLike = "runs", resume_step: int | None = None
    ) -> None:
        super().__init__()
        self.directory = Path(logging_dir) / run_name
        self.resume_step = resume_step
        self._file: Any = None
        self._writer: Any = None  # one csv.writer on the open file, kept for the run

    @property
    def path(self) -> Path:
        return self.directory / "metrics.csv"

    @property
    def tracker(self) -> Any:
        return self._file

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.resume_step is not None and self.path.exists():
            self._keep_rows_before(self.resume_step)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = open(self.path, "a", newline="")  # noqa: SIM115 (closed by finish)
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["step", "name", "value"])
            self._file.flush()

    def _keep_rows_before(self, step: int) -> None:
        with open(self.path, newline="") as file:
            rows = list(csv.reader(file))
        kept = rows[:1] + [row for row in rows[1:] if len(row) == 3 and int(row[0]) < step]
        partial = self.path.with_suffix(".csv.tmp")
        with open(partial, "w", newline="") as file:
            csv.writer(file).writerows(kept)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, self.path)

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        partial = self.directory / "hparams.json.tmp"
        partial.write_text(json.dumps(values, indent=2, sort_keys=True, default=str))
        os.replace(partial, self.directory / "hparams.json")

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Append one row per value, all in one write, then flush once: a reader of the file
        sees whole points (``flush()``, before a training state is published, also syncs)."""
        self._writer.writerows([(step, name, repr(float(value))) for name, value in values.items()])
        self._file.flush()

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def finish(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = self._writer = None


class LocalMLflowTracker(MLflowTracker):
    """accelerate's MLflow tracker, writing to a local store under ``logging_dir`` by default.

    The store is ``file:<logging_dir>/mlruns`` unless ``tracking_uri`` is given or
    ``MLFLOW_TRACKING_URI`` is set; MLflow's tracking URI (and ``MLFLOW_ALLOW_FILE_STORE``, which
    MLflow 3 needs for a file store) is set while the tracker runs and restored when it finishes.

    MLflow cannot delete points, so a resumed run (``run_id`` given) reads the steps the run already
    has, per metric, and does not log those steps again: exact resume recomputes the same values,
    so the series equals the uninterrupted run's.
    """

    def __init__(
        self,
        run_name: str,
        logging_dir: str | os.PathLike = "runs",
        tracking_uri: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(run_name, **kwargs)
        if tracking_uri is None and not os.environ.get("MLFLOW_TRACKING_URI"):
            tracking_uri = (Path(logging_dir).absolute() / "mlruns").as_uri()
        self.tracking_uri = tracking_uri
        self.written_steps: dict[str, int] | None = None  # known on resume: see TrackingCallback
        self._restore: dict[str, str | None] | None = None

    def start(self) -> None:
        import mlflow

        if self.tracking_uri is not None:
            self._restore = {"MLFLOW_ALLOW_FILE_STORE": os.environ.get("MLFLOW_ALLOW_FILE_STORE")}
            if self.tracking_uri.startswith("file:"):
                os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # MLflow 3 refuses file stores otherwise
            mlflow.set_tracking_uri(self.tracking_uri)
        try:
            super().start()
            if self.run_id is not None:
                self.written_steps = _mlflow_written_steps(self.active_run.info.run_id)
        except BaseException:
            self._restore_global_state()  # not started, so finish() will not be called
            raise

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        values = not_written_yet(values, step, self.written_steps)
        if values:
            super().log(values, step=step, **kwargs)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._restore_global_state()

    def _restore_global_state(self) -> None:
        import mlflow

        if self._restore is not None:
            mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None: back to unset (MLflow takes it)
            _restore_environment(self._restore)
            self._restore = None


def _mlflow_written_steps(run_id: str) -> dict[str, int]:
    """The largest step of each metric the MLflow run ``run_id`` holds."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    names = client.get_run(run_id).data.metrics
    return {name: max(metric.step for metric in client.get_metric_history(run_id, name)) for name in names}


def _restore_environment(values: Mapping[str, str | None]) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class ResumableWandBTracker(WandBTracker):
    """accelerate's Weights & Biases tracker (``wandb.init`` keyword arguments as ``kwargs``;
    ``dir`` is created first), continuing a run resumed with ``id`` and ``resume="allow"``.

    In offline mode a resumed run writes a new offline directory for the same run id; the steps
    the earlier directories of that id already hold (read with W&B's own reader, ``wandb leet
    inspect``) are not logged again, per metric, so that syncing every directory gives each
    point once. Online, W&B itself continues the run's step and ignores lower steps.
    """

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__(run_name, **kwargs)
        self.written_steps: dict[str, int] | None = None  # known on resume: see TrackingCallback

    def start(self) -> None:
        directory = self.init_kwargs.get("dir")
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        run_id = self.init_kwargs.get("id")
        if (
            run_id is not None
            and directory is not None
            and self.init_kwargs.get("mode", os.environ.get("WANDB_MODE")) == "offline"
        ):
            self.written_steps = wandb_written_steps(Path(directory), run_id)
        super().start()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        # accelerate 1.9-1.12 store it in offline mode by finishing the run and starting another
        # (a second run id, which breaks resuming); update the run in place, as later ones do.
        import wandb

        wandb.config.update(values, allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        values = not_written_yet(values, step, self.written_steps)
        if values:
            super().log(values, step=step, **kwargs)


def wandb_offline_records(run_file: Path) -> list[dict[str, Any]]:
    """The records of a W&B transaction log (``run-<id>.wandb``), read with W&B's own reader."""
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(
            f"Could not read the W&B offline log {run_file} with `wandb leet inspect` (exit code "
            f"{result.returncode}): {result.stderr.strip()[-2000:]}. A resumed W&B run reads it to "
            f"know which steps the interrupted run wrote; move a damaged directory aside to skip it."
        )
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def wandb_written_steps(directory: Path, run_id: str) -> dict[str, int]:
    """The largest step of each metric in the offline directories of W&B run ``run_id``."""
    written: dict[str, int] = {}
    for run_file in sorted(directory.glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb")):
        for record in wandb_offline_records(run_file):
            history = record.get("history")
            if record.get("type") != "history" or not history:
                continue
            step = int(history.get("step", {}).get("num", 0))
            for name in history.get("item", {}):
                if not name.startswith("_"):
                    written[name] = max(written.get(name, -1), step)
    return written


def not_written_yet(
    values: dict[str, Any], step: int | None, written_steps: Mapping[str, int] | None
) -> dict[str, Any]:
    """``values`` without those a resumed tracker's run already holds at ``step`` (or later):
    MLflow and W&B cannot delete points, so a resumed run does not log them twice."""
    if step is None or not written_steps:
        return values
    return {name: value for name, value in values.items() if step > written_steps.get(name, -1)}


def tracker_names() -> list[str]:
    """Every tracker name :class:`TrackingCallback` accepts."""
    return sorted({"csv", *LOGGER_TYPE_TO_CLASS})


def check_tracker(tracker: Any) -> None:
    """Raise a clear error for an unknown tracker name or one whose package is missing."""
    if isinstance(tracker, GeneralTracker):
        return
    if not isinstance(tracker, str):
        raise TypeError(
            f"TrackingCallback(trackers=...) takes tracker names or accelerate tracker objects "
            f"(accelerate.tracking.GeneralTracker), not {type(tracker).__name__}."
        )
    if tracker not in tracker_names():
        raise ValueError(f"Unknown tracker {tracker!r}. Valid tracker names: {', '.join(tracker_names())}.")
    module, package = TRACKER_PACKAGES.get(tracker, (None, None))
    if module is not None and importlib.util.find_spec(module) is None:
        extra = " (or pip install 'pytorch-accelerated[trackers]')" if tracker in TRACKERS_EXTRA else ""
        raise ImportError(
            f"The {tracker!r} tracker needs the {package!r} package, which is not installed: "
            f"pip install {package}{extra}."
        )


def create_tracker(
    name: str, run_name: str, logging_dir: str, init_kwargs: dict[str, Any], resume: dict[str, Any] | None
) -> GeneralTracker:
    """Create (not start) the tracker ``name``; ``resume`` holds the step resumed at and the
    tracker's saved state (e.g. its run id) when continuing a run."""
    kwargs = dict(init_kwargs)
    step = resume["step"] if resume is not None else None
    saved = resume["state"] if resume is not None else {}
    if name == "csv":
        return CSVTracker(run_name, logging_dir, resume_step=step)
    if name == "tensorboard":
        if step is not None:
            kwargs.setdefault("purge_step", step)  # drop what the interrupted run logged from there on
        return LOGGER_TYPE_TO_CLASS[name](run_name, logging_dir, **kwargs)
    if name == "mlflow":
        if saved.get("run_id"):
            kwargs["run_id"] = saved["run_id"]
        return LocalMLflowTracker(run_name, logging_dir, **kwargs)
    if name == "wandb":
        kwargs.setdefault("dir", logging_dir)
        if saved.get("id"):
            kwargs.update(id=saved["id"], resume="allow")
        return ResumableWandBTracker(run_name, **kwargs)
    tracker_class = LOGGER_TYPE_TO_CLASS[name]
    if getattr(tracker_class, "requires_logging_directory", False):
        return tracker_class(run_name, logging_dir, **kwargs)
    return tracker_class(run_name, **kwargs)


def tracker_state(tracker: GeneralTracker) -> dict[str, Any]:
    """What a resumed run needs to continue ``tracker``'s run (its run id), as plain values."""
    if tracker.name == "mlflow":
        active = getattr(tracker, "active_run", None)
        return {"run_id": active.info.run_id} if active is not None else {}
    if tracker.name == "wandb":
        run = getattr(tracker, "run", None)
        return {"id": run.id} if run is not None else {}
    return {}


def flush_tracker(tracker: GeneralTracker) -> None:
    """Make what ``tracker`` was given durable (before a training state is published)."""
    own_flush = getattr(tracker, "flush", None)
    if callable(own_flush):
        own_flush()
        return
    inner = getattr(tracker, "tracker", None)
    if inner is not None and callable(getattr(inner, "flush", None)):
        inner.flush()  # e.g. TensorBoard's SummaryWriter


def number(name: str, value: Any) -> float:
    """``value`` as a float; a value that is not a number is an error naming the metric."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().reshape(()))  # a device read: only at logging points
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    raise TypeError(
        f"TrackingCallback cannot log metric {name!r}: its value {value!r} ({type(value).__name__}) "
        f"is not a number. Trackers take numbers (a float, an int or a one-element tensor); record "
        f"other values elsewhere, or log them with the tracker's own API."
    )


def flat_hyperparameters(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``values`` flattened to ``{"a.b": v}`` with every value a bool, int, float or str."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hyperparameters(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value) if value is not None else "None"
    return flat


class TrackingCallback(TrainerCallback):
    """Log the run to experiment trackers: step metrics every ``log_every_n_steps`` optimizer
    updates, every epoch-level metric at the end of each epoch, and the run configuration as
    hyperparameters, all at the step of the number of completed updates.

    Args:
        trackers: tracker names (``"csv"``, ``"tensorboard"``, ``"mlflow"``, ``"wandb"`` or any
            name accelerate knows, see :func:`tracker_names`) or accelerate tracker objects
            (``accelerate.tracking.GeneralTracker``, e.g. your own subclass), started here.
        log_every_n_steps: updates between two points of the step metrics (see
            :mod:`pytorch_accelerated.step_metrics`); they are also recorded in the run history.
        run_name: the run's name (TensorBoard sub-directory, MLflow experiment, W&B run name,
            CSV sub-directory).
        logging_dir: where file-based trackers write (``"runs"`` by default).
        init_kwargs: per tracker name, keyword arguments for its accelerate class, e.g.
            ``{"wandb": {"mode": "offline"}}``; ``{"mlflow": {"tracking_uri": ...}}`` replaces
            the default local store ``file:<logging_dir>/mlruns`` (see :class:`LocalMLflowTracker`).
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
        trainer.run_state.step_metrics.request(self.log_every_n_steps, grad_norm=self.log_grad_norm)
        self._trainer = trainer
        self._logged_counts = _metric_counts(trainer)  # a kept history's earlier epochs are not logged
        self._last_points = {"step": None, "values": {}}
        self._epoch_points = []
        self._started = False
        if trainer.run_state.pending_resume is None:  # a resumed run starts them in load_state_dict
            self._start_trackers(trainer, resume=None)
            self._log_hyperparameters(trainer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        trainer = self._trainer
        if trainer is None:
            return
        step = trainer.progress.global_step
        self._logged_counts = dict(state.get("logged_counts", {}))
        self._epoch_points = [
            (point_step, dict(values)) for point_step, values in state.get("epoch_points", [])
        ]
        saved_trackers = state.get("trackers", [])
        self._start_trackers(trainer, resume={"step": step, "states": saved_trackers})
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
        points: dict[int, dict[str, Any]] = {}
        history = trainer.run_history
        for name in history.get_step_metric_names():
            for point_step, value in history.get_step_metric_values(name):
                if point_step <= step and point_step % self.log_every_n_steps == 0:
                    points.setdefault(point_step, {})[name] = value
        for point_step, values in self._epoch_points:
            if point_step <= step:
                points.setdefault(point_step, {}).update(values)
        for point_step in sorted(points):  # in step order: W&B takes steps that only grow
            values = {name: number(name, value) for name, value in points[point_step].items()}
            for tracker in missing:
                tracker.log(values, step=point_step)

    def _start_trackers(self, trainer: Trainer, resume: dict[str, Any] | None) -> None:
        self.trackers, self._started = [], True
        if not trainer.is_world_process_zero:
            return
        for index, spec in enumerate(self.tracker_specs):
            if isinstance(spec, GeneralTracker):
                tracker = spec
            else:
                saved = (
                    resume["states"][index] if resume is not None and index < len(resume["states"]) else {}
                )
                tracker_resume = {"step": resume["step"], "state": saved} if resume is not None else None
                tracker = create_tracker(
                    spec, self.run_name, self.logging_dir, self.init_kwargs.get(spec, {}), tracker_resume
                )
            tracker.start()
            self.trackers.append(tracker)

    def _log_hyperparameters(self, trainer: Trainer) -> None:
        config = trainer.run_config.to_dict() if trainer.run_config is not None else {}
        values = flat_hyperparameters({**config, **self.hyperparameters})
        for tracker in self.trackers:
            tracker.store_init_configuration(values)

    # ------------------------------------------------------------------ logging

    def on_step_metrics(
        self, trainer: Trainer, step: int = 0, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        if metrics and step % self.log_every_n_steps == 0:
            self._log(metrics, step)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._log_epoch_metrics(trainer)

    def _log_epoch_metrics(self, trainer: Trainer) -> None:
        history = trainer.run_history
        counts = _metric_counts(trainer)
        new = {
            name: history.get_latest_metric(name)
            for name, count in counts.items()
            if count > self._logged_counts.get(name, 0)
        }
        self._logged_counts = counts
        if new:
            self._log(new, trainer.progress.global_step)
            self._epoch_points.append(
                (trainer.progress.global_step, {name: number(name, value) for name, value in new.items()})
            )

    def _start_if_state_had_none(self) -> None:
        """Start the trackers of a run resumed from a state saved without this callback (no
        ``load_state_dict`` call): as a resume at the current step, with no saved run ids."""
        trainer = self._trainer
        if trainer is not None and not self._started:
            self._start_trackers(trainer, resume={"step": trainer.progress.global_step, "states": []})

    def _log(self, metrics: Mapping[str, Any], step: int, removed_only: bool = False) -> None:
        self._start_if_state_had_none()
        values = {name: number(name, value) for name, value in metrics.items()}
        if not removed_only:
            same_step = self._last_points.get("step") == step
            self._last_points = {
                "step": step,
                "values": {**(self._last_points["values"] if same_step else {}), **values},
            }
        for tracker in self.trackers:
            if removed_only and tracker.name not in ("csv", "tensorboard"):
                continue  # MLflow and W&B keep what the interrupted run logged at this step
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


def _metric_counts(trainer: Trainer) -> dict[str, int]:
    history = trainer.run_history
    return {name: len(history.get_metric_values(name)) for name in history.get_metric_names()}
