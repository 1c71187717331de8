"""PlotRunCallback on real runs: the PNG, its panels and curves, when it is written, resume, bad input.

Each run trains a linear model on 32 samples in batches of 4: 8 optimizer updates per epoch.
The panels are read back from the PNG itself (its ``Panels`` text field, read with PIL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    PlotRunCallback,
    SaveTrainingStateCallback,
    StopTrainingError,
    TrackingCallback,
    TrainerCallback,
    get_default_callbacks,
)
from tests.helpers import make_linear_model, make_regression_data

TRAIN, EVAL = make_regression_data(32, seed=0), make_regression_data(16, seed=1)
UPDATES_PER_EPOCH = 8
STEP_SERIES = ["data_wait_fraction", "samples_per_second", "step_time_seconds"]  # besides loss and lr


class RecordError(TrainerCallback):
    """Records ``mae`` (a one-element tensor, as torchmetrics gives) at each evaluation's end."""

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("mae", torch.tensor(1.0 / (1 + trainer.progress.epoch)))


class StopAt(TrainerCallback):
    def __init__(self, global_step: int) -> None:
        self.global_step = global_step

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == self.global_step:
            raise StopTrainingError(f"stopped at update {self.global_step}")


class WatchFile(TrainerCallback):
    """After PlotRunCallback at each epoch end: the plot's bytes then (None if it is missing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[bytes | None] = []

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.seen.append(self.path.read_bytes() if self.path.exists() else None)


def run(*callbacks: TrainerCallback, num_epochs: int = 2, resume_from: Path | None = None) -> Trainer:
    model = make_linear_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=[RecordError(), *callbacks, *get_default_callbacks(progress_bar=False)],
    )
    trainer.train(
        train_dataset=TRAIN,
        eval_dataset=EVAL,
        num_epochs=num_epochs,
        per_device_batch_size=4,
        resume_from=resume_from,
    )
    return trainer


def png_panels(path: Path) -> list[str]:
    """The panel titles stored in the PNG, after checking that PIL reads it as a whole PNG."""
    with Image.open(path) as image:
        assert image.format == "PNG"
        image.load()  # decodes every pixel: a truncated file fails here
        assert image.width > 200 and image.height > 200
        return json.loads(image.text["Panels"])


def test_plot_of_a_run_with_step_series_has_loss_lr_and_every_metric_against_update_steps(tmp_path):
    pyplot_before = sys.modules.get("matplotlib.pyplot")
    plot = PlotRunCallback(tmp_path / "plots" / "run.png")
    trainer = run(TrackingCallback(["csv"], log_every_n_steps=2, logging_dir=tmp_path / "runs"), plot)

    assert png_panels(tmp_path / "plots" / "run.png") == plot.panel_titles
    assert plot.panel_titles == ["loss", "learning rate", *STEP_SERIES[:1], "mae", *STEP_SERIES[1:]]
    panels = plot.panels(trainer)
    history = trainer.run_history
    assert panels["loss"] == {
        "train_loss": history.get_step_metric_values("train_loss"),
        "train_loss_epoch": list(zip([8, 16], history.get_metric_values("train_loss_epoch"), strict=True)),
        "eval_loss_epoch": list(zip([8, 16], history.get_metric_values("eval_loss_epoch"), strict=True)),
    }
    assert [step for step, _ in panels["loss"]["train_loss"]] == list(range(2, 17, 2))
    assert panels["learning rate"] == {"lr": [(step, 0.05) for step in range(2, 17, 2)]}
    assert panels["mae"] == {"mae (epoch)": [(8, 1.0), (16, 0.5)]}
    assert sys.modules.get("matplotlib.pyplot") is pyplot_before  # drawn without pyplot
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["run.png"]  # no temporary file left


def test_plot_of_a_run_without_step_series_has_the_epoch_losses_and_metrics_only(tmp_path):
    plot = PlotRunCallback(tmp_path / "run.png")
    trainer = run(plot)

    assert png_panels(tmp_path / "run.png") == ["loss", "mae"]
    assert list(plot.panels(trainer)["loss"]) == ["train_loss_epoch", "eval_loss_epoch"]


def test_every_epoch_replaces_the_plot_after_each_epoch_and_not_only_at_the_end(tmp_path):
    path = tmp_path / "run.png"
    every, watch = PlotRunCallback(path, every_epoch=True), WatchFile(path)
    run(every, watch, num_epochs=3)
    assert all(seen is not None for seen in watch.seen) and len(set(watch.seen)) == 3  # three pictures

    at_end, watch_end = PlotRunCallback(tmp_path / "end.png"), WatchFile(tmp_path / "end.png")
    run(at_end, watch_end)
    assert watch_end.seen == [None, None] and png_panels(tmp_path / "end.png") == ["loss", "mae"]


def test_a_run_stopped_mid_epoch_still_writes_its_plot_up_to_the_stop(tmp_path):
    plot = PlotRunCallback(tmp_path / "run.png")
    trainer = run(
        TrackingCallback(["csv"], log_every_n_steps=2, logging_dir=tmp_path / "runs"), plot, StopAt(12)
    )

    assert trainer.progress.global_step == 12
    assert png_panels(tmp_path / "run.png")[:2] == ["loss", "learning rate"]
    loss = plot.panels(trainer)["loss"]
    assert [step for step, _ in loss["train_loss"]] == [2, 4, 6, 8, 10, 12]
    assert [step for step, _ in loss["eval_loss_epoch"]] == [8]


def test_a_resumed_run_draws_the_same_curves_as_the_uninterrupted_run(tmp_path):
    def tracked_run(
        name: str, *extra: TrainerCallback, resume_from: Path | None = None
    ) -> tuple[Trainer, PlotRunCallback]:
        # The saver runs before the plot at each epoch end: the state must still hold that epoch's end.
        saver = SaveTrainingStateCallback(str(tmp_path / name), save_every_n_epochs=1, save_at_end=False)
        plot = PlotRunCallback(tmp_path / f"{name}.png")
        tracking = TrackingCallback(
            ["csv"], log_every_n_steps=2, logging_dir=tmp_path / "runs", run_name=name
        )
        return run(saver, tracking, plot, *extra, num_epochs=3, resume_from=resume_from), plot

    def drawn(trainer: Trainer, plot: PlotRunCallback) -> dict[str, Any]:
        return {title: plot.panels(trainer)[title] for title in ("loss", "learning rate", "mae")}

    whole = drawn(*tracked_run("whole"))
    tracked_run("stopped", StopAt(12))  # saved at the end of epoch 1 (update 8), stopped at 12
    resumed = drawn(*tracked_run("resumed", resume_from=tmp_path / "stopped"))

    assert [step for step, _ in resumed["loss"]["eval_loss_epoch"]] == [8, 16, 24]
    assert resumed == whole


def test_a_plot_that_cannot_be_written_warns_and_the_run_finishes(tmp_path):
    plot = PlotRunCallback(tmp_path / "plots" / "run.png")
    (tmp_path / "plots").write_text("a file where the plot's folder should be")

    with pytest.warns(UserWarning, match=r"could not write the plot to .*run\.png.*Check that its folder"):
        trainer = run(plot)
    assert trainer.progress.global_step == 2 * UPDATES_PER_EPOCH
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]


def test_without_matplotlib_the_callback_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what `import matplotlib` finds when missing
    with pytest.raises(ImportError, match=r"needs matplotlib.*pip install 'pytorch-accelerated\[plots\]'"):
        PlotRunCallback("run.png")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"path": "run.jpg"}, ValueError, r"path='run\.jpg'.*give a path ending in '\.png'"),
        ({"every_epoch": "yes"}, TypeError, r"every_epoch must be True or False, got 'yes'"),
        ({"dpi": 0}, ValueError, r"PlotRunCallback: dpi must be a whole number >= 1, got 0"),
        ({"columns": 1.5}, ValueError, r"PlotRunCallback: columns must be a whole number >= 1, got 1\.5"),
    ],
)
def test_bad_arguments_are_rejected_with_the_argument_and_the_fix(kwargs, error, message):
    with pytest.raises(error, match=message):
        PlotRunCallback(**kwargs)


def test_a_path_under_a_file_is_rejected_when_the_callback_is_made(tmp_path):
    (tmp_path / "notes").write_text("")
    with pytest.raises(ValueError, match=r"is a file, so the plot cannot be written under it; choose a path"):
        PlotRunCallback(tmp_path / "notes" / "run.png")
