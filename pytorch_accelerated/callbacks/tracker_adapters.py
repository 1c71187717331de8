"""accelerate's MLflow and Weights & Biases trackers, adapted to a training library: MLflow
writes to a local store by default, and a resumed run does not log twice the points that the
interrupted run's MLflow run or W&B offline directories already hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from accelerate.tracking import MLflowTracker, WandBTracker


class _ResumedLog:
    """``log`` leaves out the points a resumed run's tracker already holds (``written_steps``,
    known on resume: see TrackingCallback)."""

    written_steps: dict[str, int] | None = None

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if step is not None and self.written_steps:  # MLflow and W&B cannot delete points
            values = {
                name: value for name, value in values.items() if step > self.written_steps.get(name, -1)
            }
        if values:
            super().log(values, step=step, **kwargs)  # type: ignore[misc]


class LocalMLflowTracker(_ResumedLog, MLflowTracker):
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

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._restore_global_state()

    def _restore_global_state(self) -> None:
        import mlflow

        if self._restore is not None:
            mlflow.set_tracking_uri(None)  # type: ignore[arg-type]  # None: back to unset (MLflow takes it)
            for name, value in self._restore.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            self._restore = None


def _mlflow_written_steps(run_id: str) -> dict[str, int]:
    """The largest step of each metric the MLflow run ``run_id`` holds."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    return {
        name: max(metric.step for metric in client.get_metric_history(run_id, name))
        for name in client.get_run(run_id).data.metrics
    }


class ResumableWandBTracker(_ResumedLog, WandBTracker):
    """accelerate's Weights & Biases tracker (``wandb.init`` keyword arguments as ``kwargs``;
    ``dir`` is created first), continuing a run resumed with ``id`` and ``resume="allow"``.

    In offline mode a resumed run writes a new offline directory for the same run id; the steps
    the earlier directories of that id already hold (read with W&B's own reader, ``wandb leet
    inspect``) are not logged again, per metric, so that syncing every directory gives each
    point once. Online, W&B itself continues the run's step and ignores lower steps.
    """

    def start(self) -> None:
        directory = self.init_kwargs.get("dir")
        if directory is not None:
            Path(directory).mkdir(parents=True, exist_ok=True)
        if (
            (run_id := self.init_kwargs.get("id")) is not None
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
