"""TrainerWithTimmScheduler drives a real timm scheduler: the learning rate of every update is
timm's own value (and the closed form) for the right ``t``."""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.trainer import TrainerPlaceholderValues, TrainerWithTimmScheduler
from tests.helpers import make_linear_model, make_regression_data

timm_scheduler = pytest.importorskip("timm.scheduler")

BASE_LR, WARMUP_LR, LR_MIN, WARMUP_T = 0.1, 0.01, 0.001, 3
TRAIN, EVAL = make_regression_data(30, seed=0), make_regression_data(12, seed=1)
# 30 samples in batches of 4 -> 8 batches; windows of 2 -> 4 updates per epoch; 3 epochs.
NUM_EPOCHS, UPDATES_PER_EPOCH = 3, 4


class RecordingCosineLRScheduler(timm_scheduler.CosineLRScheduler):  # type: ignore[misc,name-defined]
    """timm's cosine scheduler, recording how the Trainer steps it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[Any, ...]] = []

    def step(self, epoch: int, metric: float | None = None) -> None:
        self.calls.append(("step", epoch, metric))
        super().step(epoch, metric)

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        self.calls.append(("step_update", num_updates))
        super().step_update(num_updates, metric)


def closed_form_lr(t: int, t_initial: int, warmup_t: int) -> float:
    """timm's cosine schedule with warmup (no warmup prefix, one cycle), written out."""
    if t < warmup_t:
        return WARMUP_LR + t * (BASE_LR - WARMUP_LR) / warmup_t
    if t >= t_initial:
        return LR_MIN
    return LR_MIN + 0.5 * (BASE_LR - LR_MIN) * (1 + math.cos(math.pi * t / t_initial))


class LrRecorder(TrainerCallback):
    """The learning rate each batch trains with, and the one left at the end of the run."""

    def __init__(self) -> None:
        self.per_batch: list[tuple[int, int, float]] = []  # (epoch, global_step, lr)
        self.final_lr: float | None = None

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        lr = trainer.optimizer.param_groups[0]["lr"]
        self.per_batch.append((trainer.progress.epoch, trainer.progress.global_step, lr))

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.final_lr = trainer.optimizer.param_groups[0]["lr"]


def train(t_in_epochs: bool, with_eval: bool) -> tuple[TrainerWithTimmScheduler, LrRecorder]:
    model = make_linear_model()
    recorder = LrRecorder()
    trainer = TrainerWithTimmScheduler(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=BASE_LR), callbacks=(recorder,)
    )
    t_initial = (
        TrainerPlaceholderValues.NUM_EPOCHS
        if t_in_epochs
        else TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH * NUM_EPOCHS
    )
    create_scheduler_fn = functools.partial(
        RecordingCosineLRScheduler,
        t_initial=t_initial,
        warmup_t=1 if t_in_epochs else WARMUP_T,
        warmup_lr_init=WARMUP_LR,
        lr_min=LR_MIN,
        t_in_epochs=t_in_epochs,
    )
    trainer.train(
        TRAIN,
        num_epochs=NUM_EPOCHS,
        eval_dataset=EVAL if with_eval else None,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        create_scheduler_fn=create_scheduler_fn,
    )
    return trainer, recorder


@pytest.mark.parametrize("with_eval", [False, True])
def test_per_update_schedule_gives_each_update_the_lr_for_the_updates_done(with_eval: bool) -> None:
    trainer, recorder = train(t_in_epochs=False, with_eval=with_eval)
    scheduler = trainer.scheduler
    total = NUM_EPOCHS * UPDATES_PER_EPOCH
    assert scheduler.t_initial == total  # the placeholder resolved to the run's update count
    for _, updates_done, lr in recorder.per_batch:
        assert lr == pytest.approx(scheduler._get_lr(updates_done)[0], rel=1e-12)
        assert lr == pytest.approx(closed_form_lr(updates_done, total, WARMUP_T), rel=1e-12)
    assert recorder.final_lr == pytest.approx(LR_MIN)  # t = total: the end of the cycle
    step_updates = [call[1] for call in scheduler.calls if call[0] == "step_update"]
    assert step_updates == list(range(1, total + 1))


@pytest.mark.parametrize("with_eval", [False, True])
def test_per_epoch_schedule_is_stepped_after_each_epoch_with_the_eval_loss_as_metric(with_eval: bool) -> None:
    trainer, recorder = train(t_in_epochs=True, with_eval=with_eval)
    scheduler = trainer.scheduler
    assert scheduler.t_initial == NUM_EPOCHS
    for epoch, _, lr in recorder.per_batch:
        assert lr == pytest.approx(scheduler._get_lr(epoch)[0], rel=1e-12)
        assert lr == pytest.approx(closed_form_lr(epoch, NUM_EPOCHS, 1), rel=1e-12)
    assert recorder.final_lr == pytest.approx(LR_MIN)
    epoch_steps = [call[1:] for call in scheduler.calls if call[0] == "step"]
    metrics = trainer.run_history.get_metric_values("eval_loss_epoch") if with_eval else [None] * NUM_EPOCHS
    assert epoch_steps == [(epoch + 1, metric) for epoch, metric in enumerate(metrics)]
    # Every epoch's updates come before that epoch's step(epoch + 1).
    kinds = [call[0] for call in scheduler.calls]
    assert kinds == (["step_update"] * UPDATES_PER_EPOCH + ["step"]) * NUM_EPOCHS


def test_a_run_without_eval_set_passes_no_metric_even_if_the_kept_history_has_one() -> None:
    trainer, _ = train(t_in_epochs=True, with_eval=True)
    trainer.train(
        TRAIN,
        num_epochs=2,
        per_device_batch_size=4,
        reset_run_history=False,
        create_scheduler_fn=functools.partial(RecordingCosineLRScheduler, t_initial=2, t_in_epochs=True),
    )
    assert [call for call in trainer.scheduler.calls if call[0] == "step"] == [
        ("step", 1, None),
        ("step", 2, None),
    ]
