"""Trainer.find_learning_rate on real one-process runs: the rates and losses against a plain-PyTorch
oracle, early stops, the suggestion, the plot, what the test leaves behind (nothing: a train() after
it is bit for bit the train() without it), which callbacks it tells, and bad input."""

from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accelerated.callbacks import (
    MoveModulesToDeviceCallback,
    SaveTrainingStateCallback,
)
from pytorch_accelerated.lr_finder import LRFinderResult, suggest_learning_rate
from pytorch_accelerated.schedulers import CosineLrScheduler
from pytorch_accelerated.trainer import TrainerWithTimmScheduler
from tests.helpers import EventRecorder, assert_equal_nested, make_regression_data, make_trainer

make_trainer = functools.partial(make_trainer, lr=0.05)


def oracle_losses(
    data: TensorDataset, rates: list[float], batch_size: int, accumulation: int = 1
) -> list[float]:
    """The loss of each update of SGD from make_trainer's model, in data-set order, with ``rates``:
    the mean over the window's samples, each batch's gradient weighted by its share."""
    model, losses = make_trainer().model, []
    optimizer = torch.optim.SGD(model.parameters(), lr=rates[0])
    batches = [data[start : start + batch_size] for start in range(0, len(data), batch_size)]
    windows = [batches[start : start + accumulation] for start in range(0, len(batches), accumulation)]
    for rate, window in zip(rates, windows * 10, strict=False):
        optimizer.param_groups[0]["lr"] = rate
        total = sum(len(x) for x, _ in window)
        window_loss = 0.0
        for x, y in window:
            loss = nn.functional.mse_loss(model(x), y)
            (loss * len(x) / total).backward()
            window_loss += loss.item() * len(x) / total
        optimizer.step()
        optimizer.zero_grad()
        losses.append(window_loss)
    return losses


@pytest.mark.parametrize("accumulation", [1, 2])
def test_rates_rise_exponentially_and_losses_are_those_of_a_plain_loop(accumulation: int) -> None:
    data = make_regression_data(64)
    trainer = make_trainer()
    result = trainer.find_learning_rate(
        data,
        per_device_batch_size=8,
        start_lr=1e-3,
        end_lr=0.1,
        num_steps=12,
        gradient_accumulation_steps=accumulation,
        train_dataloader_kwargs={"shuffle": False},
        divergence_factor=None,
    )
    assert len(result.learning_rates) == len(result.losses) == len(result.smoothed_losses) == 12
    assert result.learning_rates[0] == pytest.approx(1e-3) and result.learning_rates[-1] == pytest.approx(0.1)
    ratios = [b / a for a, b in zip(result.learning_rates, result.learning_rates[1:], strict=False)]
    assert ratios == pytest.approx([100 ** (1 / 11)] * 11)
    expected = oracle_losses(data, result.learning_rates, 8, accumulation)
    assert result.losses == pytest.approx(expected, rel=1e-5)
    assert not result.diverged


def test_a_range_test_longer_than_an_epoch_goes_on_over_the_next_epochs_with_a_timm_style_trainer() -> None:
    # TrainerWithTimmScheduler steps the scheduler with step_update(n) and calls step(epoch=...) at
    # each epoch end: the rate follows the updates only.
    trainer = make_trainer(trainer_class=TrainerWithTimmScheduler)
    result = trainer.find_learning_rate(
        make_regression_data(32), per_device_batch_size=8, start_lr=1e-2, end_lr=1.0, num_steps=10
    )
    assert result.learning_rates == pytest.approx([1e-2 * 100 ** (k / 9) for k in range(10)])
    assert len(result.losses) == 10


def test_the_run_stops_early_once_the_smoothed_loss_diverges() -> None:
    result = make_trainer().find_learning_rate(
        make_regression_data(256), per_device_batch_size=16, start_lr=1e-3, end_lr=1e3, num_steps=60
    )
    assert result.diverged and len(result.losses) < 60
    # The diverged update is the last entry: the first where the smoothed loss passes 4 x its lowest.
    smoothed = result.smoothed_losses
    assert smoothed[-1] > 4 * min(smoothed) and all(
        value <= 4 * min(smoothed[: index + 1]) for index, value in enumerate(smoothed[:-1])
    )
    assert result.learning_rates[-1] > 2.0  # SGD on this data is stable below lr 2


def test_a_loss_that_is_not_finite_stops_the_run_even_without_a_divergence_factor() -> None:
    with pytest.warns(UserWarning, match="never fell below its first value"):  # lr 1 is too high already
        result = make_trainer().find_learning_rate(
            make_regression_data(64),
            per_device_batch_size=8,
            start_lr=1.0,
            end_lr=1e30,
            num_steps=200,
            divergence_factor=None,
        )
    assert result.diverged and not math.isfinite(result.losses[-1]) and len(result.losses) < 200
    assert all(math.isfinite(loss) for loss in result.losses[:-1])


def test_the_suggestion_is_a_tenth_of_the_rate_at_the_lowest_smoothed_loss() -> None:
    result = make_trainer().find_learning_rate(
        make_regression_data(256), per_device_batch_size=16, start_lr=1e-3, end_lr=1e2, num_steps=50
    )
    lowest = result.smoothed_losses.index(min(result.smoothed_losses))
    assert result.suggestion == result.learning_rates[lowest] / 10
    assert 0.05 < result.suggestion < 1.0  # the loss of this regression is lowest below lr 2


def test_a_loss_that_never_falls_gives_no_suggestion_and_says_why() -> None:
    with pytest.warns(
        UserWarning, match=r"never fell below its first value \(3 updates from lr 1\).*Pass a lower start_lr"
    ):
        assert math.isnan(suggest_learning_rate([1.0, 2.0, 4.0], [1.0, 2.0, 3.0]))


def test_the_plot_is_a_png_with_the_suggestion_marked(tmp_path: Path) -> None:
    result = make_trainer().find_learning_rate(
        make_regression_data(128), per_device_batch_size=16, start_lr=1e-3, end_lr=1e2, num_steps=30
    )
    path = result.plot(tmp_path / "plots" / "lr.png")
    assert path == tmp_path / "plots" / "lr.png"
    with Image.open(path) as image:
        image.load()
        assert float(image.text["Suggestion"]) == result.suggestion
    assert sorted(p.name for p in path.parent.iterdir()) == ["lr.png"]  # no partial file left


def test_the_plot_refuses_a_path_that_is_not_a_png(tmp_path: Path) -> None:
    result = LRFinderResult([1e-3, 1e-2], [1.0, 0.5], [1.0, 0.6], 1e-3, False)
    with pytest.raises(ValueError, match=r"LRFinderResult.plot\(path='lr.jpg'\): the plot is a PNG file"):
        result.plot("lr.jpg")


def state_of(trainer: Any) -> dict[str, Any]:
    """Everything a later train() starts from: weights and buffers, gradients, modes, optimizer,
    scheduler, progress, history and the RNG streams."""
    model = trainer.model
    return {
        "tensors": [t.detach().clone() for t in (*model.parameters(), *model.buffers())],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "modes": [m.training for m in model.modules()],
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),  # (it holds the live tensors)
        "scheduler": None if trainer.scheduler is None else trainer.scheduler.state_dict(),
        "progress": trainer.progress.state_dict(),
        "history": {
            n: trainer.run_history.get_metric_values(n) for n in trainer.run_history.get_metric_names()
        },
        "rng": (torch.get_rng_state(), torch.randn(3)),  # the next draw tells the stream
        "run_config": trainer.run_config,
        "callbacks": trainer.callback_handler,
    }


def dropout_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.2), nn.BatchNorm1d(16), nn.Linear(16, 1))


def test_a_train_after_the_range_test_is_bit_for_bit_the_train_without_it() -> None:
    data, scheduler = make_regression_data(64), CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=1)

    def trained(with_range_test: bool) -> tuple[Any, dict[str, Any]]:
        trainer = make_trainer(model=dropout_model(), momentum=0.9, lr=0.01)
        trainer.train(data, num_epochs=2, per_device_batch_size=8, create_scheduler_fn=scheduler)
        trainer.model.eval()  # a mode the test must put back
        torch.manual_seed(123)
        before = state_of(trainer)  # (draws from the RNG: both branches draw the same)
        if with_range_test:
            trainer.find_learning_rate(data, per_device_batch_size=8, end_lr=1.0, num_steps=20)
        after = state_of(trainer)
        if with_range_test:
            assert_equal_nested(
                {k: v for k, v in after.items() if k not in ("run_config", "callbacks", "rng")},
                {k: v for k, v in before.items() if k not in ("run_config", "callbacks", "rng")},
            )
            assert after["run_config"] is before["run_config"] and after["callbacks"] is before["callbacks"]
        trainer.train(data, num_epochs=2, per_device_batch_size=8, create_scheduler_fn=scheduler, seed=None)
        return trainer, {**state_of(trainer), "rng_after_test": after["rng"]}

    (_, with_test), (_, without) = trained(True), trained(False)
    for name in ("tensors", "optimizer", "scheduler", "history", "rng", "rng_after_test"):
        assert_equal_nested(with_test[name], without[name], name)
    assert all(torch.isfinite(tensor).all() for tensor in with_test["tensors"])


def test_a_range_test_before_any_training_leaves_the_next_train_as_it_would_have_been() -> None:
    data = make_regression_data(64)
    first, second = make_trainer(model=dropout_model()), make_trainer(model=dropout_model())
    first.find_learning_rate(data, per_device_batch_size=8, num_steps=10)
    for trainer in (first, second):
        trainer.train(data, num_epochs=1, per_device_batch_size=8)
    assert_equal_nested(state_of(first)["tensors"], state_of(second)["tensors"])


class MovesModules(MoveModulesToDeviceCallback):
    runs = 0

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        MovesModules.runs += 1
        super().on_training_run_start(trainer, **kwargs)


def test_no_callback_is_told_of_the_range_test_but_those_that_place_modules(tmp_path: Path) -> None:
    log: list[str] = []
    saver = SaveTrainingStateCallback(str(tmp_path / "states"), save_every_n_steps=1)
    trainer = make_trainer((EventRecorder(log), saver, MovesModules()))
    MovesModules.runs, log[:] = 0, []  # (on_init_end fired in the constructor)
    trainer.find_learning_rate(
        make_regression_data(64), per_device_batch_size=8, start_lr=1e-2, end_lr=1.0, num_steps=12
    )
    assert log == [] and MovesModules.runs == 1
    assert not (tmp_path / "states").exists()  # no state saved
    assert not trainer.run_history.get_metric_names()


def test_a_failure_during_the_range_test_reaches_the_caller_with_everything_put_back() -> None:
    trainer = make_trainer(model=dropout_model())
    before = state_of(trainer)
    calls = 0
    original = trainer.calculate_train_batch_loss

    def failing(batch: Any) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("boom at batch 5")
        return original(batch)

    trainer.calculate_train_batch_loss = failing  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="boom at batch 5"):
        trainer.find_learning_rate(make_regression_data(64), per_device_batch_size=8, num_steps=10)
    after = state_of(trainer)
    for name in ("tensors", "grads", "modes", "progress", "history"):
        assert_equal_nested(after[name], before[name], name)
    assert after["callbacks"] is before["callbacks"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start_lr": 0.0}, r"find_learning_rate: start_lr must be a finite number > 0, got 0\.0\."),
        ({"end_lr": math.inf}, r"find_learning_rate: end_lr must be a finite number > 0, got inf\."),
        (
            {"start_lr": 0.1, "end_lr": 0.01},
            r"end_lr must be greater than start_lr \(the rate rises from one to the other\), got "
            r"start_lr=0\.1 and end_lr=0\.01\.",
        ),
        (
            {"num_steps": 1},
            r"find_learning_rate: num_steps must be a whole number >= 2, got 1\. It is the number",
        ),
        (
            {"divergence_factor": 1.0},
            r"divergence_factor must be a finite number > 1 .* or None .*, got 1\.0\.",
        ),
        (
            {"smoothing": 1.0},
            r"smoothing must be a number from 0 \(no smoothing\) up to but not including 1, got 1\.0",
        ),
    ],
)
def test_bad_settings_are_refused_before_anything_runs(kwargs: dict[str, Any], message: str) -> None:
    trainer = make_trainer()
    with pytest.raises(ValueError, match=message):
        trainer.find_learning_rate(make_regression_data(16), per_device_batch_size=8, **kwargs)
    assert trainer.run_config is None and trainer.progress.global_step == 0


def test_the_rates_and_losses_are_plain_floats_that_json_can_write() -> None:
    result = make_trainer().find_learning_rate(
        make_regression_data(32), per_device_batch_size=8, start_lr=1e-2, end_lr=1.0, num_steps=8
    )
    values = [*result.learning_rates, *result.losses, *result.smoothed_losses, result.suggestion]
    assert {type(value) for value in values} == {float}
    assert json.loads(json.dumps(values)) == values
