"""Callback dispatch and the default callbacks, on real runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    DEFAULT_CALLBACKS,
    STATE_SAVES_ORDER,
    CallbackHandler,
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    SaveTrainingStateCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
    get_default_callbacks,
)
from tests.helpers import make_linear_model, make_regression_data


def test_default_callbacks_are_the_five_documented_classes_in_order() -> None:
    assert DEFAULT_CALLBACKS == (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        LogMetricsCallback,
    )
    assert ProgressBarCallback not in get_default_callbacks(progress_bar=False)


def test_callback_classes_become_fresh_instances_per_trainer_and_caller_list_is_untouched() -> None:
    callbacks = [TerminateOnNaNCallback, LogMetricsCallback()]
    model = make_linear_model()
    first = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    second = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    assert callbacks[0] is TerminateOnNaNCallback and len(callbacks) == 2
    assert first.callback_handler.callbacks[0] is not second.callback_handler.callbacks[0]
    assert isinstance(first.callback_handler.callbacks[0], TerminateOnNaNCallback)


def test_callbacks_run_in_list_order_after_the_trainer_method() -> None:
    order: list[str] = []

    class Named(TrainerCallback):
        def __init__(self, name: str) -> None:
            self.name = name

        def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
            order.append(f"{self.name}:{'train' if trainer.model.training else 'eval'}")

    class MyTrainer(Trainer):
        def train_epoch_start(self) -> None:
            order.append("method")
            super().train_epoch_start()

    model = make_linear_model()
    trainer = MyTrainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=(Named("b"), Named("a"))
    )
    trainer.model.eval()
    trainer.train(make_regression_data(2), num_epochs=1, per_device_batch_size=2)
    assert order == ["method", "b:train", "a:train"]


class Logged(TrainerCallback):
    """Appends ``name:event`` to ``log`` at each event where a training state may be saved."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append(f"{self.name}:on_training_run_start")

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append(f"{self.name}:on_train_step_end")

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append(f"{self.name}:on_training_run_epoch_end")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append(f"{self.name}:on_training_run_end")


class LoggedSaver(SaveTrainingStateCallback):
    """A state saver that logs each event it handles, before handling it."""

    def __init__(self, log: list[str], folder: Path) -> None:
        super().__init__(folder, save_every_n_steps=1, save_every_n_epochs=1, handle_signals=())
        self.log = log

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append("saver:on_training_run_start")
        super().on_training_run_start(trainer)

    def on_train_step_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.log.append("saver:on_train_step_end")
        super().on_train_step_end(trainer, *args, **kwargs)

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append("saver:on_training_run_epoch_end")
        super().on_training_run_epoch_end(trainer)

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.log.append("saver:on_training_run_end")
        super().on_training_run_end(trainer)


class LoggedAfterSaves(Logged):
    event_order = STATE_SAVES_ORDER + 1


def logged_run(callbacks: Any) -> list[str]:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    trainer.train(make_regression_data(2), num_epochs=1, per_device_batch_size=2)
    return [line.split(":")[0] for line in callbacks[0].log]


@pytest.mark.parametrize("place", [0, 1, 2])
def test_a_state_saver_runs_after_every_other_callback_at_every_event_wherever_it_is_listed(
    tmp_path: Path, place: int
) -> None:
    log: list[str] = []
    callbacks: list[Any] = [Logged("a", log), Logged("b", log)]
    callbacks.insert(place, LoggedSaver(log, tmp_path))
    # 1 update, 1 epoch: run start, the update, the epoch end, the run end; a and b in list order.
    assert logged_run(callbacks) == ["a", "b", "saver"] * 4
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch_1", "final", "step_1"]


def test_a_callback_with_a_higher_event_order_runs_after_the_state_saves(tmp_path: Path) -> None:
    log: list[str] = []
    assert (
        logged_run([LoggedAfterSaves("after", log), LoggedSaver(log, tmp_path), Logged("a", log)])
        == [
            "a",
            "saver",
            "after",
        ]
        * 4
    )


@pytest.mark.parametrize("order", ["last", 1.5, True, None])
def test_an_event_order_that_is_not_an_int_is_refused_when_the_callback_is_added(order: Any) -> None:
    class Ordered(TrainerCallback):
        event_order = order

    with pytest.raises(TypeError) as raised:
        CallbackHandler([Ordered()])
    assert str(raised.value) == (
        f"Ordered.event_order must be an int (where the callback runs among the others at every event, lower "
        f"first: 0 by default, 100 for SaveTrainingStateCallback), got {order!r}. Rename the attribute if it "
        f"means something else in your callback."
    )


def test_custom_events_reach_callbacks_that_declare_them() -> None:
    received: list[dict] = []

    class Custom(TrainerCallback):
        custom_events = ("on_my_event",)

        def on_my_event(self, trainer: Any, **kwargs: Any) -> None:
            received.append(kwargs)

    handler = CallbackHandler([Custom()])
    handler.call_event("on_my_event", None, value=3)
    assert received == [{"value": 3}]


def test_handler_registered_events_allow_matching_hooks() -> None:
    handler = CallbackHandler()
    handler.register_event("on_batch_skipped")

    class Skipped(TrainerCallback):
        def on_batch_skipped(self, trainer: Any, **kwargs: Any) -> None:
            pass

    handler.add_callback(Skipped())
    assert len(handler.callbacks) == 1
    handler.register_event("batch_skipped")  # any identifier is an event name
    with pytest.raises(ValueError, match=r"must be Python identifiers"):
        handler.register_event("batch skipped")


def test_move_modules_to_device_moves_the_loss_function_at_run_start() -> None:
    moved: list[torch.device] = []

    class WeightedLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.ones(1))

        def to(self, *args: Any, **kwargs: Any) -> WeightedLoss:
            moved.append(args[0])
            return super().to(*args, **kwargs)

        def forward(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return ((outputs - targets) ** 2 * self.scale).mean()

    model = make_linear_model()
    trainer = Trainer(
        model,
        WeightedLoss(),
        torch.optim.SGD(model.parameters(), lr=0.1),
        callbacks=(MoveModulesToDeviceCallback,),
    )
    trainer.train(make_regression_data(2), num_epochs=1, per_device_batch_size=2)
    trainer.evaluate(make_regression_data(2))
    assert moved == [trainer.device, trainer.device]


def test_default_callbacks_print_progress_and_metrics_for_each_epoch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1))
    trainer.train(
        make_regression_data(8), num_epochs=2, eval_dataset=make_regression_data(4), per_device_batch_size=4
    )
    out = capsys.readouterr().out
    assert "Starting training run: 2 epochs, 2 updates per epoch, 1 process(es)" in out
    assert out.count("train_loss_epoch: ") == 2 and out.count("eval_loss_epoch: ") == 2
    assert "Starting epoch 2" in out and "Finishing training run" in out


def test_log_metrics_can_be_overridden_to_send_metrics_elsewhere() -> None:
    logged: list[dict] = []

    class Collect(LogMetricsCallback):
        def log_metrics(self, trainer: Any, metrics: dict[str, Any]) -> None:
            logged.append(metrics)

    model = make_linear_model()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=(Collect(),)
    )
    trainer.train(make_regression_data(4), num_epochs=2, per_device_batch_size=2)
    assert [set(m) for m in logged] == [{"train_loss_epoch"}, {"train_loss_epoch"}]
    assert logged[1]["train_loss_epoch"] == trainer.run_history.get_metric_values("train_loss_epoch")[1]


def test_a_subclass_override_of_an_end_event_runs_on_that_event_only(tmp_path: Any) -> None:
    """Saves and failures reach the batteries' private helpers, never their overridable events: a
    subclass that overrides an end event (to log, say) sees it once per event, not on every state
    save or on the exception that ends the run."""
    from pytorch_accelerated.callbacks import (
        LimitBatchesCallback,
        LimitEvalStepsCallback,
        SaveTrainingStateCallback,
        TrackingCallback,
    )

    calls: list[str] = []

    def recorded(cls: type, *events: str) -> type:
        def override(event: str) -> Any:
            def method(self: Any, trainer: Any, *args: Any, **kwargs: Any) -> None:
                calls.append(f"{cls.__name__}.{event}")
                getattr(super(subclass, self), event)(trainer, *args, **kwargs)

            return method

        subclass = type(f"My{cls.__name__}", (cls,), {event: override(event) for event in events})
        return subclass

    class FailInEpoch2(TrainerCallback):
        def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
            if trainer.run_history.current_epoch == 2 and kwargs.get("is_update_step"):
                raise RuntimeError("epoch 2 fails")

    callbacks = (
        recorded(TrackingCallback, "on_training_run_epoch_end", "on_training_run_end")(
            "csv", logging_dir=tmp_path / "runs"
        ),
        recorded(LimitBatchesCallback, "on_training_run_end", "on_eval_epoch_end")(3),
        recorded(LimitEvalStepsCallback, "on_eval_epoch_end", "on_training_run_end")(1, False),
        SaveTrainingStateCallback(tmp_path / "states", save_every_n_steps=1, save_at_end=False),
        FailInEpoch2(),
    )
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=callbacks)
    with pytest.raises(RuntimeError, match="epoch 2 fails"):
        trainer.train(make_regression_data(16), num_epochs=2, eval_dataset=make_regression_data(8),
                      per_device_batch_size=2)  # fmt: skip
    assert sorted(calls) == [  # epoch 1's end events, each once; none for 4 saves or the failure
        "LimitBatchesCallback.on_eval_epoch_end",
        "LimitEvalStepsCallback.on_eval_epoch_end",
        "TrackingCallback.on_training_run_epoch_end",
    ]
    assert len(list((tmp_path / "states").iterdir())) >= 3  # the saves did run
