"""The trackers :class:`~.trackers.TrackingCallback` knows by name: which names exist and the
package each needs, creating one (continuing its run on resume), the state that lets a resumed
run continue it, and making what it was given durable."""

from __future__ import annotations

import importlib.util
from typing import Any

from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

from .csv_tracker import CSVTracker
from .tracker_adapters import LocalMLflowTracker, ResumableWandBTracker

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
    name: str,
    run_name: str,
    logging_dir: str,
    init_kwargs: dict[str, Any],
    step: int | None = None,
    saved: dict[str, Any] | None = None,
) -> GeneralTracker:
    """Create (not start) the tracker ``name``; when continuing a run, ``step`` is the step
    resumed at and ``saved`` the tracker's saved state (e.g. its run id)."""
    kwargs, saved = dict(init_kwargs), saved or {}
    if name == "csv":
        return CSVTracker(run_name, logging_dir, resume_step=step)
    if name == "tensorboard" and step is not None:
        kwargs.setdefault("purge_step", step)  # drop what the interrupted run logged from there on
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
    if tracker.name == "mlflow" and (active := getattr(tracker, "active_run", None)) is not None:
        return {"run_id": active.info.run_id}
    if tracker.name == "wandb" and (run := getattr(tracker, "run", None)) is not None:
        return {"id": run.id}
    return {}


def flush_tracker(tracker: GeneralTracker) -> None:
    """Make what ``tracker`` was given durable (before a training state is published)."""
    # Its own flush, else that of the object it wraps (e.g. TensorBoard's SummaryWriter).
    for target in (tracker, getattr(tracker, "tracker", None) or tracker):
        if callable(getattr(target, "flush", None)):
            target.flush()
            return
