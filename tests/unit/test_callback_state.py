"""Callback states are saved and restored by a stable key (``state_key``), not by position."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    CallbackHandler,
    EarlyStoppingCallback,
    ModelEmaCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
)
from pytorch_accelerated.checkpoints.discovery import list_complete_states
from pytorch_accelerated.checkpoints.torch_files import atomic_torch_save, safe_torch_load
from tests.helpers import make_linear_model, make_regression_data, reseal_state


def early_stopping() -> EarlyStoppingCallback:
    # A threshold no epoch can beat: every epoch after the first counts as one without improvement.
    return EarlyStoppingCallback(early_stopping_patience=10, early_stopping_threshold=1e6)


def ema() -> ModelEmaCallback:
    return ModelEmaCallback(decay=0.5, evaluate_during_training=False, save_path=None)


def run(callbacks: tuple, num_epochs: int, resume_from: Path | None = None) -> Trainer:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks)
    trainer.train(
        make_regression_data(16),
        num_epochs=num_epochs,
        eval_dataset=make_regression_data(8, seed=1),
        per_device_batch_size=4,
        resume_from=resume_from,
    )
    return trainer


class Snapshot(TrainerCallback):
    """Records the states of ``callbacks`` when the first epoch of a run starts: on resume, just
    after the saved states went in (a resume with nothing left to train would not start)."""

    def __init__(self, *callbacks: TrainerCallback) -> None:
        self.callbacks, self.states = callbacks, None

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.states is None:
            self.states = [copy.deepcopy(callback.state_dict()) for callback in self.callbacks]


def saved_state(save_dir: Path) -> dict[str, Any]:
    return safe_torch_load(list_complete_states(save_dir)[-1][1] / "trainer_state.pt")


def assert_same_state(state: dict[str, Any], saved: dict[str, Any]) -> None:
    assert state.keys() == saved.keys()
    for key, value in saved.items():
        if isinstance(value, dict):  # EMA weights
            assert all(torch.equal(state[key][name], tensor) for name, tensor in value.items())
        else:
            assert state[key] == value


def test_resume_with_a_reordered_and_extended_callback_list_restores_each_state_by_key(
    tmp_path: Path,
) -> None:
    first_stopper, first_ema = early_stopping(), ema()
    run((first_stopper, first_ema, SaveTrainingStateCallback(tmp_path)), num_epochs=2)
    saved = saved_state(tmp_path)["callbacks"]
    assert set(saved) == {"EarlyStoppingCallback", "ModelEmaCallback", "SaveTrainingStateCallback"}
    assert first_stopper.num_epochs_without_improvement == 1

    stopper, averaged = early_stopping(), ema()
    extra = SaveBestModelCallback(tmp_path / "best.pt")
    snapshot = Snapshot(stopper, averaged)
    with pytest.warns(UserWarning) as caught:
        run((extra, averaged, stopper, snapshot), num_epochs=3, resume_from=tmp_path)

    assert_same_state(snapshot.states[0], saved["EarlyStoppingCallback"])
    assert_same_state(snapshot.states[1], saved["ModelEmaCallback"])
    messages = [str(warning.message) for warning in caught]
    assert any("no state for the callback 'SaveBestModelCallback'" in m for m in messages)
    assert any("holds a state for the callback 'SaveTrainingStateCallback'" in m for m in messages)


def test_a_batch_limit_set_in_one_run_only_does_not_lose_callback_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reported defect: PT_ACC_LIMIT_BATCHES prepends a LimitBatchesCallback, which shifted
    # every positional key, so early stopping and EMA states were dropped without a word.
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", "3")
    run((early_stopping(), ema(), SaveTrainingStateCallback(tmp_path)), num_epochs=2)
    saved = saved_state(tmp_path)["callbacks"]
    monkeypatch.delenv("PT_ACC_LIMIT_BATCHES")

    stopper, averaged = early_stopping(), ema()
    snapshot = Snapshot(stopper, averaged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every state is claimed: nothing to warn about
        run(
            (stopper, averaged, SaveTrainingStateCallback(tmp_path), snapshot),
            num_epochs=3,
            resume_from=tmp_path,
        )

    assert snapshot.states[0]["num_epochs_without_improvement"] == 1
    assert_same_state(snapshot.states[1], saved["ModelEmaCallback"])


def test_states_saved_by_position_by_earlier_versions_still_load(tmp_path: Path) -> None:
    run((early_stopping(), ema(), SaveTrainingStateCallback(tmp_path)), num_epochs=2)
    state_dir = list_complete_states(tmp_path)[-1][1]
    state = safe_torch_load(state_dir / "trainer_state.pt")
    saved = state["callbacks"]
    # The earlier scheme: "<index in the callback list>:<class name>".
    state["callbacks"] = {
        "0:EarlyStoppingCallback": saved["EarlyStoppingCallback"],
        "1:ModelEmaCallback": saved["ModelEmaCallback"],
        "2:SaveTrainingStateCallback": saved["SaveTrainingStateCallback"],
    }
    atomic_torch_save(state, state_dir / "trainer_state.pt")
    reseal_state(state_dir)

    stopper, averaged = early_stopping(), ema()
    snapshot = Snapshot(stopper, averaged)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(
            (SaveTrainingStateCallback(tmp_path / "new"), stopper, averaged, snapshot),
            num_epochs=3,
            resume_from=tmp_path,
        )

    assert snapshot.states[0]["num_epochs_without_improvement"] == 1
    assert_same_state(snapshot.states[1], saved["ModelEmaCallback"])


class Counter(TrainerCallback):
    def __init__(self, name: str) -> None:
        self.name, self.count = name, 0

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


class NamedCounter(Counter):
    @property
    def state_key(self) -> str:
        return f"NamedCounter[{self.name}]"


def test_repeated_keys_get_a_suffix_in_list_order_and_state_key_can_be_overridden() -> None:
    handler = CallbackHandler(
        (
            Counter("a"),
            EarlyStoppingCallback(),
            Counter("b"),
            Counter("c"),
            NamedCounter("x"),
            NamedCounter("y"),
        )
    )
    keys = handler.stateful_callbacks()
    assert list(keys) == [
        "Counter",
        "EarlyStoppingCallback",
        "Counter-2",
        "Counter-3",
        "NamedCounter[x]",
        "NamedCounter[y]",
    ]
    assert [keys[key].name for key in ("Counter", "Counter-2", "Counter-3")] == ["a", "b", "c"]


def test_only_callbacks_that_override_state_dict_are_saved() -> None:
    handler = CallbackHandler((Counter("a"), TrainerCallback()))
    assert list(handler.state_dict()) == ["Counter"]


def test_overridden_keys_follow_the_callback_when_the_list_is_reordered(tmp_path: Path) -> None:
    run((NamedCounter("x"), NamedCounter("y"), SaveTrainingStateCallback(tmp_path)), num_epochs=1)
    state_dir = list_complete_states(tmp_path)[-1][1]
    state = safe_torch_load(state_dir / "trainer_state.pt")
    state["callbacks"]["NamedCounter[x]"]["count"] = 5  # tell the two apart
    atomic_torch_save(state, state_dir / "trainer_state.pt")
    reseal_state(state_dir)

    y, x = NamedCounter("y"), NamedCounter("x")
    run((y, x, SaveTrainingStateCallback(tmp_path)), num_epochs=2, resume_from=tmp_path)
    assert (x.count, y.count) == (6, 2)  # restored 5 and 1, then one more epoch each
