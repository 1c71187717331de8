"""SaveBestModelCallback and EarlyStoppingCallback on runs whose watched metric is scripted."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.callbacks.monitoring import EarlyStoppingCallback, SaveBestModelCallback
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from tests.helpers import EventRecorder, make_linear_model, make_regression_data

SAMPLES, BATCH = 16, 4  # 4 optimizer updates per epoch
STEPS_PER_EPOCH = SAMPLES // BATCH
SCRIPT = [1.0, 0.8, 0.85, 0.9, 0.7, 0.72]


class ScriptedMetric(TrainerCallback):
    """Records ``values[epoch]`` as ``name`` at each epoch end (None: nothing that epoch)."""

    def __init__(self, values: list[float | None], name: str = "eval_loss_epoch") -> None:
        self.values, self.name = values, name

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        value = self.values[trainer.progress.epoch]
        if value is not None:
            trainer.run_history.update_metric(self.name, value)


class CaptureWeights(TrainerCallback):
    """Keeps a copy of the model's weights at the end of each epoch (index 0 = epoch 1)."""

    def __init__(self) -> None:
        self.per_epoch: list[dict[str, torch.Tensor]] = []

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.per_epoch.append(copy.deepcopy(trainer.get_model().state_dict()))


def train(callbacks: tuple, num_epochs: int, trainer: Trainer | None = None, **kwargs: Any) -> Trainer:
    if trainer is None:
        model = make_linear_model()
        trainer = Trainer(
            model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks
        )
    trainer.train(make_regression_data(SAMPLES), num_epochs=num_epochs, per_device_batch_size=BATCH, **kwargs)
    return trainer


def epochs_run(trainer: Trainer) -> int:
    return len(trainer.run_history.get_metric_values("train_loss_epoch"))


def assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    ("patience", "threshold", "stop_epoch"),
    [(1, 0.01, 3), (2, 0.01, 4), (1, 0.25, 2), (3, 0.15, 5), (3, 0.01, None)],
)
def test_early_stopping_stops_at_the_expected_epoch(
    patience: int, threshold: float, stop_epoch: int | None
) -> None:
    events: list[str] = []
    stopper = EarlyStoppingCallback(early_stopping_patience=patience, early_stopping_threshold=threshold)
    trainer = train((ScriptedMetric(SCRIPT), stopper, EventRecorder(events)), num_epochs=len(SCRIPT))
    if stop_epoch is None:
        assert epochs_run(trainer) == len(SCRIPT)
        assert "on_stop_training_error" not in events
    else:
        assert epochs_run(trainer) == stop_epoch
        assert trainer.progress.global_step == stop_epoch * STEPS_PER_EPOCH
        assert events[-2:] == ["on_stop_training_error", "on_training_run_end"]


@pytest.mark.parametrize(
    ("greater_is_better", "threshold", "stop_epoch"), [(True, 0.01, 6), (True, 0.25, 3), (False, 0.01, 3)]
)
def test_early_stopping_follows_greater_is_better(
    greater_is_better: bool, threshold: float, stop_epoch: int
) -> None:
    values = [0.1, 0.3, 0.29, 0.5, 0.45, 0.4, 0.9]
    stopper = EarlyStoppingCallback(
        2, threshold, watch_metric="accuracy", greater_is_better=greater_is_better
    )
    trainer = train((ScriptedMetric(values, "accuracy"), stopper), num_epochs=len(values))
    assert epochs_run(trainer) == stop_epoch


def test_early_stopping_judges_only_epochs_that_recorded_the_metric() -> None:
    # Evaluated on epochs 1, 3, 5 only: the stale value of epoch 1 must not count at epoch 2.
    stopper = EarlyStoppingCallback(early_stopping_patience=1)
    trainer = train((ScriptedMetric([0.5, None, 0.6, None, 0.4]), stopper), num_epochs=5)
    assert epochs_run(trainer) == 3


@pytest.mark.parametrize("callback_class", [EarlyStoppingCallback, SaveBestModelCallback])
def test_unknown_watched_metric_error_names_it_and_lists_recorded_metrics(
    callback_class: type, tmp_path: Path
) -> None:
    callback = (
        callback_class(save_path=tmp_path / "b.pt")
        if callback_class is SaveBestModelCallback
        else callback_class()
    )
    with pytest.raises(ValueError) as error:
        train((callback,), num_epochs=2)
    message = str(error.value)
    assert (
        f"{callback_class.__name__} watches the metric 'eval_loss_epoch', but it was never recorded"
        in message
    )
    assert "['train_loss_epoch']" in message
    assert "pass eval_dataset to trainer.train(...)" in message


def test_unknown_custom_metric_error_says_how_to_record_it() -> None:
    with pytest.raises(ValueError, match=r"'accuracy', but it was never recorded.*update_metric"):
        train((EarlyStoppingCallback(watch_metric="accuracy"),), num_epochs=1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"early_stopping_patience": 0},
            r"EarlyStoppingCallback: early_stopping_patience must be a whole number >= 1, got 0\.",
        ),
        (
            {"early_stopping_threshold": -0.1},
            r"early_stopping_threshold must be a number >= 0 \(.*\), got -0\.1\.",
        ),
    ],
)
def test_early_stopping_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EarlyStoppingCallback(**kwargs)


def test_save_best_checkpoint_holds_the_best_epoch_its_metric_and_weights(tmp_path: Path) -> None:
    path, capture = tmp_path / "best.pt", CaptureWeights()
    train((ScriptedMetric(SCRIPT), capture, SaveBestModelCallback(save_path=path)), num_epochs=len(SCRIPT))
    saved = safe_torch_load(path)
    assert set(saved) == {
        "model_state_dict",
        "optimizer_state_dict",
        "epoch",
        "global_step",
        "eval_loss_epoch",
    }
    assert (saved["epoch"], saved["global_step"], saved["eval_loss_epoch"]) == (5, 5 * STEPS_PER_EPOCH, 0.7)
    assert_same_weights(saved["model_state_dict"], capture.per_epoch[4])


def test_save_best_reloads_the_best_weights_at_the_end_of_the_run(tmp_path: Path) -> None:
    capture = CaptureWeights()
    callback = SaveBestModelCallback(save_path=tmp_path / "best.pt")
    trainer = train((ScriptedMetric(SCRIPT), capture, callback), num_epochs=len(SCRIPT))
    assert (callback.best_epoch, callback.best_metric) == (5, 0.7)
    assert_same_weights(trainer.get_model().state_dict(), capture.per_epoch[4])
    assert not torch.equal(trainer.get_model().weight, capture.per_epoch[5]["weight"])


def test_save_best_keeps_the_last_weights_without_load_saved_checkpoint(tmp_path: Path) -> None:
    capture = CaptureWeights()
    callback = SaveBestModelCallback(save_path=tmp_path / "best.pt", load_saved_checkpoint=False)
    trainer = train((ScriptedMetric(SCRIPT), capture, callback), num_epochs=len(SCRIPT))
    assert_same_weights(trainer.get_model().state_dict(), capture.per_epoch[-1])


def test_save_best_with_greater_is_better_saves_the_highest_value(tmp_path: Path) -> None:
    path = tmp_path / "best.pt"
    callback = SaveBestModelCallback(save_path=path, watch_metric="accuracy", greater_is_better=True)
    train((ScriptedMetric([0.2, 0.6, 0.5, 0.55], "accuracy"), callback), num_epochs=4)
    saved = safe_torch_load(path)
    assert (saved["epoch"], saved["accuracy"]) == (2, 0.6)


@pytest.mark.parametrize("save_states", [True, False])
def test_save_best_includes_optimizer_and_scheduler_states_only_when_asked(
    tmp_path: Path, save_states: bool
) -> None:
    path = tmp_path / "best.pt"
    callback = SaveBestModelCallback(save_path=path, save_optimizer=save_states, save_scheduler=save_states)
    scheduler_fn = lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)  # noqa: E731
    train((ScriptedMetric(SCRIPT), callback), num_epochs=2, create_scheduler_fn=scheduler_fn)
    keys = set(safe_torch_load(path))
    assert ("optimizer_state_dict" in keys, "scheduler_state_dict" in keys) == (save_states, save_states)


def test_early_stop_then_the_best_epoch_is_reloaded(tmp_path: Path) -> None:
    capture = CaptureWeights()
    callbacks = (
        ScriptedMetric(SCRIPT),
        capture,
        SaveBestModelCallback(save_path=tmp_path / "best.pt"),
        EarlyStoppingCallback(early_stopping_patience=2),
    )
    trainer = train(callbacks, num_epochs=len(SCRIPT))
    assert epochs_run(trainer) == 4
    assert_same_weights(trainer.get_model().state_dict(), capture.per_epoch[1])


@pytest.mark.parametrize(("reset_on_train", "stop_epoch"), [(False, 2), (True, 3)])
def test_reset_on_train_decides_whether_a_second_run_starts_afresh(
    reset_on_train: bool, stop_epoch: int
) -> None:
    stopper = EarlyStoppingCallback(early_stopping_patience=2, reset_on_train=reset_on_train)
    model = make_linear_model()
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(ScriptedMetric([0.5]), stopper),
    )
    train((), num_epochs=1, trainer=trainer)
    assert stopper.best_metric == 0.5
    trainer.callback_handler.callbacks[0].values = [0.9, 0.9, 0.9]
    train((), num_epochs=3, trainer=trainer)
    assert epochs_run(trainer) == stop_epoch


def test_early_stopping_state_dict_round_trips_as_plain_values() -> None:
    stopper = EarlyStoppingCallback(early_stopping_patience=5)
    train((ScriptedMetric(SCRIPT), stopper), num_epochs=4)
    state = stopper.state_dict()
    assert json.loads(json.dumps(state)) == state == {"best_metric": 0.8, "num_epochs_without_improvement": 2}
    restored = EarlyStoppingCallback(early_stopping_patience=5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_save_best_state_dict_round_trips_as_plain_values(tmp_path: Path) -> None:
    callback = SaveBestModelCallback(save_path=tmp_path / "best.pt")
    train((ScriptedMetric(SCRIPT), callback), num_epochs=3)
    state = callback.state_dict()
    assert json.loads(json.dumps(state)) == state == {"best_metric": 0.8, "best_epoch": 2}
    restored = SaveBestModelCallback()
    restored.load_state_dict(state)
    assert restored.state_dict() == state


def test_a_loaded_state_is_kept_when_the_next_run_starts() -> None:
    # As when resuming: the restored count goes on, so one more bad epoch reaches patience 2.
    stopper = EarlyStoppingCallback(early_stopping_patience=2)
    stopper.load_state_dict({"best_metric": 0.5, "num_epochs_without_improvement": 1})
    trainer = train((ScriptedMetric([0.9, 0.9, 0.9]), stopper), num_epochs=3)
    assert epochs_run(trainer) == 1


def test_a_resumed_run_stops_at_the_same_epoch_as_the_uninterrupted_one(tmp_path: Path) -> None:
    def callbacks() -> tuple:
        saver = SaveTrainingStateCallback(
            tmp_path / "states", save_every_n_epochs=1, save_at_end=False, handle_signals=()
        )
        return ScriptedMetric(SCRIPT), EarlyStoppingCallback(early_stopping_patience=2), saver

    assert epochs_run(train(callbacks(), num_epochs=len(SCRIPT))) == 4
    # After epoch 3 the best is 0.8 and one epoch went without improvement: epoch 4 is the second.
    resumed = train(callbacks(), num_epochs=len(SCRIPT), resume_from=tmp_path / "states" / "epoch_3")
    assert epochs_run(resumed) == 4
