"""Runs that would silently give a wrong (or no) result fail or say so instead (one process)."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import SequentialSampler

from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from tests.helpers import EventRecorder, make_linear_model, make_regression_data
from tests.helpers import make_trainer as make_any_trainer

make_trainer = functools.partial(make_any_trainer, lr=0.1)


# ---------------------------------------------------------------------------- the optimizer


def test_optimizer_built_over_another_model_is_an_error_at_train_before_any_preparation() -> None:
    model, other = make_linear_model(), make_linear_model(seed=1)
    trainer = make_trainer(model=model, optimizer=torch.optim.SGD(other.parameters(), lr=0.1))
    weights = model.weight.detach().clone()
    with pytest.raises(
        ValueError,
        match=r"optimizer holds none of the model's 2 trainable parameter tensors.*"
        r"create the optimizer from this model's parameters: torch.optim.SGD\(model.parameters\(\), \.\.\.\)",
    ):
        trainer.train(make_regression_data(16), num_epochs=1, per_device_batch_size=4)
    assert trainer.run_config is None  # nothing was set up
    assert trainer.model is model and torch.equal(model.weight, weights)


def test_optimizer_over_only_part_of_the_model_is_allowed_and_trains_that_part() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    body, head = model[0].weight.detach().clone(), model[1].weight.detach().clone()
    trainer = make_trainer(model=model, optimizer=torch.optim.SGD(model[1].parameters(), lr=0.1))
    trainer.train(make_regression_data(16), num_epochs=1, per_device_batch_size=4)
    assert torch.equal(model[0].weight, body)
    assert not torch.equal(model[1].weight, head)


# ---------------------------------------------------------------------------- empty epochs


@pytest.mark.parametrize("max_num_train_steps", [None, 3])
def test_drop_last_with_a_dataset_smaller_than_one_batch_names_drop_last_and_the_sizes(
    max_num_train_steps: int | None,
) -> None:
    trainer = make_trainer()
    with pytest.raises(
        ValueError,
        match=r"train_dataset has 5 samples but per_device_batch_size x processes is 8 x 1 = 8 and "
        r"drop_last=True: every epoch would have 0 batches.*drop_last=False in train_dataloader_kwargs.*"
        r"per_device_batch_size of at most 5",
    ):
        trainer.train(
            make_regression_data(5),
            num_epochs=1,
            max_num_train_steps=max_num_train_steps,
            train_dataloader_kwargs={"drop_last": True},
        )
    assert trainer.run_config is None


def test_evaluation_loader_with_no_batches_is_an_error_naming_its_kwargs() -> None:
    data = make_regression_data(5)
    kwargs = {"sampler": SequentialSampler(data), "drop_last": True}
    with pytest.raises(
        ValueError, match=r"eval_dataset has 5 samples.*drop_last=True.*eval_dataloader_kwargs"
    ):
        make_trainer().train(data, num_epochs=1, eval_dataset=data, eval_dataloader_kwargs=kwargs)
    with pytest.raises(ValueError, match=r"dataset has 5 samples.*drop_last=True.*dataloader_kwargs"):
        make_trainer().evaluate(data, dataloader_kwargs=kwargs)


# ---------------------------------------------------------------------------- batch size in the loader kwargs


class CountEvalBatches(TrainerCallback):
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def on_eval_step_end(self, trainer: Any, batch: Any = None, **kwargs: Any) -> None:
        self.sizes.append(len(batch[0]))


def test_batch_size_in_the_loader_kwargs_is_what_trains_evaluates_and_is_recorded(tmp_path: Path) -> None:
    counter = CountEvalBatches()
    trainer = make_trainer(callbacks=(counter,))
    trainer.train(
        make_regression_data(16),
        num_epochs=1,
        eval_dataset=make_regression_data(6),
        per_device_batch_size=8,
        gradient_accumulation_steps=2,
        train_dataloader_kwargs={"batch_size": 4},
        eval_dataloader_kwargs={"batch_size": 2},
    )
    config = trainer.run_config
    assert config is not None
    assert trainer.progress.global_step == 2  # 4 batches of 4, 2 per update
    assert (config.train_per_device_batch_size, config.train_total_batch_size) == (4, 8)
    assert (config.eval_per_device_batch_size, config.eval_total_batch_size) == (2, 2)
    assert counter.sizes == [2, 2, 2]
    assert trainer.loop_state.window is not None and trainer.loop_state.window.per_device_batch_size == 4
    trainer.save_training_state(tmp_path / "state")
    manifest = json.loads((tmp_path / "state" / "manifest.json").read_text())
    assert manifest["per_device_batch_size"] == 4


def test_batch_size_in_the_train_kwargs_trains_as_that_per_device_batch_size() -> None:
    data = make_regression_data(16)
    via_kwargs, direct = make_trainer(), make_trainer()
    via_kwargs.train(
        data,
        num_epochs=1,
        per_device_batch_size=8,
        train_dataloader_kwargs={"batch_size": 4},
        gradient_accumulation_steps=2,
    )
    direct.train(data, num_epochs=1, per_device_batch_size=4, gradient_accumulation_steps=2)
    for got, want in zip(via_kwargs.get_model().parameters(), direct.get_model().parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_batch_size_in_evaluate_kwargs_is_what_evaluates() -> None:
    counter = CountEvalBatches()
    make_trainer(callbacks=(counter,)).evaluate(
        make_regression_data(6), per_device_batch_size=8, dataloader_kwargs={"batch_size": 4}
    )
    assert counter.sizes == [4, 2]


# ---------------------------------------------------------------------------- nothing left to train


@pytest.fixture
def finished_state(tmp_path: Path) -> Path:
    """A state saved at the end of a 2-epoch run of 4 updates per epoch."""
    trainer = make_trainer()
    trainer.train(make_regression_data(16), num_epochs=2, per_device_batch_size=4)
    trainer.save_training_state(tmp_path / "done")
    return tmp_path / "done"


@pytest.mark.parametrize(
    ("settings", "done"),
    [
        ({"num_epochs": 2}, r"2 epochs \(num_epochs=2\)\. Pass a larger num_epochs"),
        ({"num_epochs": 1}, r"2 epochs \(num_epochs=1\)\. Pass a larger num_epochs"),
        (
            {"num_epochs": 5, "max_num_train_steps": 8},
            r"8 optimizer updates \(max_num_train_steps=8\)\. Pass a larger max_num_train_steps",
        ),
    ],
)
def test_resuming_a_finished_run_says_nothing_is_left_to_train_and_fires_no_event(
    finished_state: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    recwarn: pytest.WarningsRecorder,
    settings: dict[str, Any],
    done: str,
) -> None:
    events: list[str] = []
    saves = tmp_path / "saves"
    trainer = make_trainer(callbacks=(EventRecorder(events), SaveTrainingStateCallback(str(saves))))
    events.clear()
    expected = (
        rf"Nothing to train: the state resumed from {finished_state} already completed {done} to continue\."
    )
    trainer.train(make_regression_data(16), per_device_batch_size=4, resume_from=finished_state, **settings)
    assert events == []  # no start, no end: nothing ran, so nothing is saved over anything
    assert not saves.exists()
    assert re.fullmatch(f"Training stopped before it started: {expected}\n", capsys.readouterr().out)
    assert not [w for w in recwarn if "Nothing to train" in str(w.message)]  # said once, as a line
    saved_weights = torch.load(finished_state / "model.pt", weights_only=True)
    torch.testing.assert_close(trainer.get_model().state_dict(), saved_weights, rtol=0, atol=0)


def test_resuming_a_finished_run_with_more_epochs_still_trains(finished_state: Path) -> None:
    trainer = make_trainer()
    trainer.train(make_regression_data(16), num_epochs=3, per_device_batch_size=4, resume_from=finished_state)
    assert (trainer.progress.epoch, trainer.progress.global_step) == (3, 12)
