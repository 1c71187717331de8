"""The per-step path stays lean: what the default callbacks do between two checks, and what a
printed line costs (docs/benchmarks.md, "Where the per-step cost went")."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TerminateOnNaNCallback, TrainerCallback
from tests.helpers import make_linear_model, make_regression_data


class ATenOps(TorchDispatchMode):
    """Records the name of every ATen operation run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.names.append(func.name())
        return func(*args, **(kwargs or {}))


class OpsOfNaNChecks(TrainerCallback):
    """Runs after TerminateOnNaNCallback and records the ATen operations of each of its checks."""

    def __init__(self, nan_callback: TerminateOnNaNCallback) -> None:
        self.nan_callback = nan_callback
        self.checks: list[list[str]] = []

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if kwargs.get("is_update_step") and trainer.progress.global_step % 2 == 0:
            with ATenOps() as ops:
                self.nan_callback.on_train_step_end(trainer, is_update_step=True)
            self.checks.append(ops.names)


def test_on_one_process_the_nan_check_is_one_host_read_and_no_other_device_op() -> None:
    nan_callback = TerminateOnNaNCallback(check_every_n_steps=2)
    recorder = OpsOfNaNChecks(nan_callback)
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), (recorder,))
    trainer.train(make_regression_data(16), num_epochs=1, per_device_batch_size=4)
    assert recorder.checks == [["aten::_local_scalar_dense"]] * 2  # updates 2 and 4: one read each


class NaNAfterTwoUpdates(Trainer):
    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if self.progress.global_step == 2:
            output["loss"] = output["loss"] * float("inf")
        return output


@pytest.mark.parametrize("check_every_n_steps", [1, 4])
def test_the_host_side_nan_check_still_stops_at_the_first_check_after_the_non_finite_loss(
    check_every_n_steps: int,
) -> None:
    model = make_linear_model()
    nan_callback = TerminateOnNaNCallback(check_every_n_steps=check_every_n_steps)
    trainer = NaNAfterTwoUpdates(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), (nan_callback,)
    )
    trainer.train(make_regression_data(40), num_epochs=2, per_device_batch_size=4)
    assert nan_callback.triggered
    assert trainer.progress.global_step == (3 if check_every_n_steps == 1 else 4)


def test_trainer_print_without_a_bar_on_screen_skips_tqdm_but_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=())
    entered: list[bool] = []
    original = tqdm.external_write_mode

    def recording(*args: Any, **kwargs: Any) -> Any:
        entered.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(tqdm, "external_write_mode", recording)
    disabled = tqdm(total=3, disable=True)  # not drawn: tqdm does not list it
    trainer.print("no bar drawn")
    disabled.close()
    assert entered == [] and capsys.readouterr().out == "no bar drawn\n"

    with open(os.devnull, "w") as devnull, tqdm(total=3, file=devnull):  # a bar drawn: cleared first
        trainer.print("above the bar")
    assert entered == [True] and "above the bar\n" in capsys.readouterr().out
