"""The exact order of events and ML steps, as published in docs/inside-the-trainer.md."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytorch_accelerated.callbacks import StopTrainingError, TrainerCallback
from tests.helpers import AskForStepMetrics, make_recording_trainer, make_regression_data

UPDATE = ["_clip_gradients", "optimizer_step", "optimizer_zero_grad"]  # no scheduler: no scheduler_step
SCHEDULED_UPDATE = ["_clip_gradients", "optimizer_step", "scheduler_step", "optimizer_zero_grad"]


def train_batch(update: bool, scheduled: bool = False) -> list[str]:
    return [
        "on_train_step_start",
        "calculate_train_batch_loss",
        "backward_step",
        *((SCHEDULED_UPDATE if scheduled else UPDATE) if update else []),
        "on_train_step_end",
    ]


EVAL_BATCH = ["on_eval_step_start", "calculate_eval_batch_loss", "on_eval_step_end"]


def eval_epoch(num_batches: int) -> list[str]:
    return ["on_eval_epoch_start", *EVAL_BATCH * num_batches, "on_eval_epoch_end"]


def test_normal_run_fires_every_event_in_documented_order() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log)
    trainer.train(
        make_regression_data(4), num_epochs=2, eval_dataset=make_regression_data(2), per_device_batch_size=2
    )

    epoch = [
        "on_train_epoch_start",
        *train_batch(update=True) * 2,
        "on_train_epoch_end",
        *eval_epoch(1),
        "on_training_run_epoch_end",
    ]
    assert log == ["on_init_end", "on_training_run_start", *epoch * 2, "on_training_run_end"]


def test_scheduler_step_runs_after_each_update_only_when_there_is_a_scheduler() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log)
    trainer.train(
        make_regression_data(4),
        num_epochs=1,
        per_device_batch_size=2,
        create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1),
    )
    epoch = ["on_train_epoch_start", *train_batch(True, scheduled=True) * 2, "on_train_epoch_end"]
    assert log == [
        "on_init_end",
        "on_training_run_start",
        *epoch,
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]


def test_accumulation_updates_every_n_batches_and_on_the_partial_last_window() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log)
    # 5 batches with 2 per update: windows [0, 1], [2, 3], [4].
    trainer.train(
        make_regression_data(10), num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=2
    )

    batches = [train_batch(update) for update in (False, True, False, True, True)]
    expected = [
        "on_init_end",
        "on_training_run_start",
        "on_train_epoch_start",
        *[event for batch in batches for event in batch],
        "on_train_epoch_end",
        "on_training_run_epoch_end",
        "on_training_run_end",
    ]
    assert log == expected
    assert trainer.progress.global_step == 3
    assert trainer.run_config.num_update_steps_per_epoch == 3


def test_step_metrics_fire_after_the_update_where_a_point_is_due_and_before_step_end() -> None:
    log: list[str] = []
    positions: list = []
    trainer = make_recording_trainer(
        log, extra_callbacks=(AskForStepMetrics(every_n_steps=2),), positions=positions
    )
    # 5 batches, 2 per update: updates 1, 2, 3 end batches 1, 3 and 4; a point is due at update 2.
    trainer.train(
        make_regression_data(10), num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=2
    )

    with_point = [*train_batch(update=True)[:-1], "on_step_metrics", "on_train_step_end"]
    batches = [train_batch(False), train_batch(True), train_batch(False), with_point, train_batch(True)]
    assert log[2:-3] == ["on_train_epoch_start", *[event for batch in batches for event in batch]]
    assert [(step, event) for _, step, event in positions if event == "on_step_metrics"] == [
        (2, "on_step_metrics")
    ]
    assert [step for step, _ in trainer.run_history.get_step_metric_values("train_loss")] == [2]


def test_max_num_train_steps_stops_mid_epoch_then_ends_the_epoch_and_the_run() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log)
    # 5 batches per epoch; 7 updates = one whole epoch and 2 batches of the second.
    trainer.train(
        make_regression_data(10),
        num_epochs=5,
        eval_dataset=make_regression_data(2),
        per_device_batch_size=2,
        max_num_train_steps=7,
    )

    def epoch(num_batches: int) -> list[str]:
        return [
            "on_train_epoch_start",
            *train_batch(update=True) * num_batches,
            "on_train_epoch_end",
            *eval_epoch(1),
            "on_training_run_epoch_end",
        ]

    assert log == ["on_init_end", "on_training_run_start", *epoch(5), *epoch(2), "on_training_run_end"]
    assert trainer.progress.global_step == 7
    assert trainer.run_config.num_epochs == 2
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


class StopAtSecondStep(TrainerCallback):
    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if trainer.progress.global_step == 2:
            raise StopTrainingError("enough")


def test_stop_training_error_fires_stop_event_then_run_end_and_returns_normally() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log, extra_callbacks=(StopAtSecondStep(),))
    trainer.train(
        make_regression_data(10), num_epochs=3, eval_dataset=make_regression_data(2), per_device_batch_size=2
    )

    assert log == [
        "on_init_end",
        "on_training_run_start",
        "on_train_epoch_start",
        *train_batch(update=True) * 2,
        "on_stop_training_error",
        "on_training_run_end",
    ]
    assert trainer.progress.global_step == 2


class FailingCallback(TrainerCallback):
    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        raise KeyError("metric_that_is_not_there")


def test_exception_in_callback_propagates_unchanged_with_a_note_and_stops_all_events() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log, extra_callbacks=(FailingCallback(),))
    with pytest.raises(KeyError, match="metric_that_is_not_there") as raised:
        trainer.train(make_regression_data(4), num_epochs=2, per_device_batch_size=2)

    assert "raised in callback FailingCallback.on_train_epoch_end" in getattr(raised.value, "__notes__", [])
    assert log[-2:] == ["on_train_epoch_end", "on_exception"]
    assert "on_training_run_end" not in log


def test_evaluate_fires_evaluation_run_events_around_one_eval_epoch() -> None:
    log: list[str] = []
    trainer = make_recording_trainer(log)
    metrics = trainer.evaluate(make_regression_data(5), per_device_batch_size=2)

    assert log == ["on_init_end", "on_evaluation_run_start", *eval_epoch(3), "on_evaluation_run_end"]
    assert set(metrics) == {"evaluation_loss"}


# ---------------------------------------------------------------------------- positions
# The recorder also writes (progress.epoch, progress.global_step, event): where in the run each
# event and ML step happens, so the counters a callback reads are pinned as well as the order.


def positioned(epoch: int, global_step: int, names: list[str]) -> list[tuple[int, int, str]]:
    return [(epoch, global_step, name) for name in names]


def updating_batch(epoch: int, steps_before: int) -> list[tuple[int, int, str]]:
    before = train_batch(update=True)[:-1]
    return [*positioned(epoch, steps_before, before), (epoch, steps_before + 1, "on_train_step_end")]


def test_every_event_sees_the_epoch_and_global_step_it_fires_at() -> None:
    log: list[str] = []
    positions: list[tuple[int, int, str]] = []
    trainer = make_recording_trainer(log, positions=positions)
    trainer.train(
        make_regression_data(4), num_epochs=2, eval_dataset=make_regression_data(2), per_device_batch_size=2
    )

    def epoch(number: int) -> list[tuple[int, int, str]]:
        first, last = 2 * number, 2 * number + 2
        return [
            (number, first, "on_train_epoch_start"),
            *updating_batch(number, first),
            *updating_batch(number, first + 1),
            *positioned(number, last, ["on_train_epoch_end", *eval_epoch(1), "on_training_run_epoch_end"]),
        ]

    assert positions == [
        (0, 0, "on_init_end"),
        (0, 0, "on_training_run_start"),
        *epoch(0),
        *epoch(1),
        (2, 4, "on_training_run_end"),
    ]


def test_accumulating_batches_leave_the_global_step_until_the_window_completes() -> None:
    positions: list[tuple[int, int, str]] = []
    trainer = make_recording_trainer([], positions=positions)
    trainer.train(
        make_regression_data(10), num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=2
    )

    step_ends = [(epoch, step) for epoch, step, event in positions if event == "on_train_step_end"]
    assert step_ends == [(0, 0), (0, 1), (0, 1), (0, 2), (0, 3)]
    assert positions[-1] == (1, 3, "on_training_run_end")


def test_stop_and_exception_events_fire_where_the_run_stopped() -> None:
    stopped: list[tuple[int, int, str]] = []
    make_recording_trainer([], positions=stopped, extra_callbacks=(StopAtSecondStep(),)).train(
        make_regression_data(10), num_epochs=3, per_device_batch_size=2
    )
    assert stopped[-2:] == [(0, 2, "on_stop_training_error"), (0, 2, "on_training_run_end")]

    failed: list[tuple[int, int, str]] = []
    with pytest.raises(KeyError):
        make_recording_trainer([], positions=failed, extra_callbacks=(FailingCallback(),)).train(
            make_regression_data(4), num_epochs=2, per_device_batch_size=2
        )
    assert failed[-2:] == [(0, 2, "on_train_epoch_end"), (0, 2, "on_exception")]


def test_evaluate_fires_its_events_at_the_position_of_the_last_run() -> None:
    positions: list[tuple[int, int, str]] = []
    trainer = make_recording_trainer([], positions=positions)
    trainer.train(make_regression_data(4), num_epochs=1, per_device_batch_size=2)
    del positions[:]
    trainer.evaluate(make_regression_data(5), per_device_batch_size=2)

    assert positions == positioned(1, 2, ["on_evaluation_run_start", *eval_epoch(3), "on_evaluation_run_end"])


class RecordUpdateSteps(TrainerCallback):
    def __init__(self) -> None:
        self.flags: list[bool] = []

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        self.flags.append(is_update_step)


def test_on_train_step_end_is_told_which_batches_complete_an_update() -> None:
    recorder = RecordUpdateSteps()
    trainer = make_recording_trainer([], extra_callbacks=(recorder,))
    # 5 batches per epoch with 2 per update: windows [0, 1], [2, 3], [4]; two epochs.
    trainer.train(
        make_regression_data(10), num_epochs=2, per_device_batch_size=2, gradient_accumulation_steps=2
    )

    assert recorder.flags == [False, True, False, True, True] * 2
    assert trainer.progress.global_step == recorder.flags.count(True)
