"""How runs end when something stops or fails them: StopTrainingError from anywhere, any other
exception through ``on_exception``, and built-in callbacks releasing what they hold."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    TRAINER_EVENTS,
    LimitBatchesCallback,
    LimitEvalStepsCallback,
    ProgressBarCallback,
    SaveTrainingStateCallback,
    StopTrainingError,
    TrainerCallback,
)
from pytorch_accelerated.callbacks.limits import LimitedLoader
from tests.helpers import (
    AskForStepMetrics,
    EventRecorder,
    make_regression_data,
)
from tests.helpers import make_trainer as make_any_trainer

EVALUATE_EVENTS = (
    "on_evaluation_run_start",
    "on_eval_epoch_start",
    "on_eval_step_start",
    "on_eval_step_end",
    "on_eval_epoch_end",
    "on_evaluation_run_end",
)
END_EVENTS = ("on_stop_training_error", "on_training_run_end", "on_evaluation_run_end")
TRAIN_EVENTS = tuple(
    e
    for e in TRAINER_EVENTS
    if e not in ("on_init_end", "on_exception", "on_evaluation_run_start", "on_evaluation_run_end")
)


class RaiseAt(TrainerCallback):
    """Raises ``error`` the ``at``-th time ``event`` fires."""

    def __init__(self, event: str, error: BaseException, at: int = 1) -> None:
        self.event, self.error, self.at, self.seen = event, error, at, 0

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_") and name == object.__getattribute__(self, "event"):
            return object.__getattribute__(self, "_maybe_raise")
        return object.__getattribute__(self, name)

    def _maybe_raise(self, trainer: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.at:
            raise self.error


def raising_at(event: str, error: BaseException, at: int = 1) -> TrainerCallback:
    """A callback whose ``event`` method raises ``error`` (the handler calls overridden events only)."""
    cls = type(f"Raise_{event}", (RaiseAt,), {event: lambda self, trainer, **kwargs: None})
    return cls(event, error, at)


class StopAtSecondUpdate(TrainerCallback):
    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step and trainer.progress.global_step == 2:
            raise StopTrainingError("enough")


class RecordException(TrainerCallback):
    def __init__(self) -> None:
        self.exceptions: list[BaseException] = []

    def on_exception(self, trainer: Any, exception: BaseException, **kwargs: Any) -> None:
        self.exceptions.append(exception)


def make_trainer(callbacks: tuple, trainer_class: type[Trainer] = Trainer) -> Trainer:
    # AskForStepMetrics: so that on_step_metrics fires too
    return make_any_trainer((AskForStepMetrics(every_n_steps=1), *callbacks), trainer_class=trainer_class)


def train(trainer: Trainer) -> None:
    trainer.train(
        make_regression_data(8),
        num_epochs=2,
        eval_dataset=make_regression_data(4),
        per_device_batch_size=2,
        create_scheduler_fn=constant_schedule,  # so that scheduler_step runs
    )


def constant_schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


# ---------------------------------------------------------------------------- StopTrainingError


@pytest.mark.parametrize("event", [e for e in TRAIN_EVENTS if e not in END_EVENTS])
def test_stop_training_error_in_any_event_of_train_ends_the_run_normally(event: str) -> None:
    log: list[str] = []
    trainer = make_trainer((raising_at(event, StopTrainingError("stop")), EventRecorder(log)))
    train(trainer)  # returns normally

    assert event not in log  # the callbacks after the one that raised do not get the event
    assert log[-2:] == ["on_stop_training_error", "on_training_run_end"]
    assert log.count("on_stop_training_error") == 1 and "on_exception" not in log


TRAIN_METHODS = (
    "training_run_start",
    "train_epoch_start",
    "calculate_train_batch_loss",
    "backward_step",
    "optimizer_step",
    "scheduler_step",
    "optimizer_zero_grad",
    "train_epoch_end",
    "eval_epoch_start",
    "calculate_eval_batch_loss",
    "eval_epoch_end",
    "training_run_epoch_end",
)


def trainer_raising_in(method: str, error: BaseException) -> type[Trainer]:
    def raising(self: Trainer, *args: Any, **kwargs: Any) -> Any:
        raise error

    return type(f"Raising_{method}", (Trainer,), {method: raising})


@pytest.mark.parametrize("method", TRAIN_METHODS)
def test_stop_training_error_in_any_overridable_method_of_train_ends_the_run_normally(method: str) -> None:
    log: list[str] = []
    trainer = make_trainer((EventRecorder(log),), trainer_raising_in(method, StopTrainingError("stop")))
    train(trainer)

    assert log[-2:] == ["on_stop_training_error", "on_training_run_end"]
    assert "on_exception" not in log


@pytest.mark.parametrize("event", [e for e in EVALUATE_EVENTS if e != "on_evaluation_run_end"])
def test_stop_training_error_in_evaluate_ends_it_records_no_partial_loss_and_returns(event: str) -> None:
    log: list[str] = []
    trainer = make_trainer((raising_at(event, StopTrainingError("stop")), EventRecorder(log)))
    metrics = trainer.evaluate(make_regression_data(5), per_device_batch_size=2)

    assert log[-2:] == ["on_stop_training_error", "on_evaluation_run_end"]
    assert log.count("on_evaluation_run_end") == 1 and "on_exception" not in log
    # The loss is recorded before on_eval_epoch_end: only a stop there comes after it.
    recorded = event == "on_eval_epoch_end"
    assert ("evaluation_loss" in metrics) is recorded
    assert ("evaluation_loss" in trainer.run_history.get_metric_names()) is recorded


def test_stop_training_error_at_an_evaluation_batch_ends_the_evaluation_at_that_batch() -> None:
    log: list[str] = []
    trainer = make_trainer(
        (EventRecorder(log), raising_at("on_eval_step_end", StopTrainingError("stop"), at=2))
    )
    assert trainer.evaluate(make_regression_data(10), per_device_batch_size=2) == {}

    assert log.count("on_eval_step_end") == 2 and "on_eval_epoch_end" not in log


@pytest.mark.parametrize(
    "method", ["evaluation_run_start", "eval_epoch_start", "calculate_eval_batch_loss", "eval_epoch_end"]
)
def test_stop_training_error_in_an_overridable_method_of_evaluate_returns_normally(method: str) -> None:
    log: list[str] = []
    trainer = make_trainer((EventRecorder(log),), trainer_raising_in(method, StopTrainingError("stop")))
    trainer.evaluate(make_regression_data(4), per_device_batch_size=2)

    assert log[-2:] == ["on_stop_training_error", "on_evaluation_run_end"]


@pytest.mark.parametrize("event", END_EVENTS)
def test_stop_training_error_in_an_end_event_skips_its_other_callbacks_and_returns_normally(
    event: str,
) -> None:
    log: list[str] = []
    callbacks = (StopAtSecondUpdate(), raising_at(event, StopTrainingError("stop")), EventRecorder(log))
    trainer = make_trainer(callbacks)
    if event == "on_evaluation_run_end":
        trainer.evaluate(make_regression_data(4), per_device_batch_size=2)
    else:
        train(trainer)

    assert event not in log and "on_exception" not in log
    if event == "on_stop_training_error":
        assert log[-1] == "on_training_run_end"  # the run's end still comes


@pytest.mark.parametrize("method", ["training_run_end", "evaluation_run_end"])
def test_stop_training_error_in_an_end_method_skips_its_event_and_returns_normally(method: str) -> None:
    log: list[str] = []
    trainer = make_trainer((EventRecorder(log),), trainer_raising_in(method, StopTrainingError("stop")))
    if method == "evaluation_run_end":
        trainer.evaluate(make_regression_data(4), per_device_batch_size=2)
    else:
        train(trainer)

    assert f"on_{method}" not in log and "on_exception" not in log


def test_stop_training_error_in_on_init_end_skips_the_other_callbacks_of_that_event() -> None:
    log: list[str] = []
    trainer = make_trainer((raising_at("on_init_end", StopTrainingError("stop")), EventRecorder(log)))
    assert log == []
    train(trainer)
    assert log[-1] == "on_training_run_end"


# ---------------------------------------------------------------------------- other exceptions


class Boom(RuntimeError):
    pass


def holding_callbacks(save_dir: Path) -> tuple[TrainerCallback, ...]:
    """Built-ins that acquire something: signal handlers, sliced loaders, progress bars."""
    return (
        LimitBatchesCallback(3),
        LimitEvalStepsCallback(1, limit_intermediate_only=False),
        ProgressBarCallback(),
        SaveTrainingStateCallback(save_dir, handle_signals=(signal.SIGTERM, signal.SIGUSR1)),
    )


def assert_nothing_held(trainer: Trainer, handlers_before: dict[int, Any]) -> None:
    assert {signum: signal.getsignal(signum) for signum in handlers_before} == handlers_before
    assert not isinstance(trainer.train_dataloader, LimitedLoader)
    assert not isinstance(trainer.eval_dataloader, LimitedLoader)
    bar = trainer.callback_handler.get_callback(ProgressBarCallback)
    assert bar.train_bar is None and bar.eval_bar is None


@pytest.mark.parametrize("event", [e for e in TRAINER_EVENTS if e not in ("on_init_end", "on_exception")])
def test_an_exception_in_any_event_fires_on_exception_once_and_leaves_nothing_held(
    event: str, tmp_path: Path
) -> None:
    handlers_before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    error = Boom(f"raised in {event}")
    log: list[str] = []
    recorder = RecordException()
    trigger = (StopAtSecondUpdate(),) if event == "on_stop_training_error" else ()
    callbacks = (
        *trigger,
        *holding_callbacks(tmp_path),
        EventRecorder(log),
        recorder,
        raising_at(event, error),
    )
    trainer = make_trainer(callbacks)

    with pytest.raises(Boom) as raised:
        if event in ("on_evaluation_run_start", "on_evaluation_run_end"):
            trainer.evaluate(make_regression_data(4), per_device_batch_size=2)
        else:
            train(trainer)

    assert raised.value is error  # unchanged
    assert recorder.exceptions == [error] and log[-1] == "on_exception"
    assert_nothing_held(trainer, handlers_before)


@pytest.mark.parametrize("method", TRAIN_METHODS + ("training_run_end",))
def test_an_exception_in_any_overridable_method_fires_on_exception_and_leaves_nothing_held(
    method: str, tmp_path: Path
) -> None:
    handlers_before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    recorder = RecordException()
    trainer = make_trainer((*holding_callbacks(tmp_path), recorder), trainer_raising_in(method, Boom(method)))

    with pytest.raises(Boom):
        train(trainer)

    assert len(recorder.exceptions) == 1
    assert_nothing_held(trainer, handlers_before)


def test_a_keyboard_interrupt_fires_on_exception_and_reaches_the_caller(tmp_path: Path) -> None:
    handlers_before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGUSR1)}
    recorder = RecordException()
    trainer = make_trainer(
        (*holding_callbacks(tmp_path), recorder, raising_at("on_train_step_end", KeyboardInterrupt()))
    )

    with pytest.raises(KeyboardInterrupt):
        train(trainer)

    assert [type(error) for error in recorder.exceptions] == [KeyboardInterrupt]
    assert_nothing_held(trainer, handlers_before)


class FailingRelease(TrainerCallback):
    def on_exception(self, trainer: Any, exception: BaseException, **kwargs: Any) -> None:
        raise ValueError("release failed too")


def test_a_callback_failing_in_on_exception_does_not_stop_the_others_or_replace_the_error(
    tmp_path: Path,
) -> None:
    recorder = RecordException()
    error = Boom("first")
    trainer = make_trainer((FailingRelease(), recorder, raising_at("on_train_epoch_end", error)))

    with pytest.raises(Boom) as raised:
        train(trainer)

    assert raised.value is error and recorder.exceptions == [error]
    assert any(
        "FailingRelease.on_exception also raised ValueError" in note for note in raised.value.__notes__
    )


def test_after_a_failed_run_the_next_train_runs_cleanly(tmp_path: Path) -> None:
    log: list[str] = []
    failing = raising_at("on_train_epoch_end", Boom("once"))
    trainer = make_trainer((*holding_callbacks(tmp_path), EventRecorder(log), failing))
    with pytest.raises(Boom):
        train(trainer)
    del log[:]

    train(trainer)  # the callback raises only the first time

    assert log[-1] == "on_training_run_end" and "on_exception" not in log
    assert trainer.progress.global_step == 2 * 3  # 2 epochs of 3 batches (LimitBatchesCallback(3))


class EvaluatesInsideTheRun(TrainerCallback):
    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.evaluate(make_regression_data(4), per_device_batch_size=2)


def test_an_exception_passing_through_a_nested_evaluate_fires_on_exception_once() -> None:
    recorder = RecordException()
    trainer = make_trainer(
        (EvaluatesInsideTheRun(), recorder, raising_at("on_eval_step_end", Boom("nested")))
    )
    with pytest.raises(Boom):
        train(trainer)
    assert len(recorder.exceptions) == 1


@pytest.mark.parametrize("method", ["create_train_dataloader", "create_scheduler", "_create_run_config"])
def test_a_stop_while_setting_up_ends_train_before_it_starts_with_no_event(method: str) -> None:
    log: list[str] = []
    trainer = make_trainer((EventRecorder(log),), trainer_raising_in(method, StopTrainingError("not today")))
    trainer.train(make_regression_data(8), num_epochs=1, create_scheduler_fn=lambda optimizer: None)

    assert log == ["on_init_end"] and trainer.progress.global_step == 0


def test_a_failure_while_setting_up_fires_no_event_since_nothing_started() -> None:
    log: list[str] = []
    trainer = make_trainer(
        (EventRecorder(log),), trainer_raising_in("create_train_dataloader", Boom("no loader"))
    )
    with pytest.raises(Boom):
        train(trainer)
    assert log == ["on_init_end"]
