"""TrackingCallback over 2 real processes: only the main process writes (one set of logs for every
tracker), and what it writes equals a 1-process run on the same global batch."""

from __future__ import annotations

import csv
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytorch_accelerated.callbacks.tracker_adapters import wandb_offline_records
from tests.launch import launch_workers, load_worker_module


@pytest.fixture(scope="module")
def worker() -> ModuleType:
    return load_worker_module("trackers_worker")


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], Path]:
    out = tmp_path_factory.mktemp("trackers")
    return launch_workers("trackers_worker.py", out, nproc=2).results, out / "logs"


def read_csv(path: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    with open(path, newline="") as file:
        for step, name, value in list(csv.reader(file))[1:]:
            series.setdefault(name, []).append((int(step), float(value)))
    return series


def test_only_the_main_process_starts_trackers(
    two: tuple[list[dict[str, Any]], Path], worker: ModuleType
) -> None:
    ranks, _ = two
    assert [rank["trackers_started"] for rank in ranks] == [len(worker.TRACKERS), 0]


def test_exactly_one_set_of_logs(
    two: tuple[list[dict[str, Any]], Path], worker: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, logs = two
    run_dir = logs / worker.RUN_NAME
    assert len(list(run_dir.glob("metrics.csv*"))) == 1
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1, "one TensorBoard event file"
    assert len(list(run_dir.glob("*/events.out.tfevents.*"))) == 1, "one hyperparameter event file"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
    from mlflow.tracking import MlflowClient

    client = MlflowClient((logs / "mlruns").absolute().as_uri())
    experiment = client.get_experiment_by_name(worker.RUN_NAME)
    assert len(client.search_runs([experiment.experiment_id])) == 1, "one MLflow run"
    run_files = list((logs / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, "one W&B offline run"
    steps = [
        r["history"]["step"]["num"] for r in wandb_offline_records(run_files[0]) if r.get("type") == "history"
    ]
    assert steps == sorted(set(steps)) and steps[-1] == 12


def test_values_equal_a_one_process_run(
    two: tuple[list[dict[str, Any]], Path],
    worker: ModuleType,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks, logs = two
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    trainer, _ = worker.run(tmp_path, num_processes=1)
    import wandb

    wandb.teardown()  # stop this process's W&B service
    one = worker.series(trainer)
    written = read_csv(logs / worker.RUN_NAME / "metrics.csv")
    assert written["lr"] == [tuple(point) for point in one["lr"]], "the same steps and learning rates"
    for name in ("train_loss", "samples_per_second", "step_time_seconds"):
        assert [step for step, _ in written[name]] == [step for step, _ in one[name]], name
    assert [value for _, value in written["train_loss"]] == pytest.approx(
        [v for _, v in one["train_loss"]], rel=1e-5
    )
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        assert [step for step, _ in written[name]] == [6, 12]
        assert [value for _, value in written[name]] == pytest.approx(one[name], rel=1e-5)
    assert ranks[0]["series"]["train_loss"] == ranks[1]["series"]["train_loss"], (
        "every process holds the same history"
    )
