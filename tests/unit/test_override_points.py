"""Every override point that the docs name still works: a subclass's method runs in place of the
Trainer's (called where the Trainer would call its own), and what it returns is what the run uses.

One scenario exercises every point once (training with evaluation, a scheduler, clipping, a saved
best model that is loaded back at the end, a saved training state resumed by a second Trainer, an
evaluation and a prediction); each override records its call and hands on to the Trainer's own,
so the run ends with the same weights as a plain Trainer's. Then one test per point.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveBestModelCallback, SaveTrainingStateCallback
from pytorch_accelerated.schedulers import CosineLrScheduler
from tests.helpers import make_linear_model, make_regression_data

#: The Trainer's methods that the docs name as override points (docs/inside-the-trainer.md, the
#: API reference): one method per ML step, the set-up methods and the extension points.
OVERRIDE_POINTS = (
    "_create_accelerator",
    "_prepare_model_optimizer_and_dataloaders",
    "_create_run_config",
    "_run_training",
    "_run_train_epoch",
    "_run_eval_epoch",
    "_clip_gradients",
    "get_default_train_dl_kwargs",
    "get_default_eval_dl_kwargs",
    "create_train_dataloader",
    "create_eval_dataloader",
    "create_scheduler",
    "training_run_start",
    "training_run_epoch_end",
    "training_run_end",
    "evaluation_run_start",
    "evaluation_run_end",
    "train_epoch_start",
    "train_epoch_end",
    "eval_epoch_start",
    "eval_epoch_end",
    "calculate_train_batch_loss",
    "calculate_eval_batch_loss",
    "calculate_predict_batch_outputs",
    "backward_step",
    "optimizer_step",
    "scheduler_step",
    "optimizer_zero_grad",
    "save_checkpoint",
    "load_checkpoint",
    "save_training_state",
    "load_training_state",
)


def recording_trainer_class(calls: list[str]) -> type[Trainer]:
    """A Trainer subclass that overrides every point: each records its name, then calls the Trainer's."""

    def override(name: str) -> Any:
        original = getattr(Trainer, name)

        @functools.wraps(original)
        def method(self: Trainer, *args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(self, *args, **kwargs)

        return method

    return type("RecordingOverrides", (Trainer,), {name: override(name) for name in OVERRIDE_POINTS})


def run_scenario(trainer_class: type[Trainer], folder: Path) -> dict[str, Any]:
    """Train (saving the best model and a training state each epoch), resume in a second Trainer,
    evaluate and predict; return the final weights and what was evaluated and predicted."""
    data = make_regression_data(48)

    def new_trainer() -> Trainer:
        model = make_linear_model()
        best = SaveBestModelCallback(save_path=str(folder / "best.pt"))  # loaded back at the run's end
        states = SaveTrainingStateCallback(save_dir=str(folder / "states"), save_every_n_epochs=1)
        return trainer_class(
            model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=(best, states)
        )

    settings: dict[str, Any] = {
        "per_device_batch_size": 8,
        "gradient_clip_value": 1.0,
        "create_scheduler_fn": CosineLrScheduler.create_scheduler_fn(),
    }
    first = new_trainer()
    first.train(data, num_epochs=2, eval_dataset=data, **settings)
    resumed = new_trainer()
    resumed.train(
        data, num_epochs=3, eval_dataset=data, resume_from=folder / "states" / "epoch_2", **settings
    )
    return {
        "weights": {key: value.clone() for key, value in resumed.get_model().state_dict().items()},
        "evaluation": resumed.evaluate(data, per_device_batch_size=16),
        "predictions": resumed.predict(data, per_device_batch_size=16),
        "accelerator": resumed.accelerator,
    }


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    calls: list[str] = []
    overridden = run_scenario(recording_trainer_class(calls), tmp_path_factory.mktemp("overridden"))
    plain = run_scenario(Trainer, tmp_path_factory.mktemp("plain"))
    return {"calls": calls, "overridden": overridden, "plain": plain}


@pytest.mark.parametrize("name", OVERRIDE_POINTS)
def test_the_override_of_the_point_runs_in_place_of_the_trainers_own(
    name: str, scenario: dict[str, Any]
) -> None:
    assert name in scenario["calls"]


def test_overrides_that_hand_on_to_the_trainer_change_nothing(scenario: dict[str, Any]) -> None:
    overridden, plain = scenario["overridden"], scenario["plain"]
    for key, value in plain["weights"].items():
        assert torch.equal(overridden["weights"][key], value), key
    assert overridden["evaluation"] == plain["evaluation"]
    assert torch.equal(overridden["predictions"], plain["predictions"])


def test_every_named_override_point_is_a_method_of_the_trainer() -> None:
    assert [name for name in OVERRIDE_POINTS if not callable(getattr(Trainer, name, None))] == []


class ReturnsItsOwn(Trainer):
    """Overrides whose return values differ from the Trainer's, to show the run uses them."""

    def _create_accelerator(self) -> Accelerator:
        return SubclassedAccelerator(cpu=True)

    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        return {**super().get_default_train_dl_kwargs(batch_size), "drop_last": True}

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        self.train_batch_sizes.append(output["batch_size"])
        return output

    def calculate_predict_batch_outputs(self, batch: Any) -> Any:
        return torch.zeros(len(batch[0]), 2)


class SubclassedAccelerator(Accelerator):
    pass


def test_what_overrides_return_is_what_the_run_uses() -> None:
    model = make_linear_model()
    trainer = ReturnsItsOwn(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=())
    trainer.train_batch_sizes = []  # type: ignore[attr-defined]
    trainer.train(make_regression_data(20), num_epochs=1, per_device_batch_size=8)
    assert isinstance(trainer.accelerator, SubclassedAccelerator)
    assert trainer.train_batch_sizes == [8, 8]  # type: ignore[attr-defined]  # the last 4 samples dropped
    assert torch.equal(trainer.predict(make_regression_data(5)), torch.zeros(5, 2))
