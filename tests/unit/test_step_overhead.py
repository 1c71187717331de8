"""The per-step fast paths: the user's optimizer stepped directly, NaN checks batched."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TerminateOnNaNCallback, TrainerCallback
from tests.helpers import make_linear_model, make_regression_data


def test_a_single_process_run_steps_the_users_optimizer_itself() -> None:
    model = make_linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    trainer.train(make_regression_data(8), num_epochs=2, per_device_batch_size=4)
    assert trainer.optimizer is optimizer


def test_a_scheduler_sees_every_optimizer_step_without_warning() -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=1.0), callbacks=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a scheduler steps before its optimizer
        trainer.train(
            make_regression_data(8),
            num_epochs=1,
            per_device_batch_size=2,
            create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        )
    assert trainer.optimizer.param_groups[0]["lr"] == 0.5**4


class NaNAtStepTrainer(Trainer):
    def __init__(self, *args: Any, nan_at_step: int, **kwargs: Any) -> None:
        self.nan_at_step = nan_at_step
        super().__init__(*args, **kwargs)

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if self.progress.global_step == self.nan_at_step:
            output["loss"] = output["loss"] * float("nan")
        return output


def test_terminate_on_nan_remembers_a_nan_folded_away_before_a_distant_check() -> None:
    stops: list[int] = []

    class Stops(TrainerCallback):
        def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
            stops.append(trainer.progress.global_step)

    model = make_linear_model()
    trainer = NaNAtStepTrainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.01),
        callbacks=(TerminateOnNaNCallback(check_every_n_steps=80), Stops()),
        nan_at_step=3,
    )
    # 100 steps; the NaN of step 3 stays in the epoch's loss sum until the check at step 80.
    trainer.train(make_regression_data(200), num_epochs=1, per_device_batch_size=2)
    assert stops == [80]
