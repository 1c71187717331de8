"""TrackingCallback with each tracker: what was written, read back with the tool's own reader
(the CSV file, TensorBoard's EventAccumulator, the MLflow client on the local store, W&B's
offline transaction log through ``wandb leet inspect``), equals the run history; a run killed
for real (SIGKILL) and resumed gives the same series; trackers are finished on every exit path;
bad input is refused with a clear message.

Run as a script, this module is the run that the resume tests start and kill::

    python tests/integration/test_trackers.py --out DIR [--save-every N] [--kill-at N] [--save-last]
        [--resume-from PATH]
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    SaveTrainingStateCallback,
    StopTrainingError,
    TrackingCallback,
    TrainerCallback,
)
from pytorch_accelerated.callbacks.tracker_adapters import wandb_offline_records
from pytorch_accelerated.schedulers import CosineLrScheduler
from tests import forked
from tests.helpers import make_regression_data, subprocess_env

ALL_TRACKERS = ("csv", "tensorboard", "mlflow", "wandb")
RUN_NAME = "tiny"
STEPS_PER_EPOCH = 6  # 24 samples in batches of 4
NUM_EPOCHS = 3
LOG_EVERY = 2
EXACT = ("train_loss", "lr", "train_loss_epoch", "eval_loss_epoch")
TIMING = ("samples_per_second", "step_time_seconds", "data_wait_fraction")
QUIET_WANDB = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_CONSOLE": "off",
}


# ---------------------------------------------------------------------------- the run


class KillAt(TrainerCallback):
    """SIGKILLs the process once ``global_step`` reaches ``step`` (listed last)."""

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def tracking_callback(out: Path, trackers: tuple[str, ...] = ALL_TRACKERS) -> TrackingCallback:
    return TrackingCallback(
        trackers,
        log_every_n_steps=LOG_EVERY,
        run_name=RUN_NAME,
        logging_dir=out / "logs",
        init_kwargs={"wandb": {"mode": "offline"}},
        hyperparameters={"model": "linear"},
    )


def run_training(out: Path, callbacks: list[TrainerCallback], resume_from: str | None = None) -> Trainer:
    """3 epochs of 6 updates of a linear model, evaluated every epoch, with a cosine schedule."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    trainer = Trainer(
        model, torch.nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks
    )
    trainer.train(
        make_regression_data(24, seed=1),
        eval_dataset=make_regression_data(8, seed=2),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=4,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, warmup_starting_lr=0.01
        ),
        resume_from=resume_from,
    )
    return trainer


def script_callbacks(args: argparse.Namespace) -> list[TrainerCallback]:
    save = SaveTrainingStateCallback(
        args.out / "states", save_every_n_epochs=1, save_every_n_steps=args.save_every, handle_signals=()
    )
    tracking = tracking_callback(args.out)
    ordered = [tracking, save] if args.save_last else [save, tracking]
    return [*ordered, KillAt(args.kill_at)]


# ---------------------------------------------------------------------------- readers


Series = dict[str, list[tuple[int, float]]]


def read_csv(logs: Path) -> Series:
    series: Series = {}
    with open(logs / RUN_NAME / "metrics.csv", newline="") as file:
        for row in list(csv.reader(file))[1:]:
            series.setdefault(row[1], []).append((int(row[0]), float(row[2])))
    return series


def read_tensorboard(logs: Path) -> Series:
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(logs / RUN_NAME), size_guidance={SCALARS: 0}).Reload()
    return {
        tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]
    }


def tensorboard_hyperparameters(logs: Path) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    (directory,) = {
        path.parent for path in (logs / RUN_NAME).glob("*/events.out.tfevents.*")
    }  # add_hparams' run
    accumulator = EventAccumulator(str(directory)).Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    info = metadata.parse_session_start_info_plugin_data(content)
    return {
        name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
        for name, value in info.hparams.items()
    }


def read_mlflow(logs: Path) -> tuple[Series, dict[str, str], list[str]]:
    """Every metric's (step, value) points, the params and the statuses of the runs."""
    from mlflow.tracking import MlflowClient

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 reads a file store only with it
        client = MlflowClient((logs / "mlruns").absolute().as_uri())
        experiment = client.get_experiment_by_name(RUN_NAME)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, "a resumed run continues the same MLflow run"
    run_id = runs[0].info.run_id
    series = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
        for name in runs[0].data.metrics
    }
    return series, runs[0].data.params, [run.info.status for run in runs]


def read_wandb(logs: Path) -> tuple[Series, dict[str, Any], list[str]]:
    """Every metric's points over the offline directories (in the order written), the config,
    and the run ids."""
    series: Series = {}
    config: dict[str, Any] = {}
    run_ids = []
    for run_file in sorted((logs / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_offline_records(run_file):
            if record.get("type") == "run":
                run_ids.append(record["run"]["run_id"])
                config.update(record["run"].get("config", {}).get("update", {}))
            elif record.get("type") == "config":
                config.update(record["config"].get("update", {}))
            elif record.get("type") == "history":
                step = int(record["history"].get("step", {}).get("num", 0))
                for name, value in record["history"]["item"].items():
                    if not name.startswith("_"):
                        series.setdefault(name, []).append((step, float(value)))
    return series, config, run_ids


def read_wandb_records(logs: Path) -> list[dict[str, Any]]:
    (run_file,) = (logs / "wandb").glob("offline-run-*/run-*.wandb")
    return wandb_offline_records(run_file)


def read_all(logs: Path, trackers: tuple[str, ...] = ALL_TRACKERS) -> dict[str, Series]:
    readers = {
        "csv": read_csv,
        "tensorboard": read_tensorboard,
        "mlflow": lambda path: read_mlflow(path)[0],
        "wandb": lambda path: read_wandb(path)[0],
    }
    return {name: readers[name](logs) for name in trackers}


def expected_series(trainer: Trainer) -> Series:
    """What the run history holds: step series, and epoch metrics at each epoch's last update."""
    history = trainer.run_history
    series = {name: list(history.get_step_metric_values(name)) for name in history.get_step_metric_names()}
    epoch_steps = [STEPS_PER_EPOCH * (epoch + 1) for epoch in range(NUM_EPOCHS)]
    for name in ("train_loss_epoch", "eval_loss_epoch"):
        series[name] = list(zip(epoch_steps, history.get_metric_values(name), strict=True))
    return series


def as_float32(series: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(step, float(torch.tensor(value, dtype=torch.float32))) for step, value in series]


@pytest.fixture
def quiet_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in QUIET_WANDB.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Trainer, Path]]:
    """An uninterrupted run with every tracker, in this process."""
    out = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in QUIET_WANDB.items():
            patch.setenv(name, value)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        trainer = run_training(out, [tracking_callback(out)])
        import wandb

        wandb.teardown()  # stops this process's W&B service (the scripts started later have their own)
    yield trainer, out / "logs"


# ---------------------------------------------------------------------------- what is written


@pytest.mark.parametrize("tracker", ALL_TRACKERS)
def test_series_read_back_equal_the_run_history(reference: tuple[Trainer, Path], tracker: str) -> None:
    trainer, logs = reference
    expected = expected_series(trainer)
    written = read_all(logs, (tracker,))[tracker]
    assert set(EXACT) <= set(written)
    for name in EXACT:
        want = as_float32(expected[name]) if tracker == "tensorboard" else expected[name]
        assert written[name] == want, name
    for name in TIMING:
        assert [step for step, _ in written[name]] == [step for step, _ in expected[name]], name
    assert [step for step, _ in written["train_loss"]] == list(
        range(LOG_EVERY, NUM_EPOCHS * STEPS_PER_EPOCH + 1, LOG_EVERY)
    )


def test_hyperparameters_read_back(reference: tuple[Trainer, Path]) -> None:
    trainer, logs = reference
    config = trainer.run_config.to_dict()
    with open(logs / RUN_NAME / "hparams.json") as file:
        assert json.load(file)["num_epochs"] == config["num_epochs"] == NUM_EPOCHS
    hparams = tensorboard_hyperparameters(logs)
    assert hparams["num_epochs"] == NUM_EPOCHS and hparams["model"] == "linear"
    _, params, statuses = read_mlflow(logs)
    assert params["num_epochs"] == str(NUM_EPOCHS) and params["model"] == "linear"
    assert statuses == ["FINISHED"]
    _, wandb_config, run_ids = read_wandb(logs)
    assert wandb_config["num_epochs"] == NUM_EPOCHS and wandb_config["model"] == "linear"
    assert len(run_ids) == 1


def test_mlflow_global_state_is_restored(reference: tuple[Trainer, Path]) -> None:
    import mlflow

    assert mlflow.active_run() is None
    assert "MLFLOW_TRACKING_URI" not in os.environ
    assert not mlflow.get_tracking_uri().startswith("file:"), (
        "the run's local store is not left as the default"
    )


# ---------------------------------------------------------------------------- resume after SIGKILL


def start_script(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**subprocess_env(out), **QUIET_WANDB}
    for name in ("MLFLOW_TRACKING_URI", "WANDB_SERVICE"):  # the script starts its own W&B service
        env.pop(name, None)
    return forked.run(__file__, ["--out", str(out), *args], cwd=out, env=env, timeout=300)


@pytest.mark.parametrize(
    ("save_every", "kill_at", "resume_from", "save_last"),
    [
        (3, 5, "step_3", False),  # saved at step 3 (no point there), the state saved before tracking's hooks
        (6, 8, "step_6", True),  # saved at a logging step that ends epoch 1, before its evaluation
        (6, 8, "epoch_1", False),  # saved at the end of epoch 1, after its evaluation
    ],
)
def test_killed_and_resumed_run_writes_the_uninterrupted_series(
    reference: tuple[Trainer, Path],
    tmp_path: Path,
    save_every: int,
    kill_at: int,
    resume_from: str,
    save_last: bool,
) -> None:
    order = ["--save-last"] if save_last else []
    killed = start_script(tmp_path, "--save-every", str(save_every), "--kill-at", str(kill_at), *order)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    state = tmp_path / "states" / resume_from
    resumed = start_script(tmp_path, "--save-every", str(save_every), "--resume-from", str(state), *order)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trainer, reference_logs = reference
    want, got = read_all(reference_logs), read_all(tmp_path / "logs")
    for tracker in ALL_TRACKERS:
        for name in EXACT:
            assert got[tracker][name] == want[tracker][name], (tracker, name)
        for name in TIMING:
            assert [s for s, _ in got[tracker][name]] == [s for s, _ in want[tracker][name]], (tracker, name)
    assert read_mlflow(tmp_path / "logs")[2] == ["FINISHED"]
    assert set(read_wandb(tmp_path / "logs")[2]) == {read_wandb(tmp_path / "logs")[2][0]}, "one W&B run id"


@pytest.mark.filterwarnings("ignore:The training state holds a state for the callback")
def test_resumed_from_a_state_saved_without_tracking_starts_the_trackers(tmp_path: Path) -> None:
    save = SaveTrainingStateCallback(tmp_path / "states", save_every_n_steps=3, handle_signals=())
    run_training(tmp_path, [save])
    tracking = TrackingCallback(
        ["csv"], log_every_n_steps=LOG_EVERY, run_name=RUN_NAME, logging_dir=tmp_path / "logs"
    )
    with pytest.warns(UserWarning, match="holds no state for the callback 'TrackingCallback'"):
        trainer = run_training(tmp_path, [tracking], resume_from=str(tmp_path / "states" / "step_3"))
    written = read_csv(tmp_path / "logs")
    assert written["train_loss"] == [
        p for p in trainer.run_history.get_step_metric_values("train_loss") if p[0] > 3
    ]
    assert [step for step, _ in written["eval_loss_epoch"]] == [6, 12, 18]


# ---------------------------------------------------------------------------- every exit path


class Spy(TrainerCallback):
    """Keeps the tracker objects of ``tracking`` once they are started; raises where asked."""

    def __init__(self, tracking: TrackingCallback, error: BaseException | None) -> None:
        self.tracking, self.error, self.trackers = tracking, error, []

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.trackers = list(self.tracking.trackers)
        if self.error is not None and trainer.progress.global_step == 3:
            raise self.error


@pytest.mark.parametrize("error", [None, StopTrainingError("enough"), RuntimeError("a callback failed")])
def test_trackers_finished_on_every_exit_path(
    tmp_path: Path, quiet_wandb: None, error: BaseException | None
) -> None:
    import mlflow
    import wandb

    tracking = tracking_callback(tmp_path)
    spy = Spy(tracking, error)
    try:
        if isinstance(error, RuntimeError):
            with pytest.raises(RuntimeError, match="a callback failed"):
                run_training(tmp_path, [tracking, spy])
        else:
            run_training(tmp_path, [tracking, spy])
        assert wandb.run is None, "the W&B run is finished (before W&B's teardown would finish it)"
    finally:
        wandb.teardown()  # stops this process's W&B service
    csv_tracker, tensorboard, _, _ = spy.trackers
    assert csv_tracker.tracker is None, "the CSV file is closed"
    assert tensorboard.writer.all_writers is None, "the SummaryWriter is closed"
    assert mlflow.active_run() is None
    assert read_mlflow(tmp_path / "logs")[2] == ["FINISHED"]
    assert [record["type"] for record in read_wandb_records(tmp_path / "logs")][-1] == "exit"
    assert tracking.trackers == []
    last_step = 3 if error is not None else NUM_EPOCHS * STEPS_PER_EPOCH
    assert read_csv(tmp_path / "logs")["lr"][-1][0] == last_step - last_step % LOG_EVERY


# ---------------------------------------------------------------------------- bad input


def test_unknown_tracker_lists_the_valid_names() -> None:
    with pytest.raises(
        ValueError, match="Unknown tracker 'tensorbord'. Valid tracker names: .*csv.*tensorboard"
    ):
        TrackingCallback(["tensorbord"])


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorboard" else real_find_spec(name, *a),
    )
    with pytest.raises(
        ImportError, match=r"needs the 'tensorboard' package.*pytorch-accelerated\[trackers\]"
    ):
        TrackingCallback(["csv", "tensorboard"])
    with pytest.raises(
        ImportError, match="'aim' tracker needs the 'aim' package, which is not installed: pip install aim"
    ):
        TrackingCallback(["aim"])


def test_tracker_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="tracker names or accelerate tracker objects.*not int"):
        TrackingCallback([3])  # type: ignore[list-item]


@pytest.mark.parametrize("value", [0, -2, 1.5, "10", True])
def test_log_every_n_steps_must_be_a_positive_whole_number(value: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="log_every_n_steps"):
        TrackingCallback(["csv"], log_every_n_steps=value)


class RecordsAWord(TrainerCallback):
    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("optimizer_name", "sgd")


def test_metric_that_is_not_a_number_is_refused_with_its_name(tmp_path: Path) -> None:
    tracking = TrackingCallback(["csv"], log_every_n_steps=LOG_EVERY, logging_dir=tmp_path)
    with pytest.raises(
        TypeError, match="cannot log metric 'optimizer_name': its value 'sgd' \\(str\\) is not a number"
    ):
        run_training(tmp_path, [RecordsAWord(), tracking])
    assert tracking.trackers == [], "the trackers are finished after the error"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--save-every", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--save-last", action="store_true")
    parser.add_argument("--resume-from", default=None)
    arguments = parser.parse_args()
    run_training(arguments.out, script_callbacks(arguments), resume_from=arguments.resume_from)
