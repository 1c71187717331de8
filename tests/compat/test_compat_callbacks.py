"""The callbacks of pytorch-accelerated 0.1.61 keep working (docs/migration.md, "What keeps
working"): each item in 0.1.61's form (its event names, hook signatures, attribute names,
directory and file names, checkpoint kwargs) and, where both forms are accepted, ours too, with
the worked numbers of docs/callbacks-builtin.md."""

from __future__ import annotations

import datetime
import functools
import inspect
import operator as op
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    CallbackHandler,
    EarlyStoppingCallback,
    ModelEmaCallback,
    ProgressBarCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    StopTrainingError,
    TerminateOnNaNCallback,
    TrainerCallback,
    WSDCheckpointCallback,
)
from pytorch_accelerated.checkpoints.discovery import list_complete_states, resolve_state_dir
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from pytorch_accelerated.schedulers import WSDLrScheduler
from pytorch_accelerated.utils import ModelEma
from tests.helpers import make_regression_data
from tests.helpers import make_trainer as make_any_trainer

EVAL_DATA = make_regression_data(8, seed=5)


make_trainer = functools.partial(make_any_trainer, lr=0.05)


# ---------------------------------------------------------------- custom events and the handler


class VerifyingTrainer(Trainer):
    """The original's documented custom event: fired without the ``on_`` prefix, by keyword."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        xb, yb = batch
        self.callback_handler.call_event("verify_train_batch", trainer=self, xb=xb, yb=yb)
        return super().calculate_train_batch_loss(batch)


class VerifyBatch(TrainerCallback):
    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def verify_train_batch(self, trainer: Trainer, xb: torch.Tensor, yb: torch.Tensor) -> None:
        assert isinstance(trainer, VerifyingTrainer)
        self.shapes.append(tuple(xb.shape))


def test_a_custom_event_of_any_name_reaches_the_callbacks_that_define_it() -> None:
    verify, other = VerifyBatch(), TrainerCallback()  # `other` lacks the method: skipped
    trainer = make_trainer((verify, other), trainer_class=VerifyingTrainer)
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    assert verify.shapes == [(4, 3), (4, 3)]
    # Ours: an `on_*` custom event declared in custom_events, fired positionally.
    received: list[int] = []

    class Declared(TrainerCallback):
        custom_events = ("on_batch_checked",)

        def on_batch_checked(self, trainer: Any, value: int, **kwargs: Any) -> None:
            received.append(value)

    CallbackHandler([Declared()]).call_event("on_batch_checked", None, value=3)
    assert received == [3]


def test_a_misspelt_hook_is_still_rejected_with_a_suggestion() -> None:
    class Misspelt(TrainerCallback):
        def on_train_step_ned(self, trainer: Any, **kwargs: Any) -> None:
            pass

    with pytest.raises(
        ValueError,
        match=r"Misspelt.on_train_step_ned is not a Trainer event.*Did you mean 'on_train_step_end'\?",
    ):
        CallbackHandler([Misspelt()])


def test_callback_list_and_clear_callbacks() -> None:
    handler = CallbackHandler([ProgressBarCallback, TerminateOnNaNCallback()])
    assert handler.callback_list == ["ProgressBarCallback", "TerminateOnNaNCallback"]
    handler.clear_callbacks()
    assert handler.callback_list == [] and handler.callbacks == []
    handler.call_event("on_train_step_end", None)  # nothing left to call


def test_hooks_written_with_the_originals_signatures_receive_their_arguments() -> None:
    seen: list[tuple[str, Any]] = []

    class OriginalStyle(TrainerCallback):
        def on_train_step_end(self, trainer: Any, step: int, **kwargs: Any) -> None:
            seen.append(("train", step))

        def on_eval_step_end(self, trainer: Any, batch_output: dict, **kwargs: Any) -> None:
            seen.append(("eval", batch_output["batch_size"]))

    trainer = make_trainer((OriginalStyle(),))
    trainer.train(make_regression_data(8), num_epochs=1, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert seen == [("train", 0), ("train", 1), ("eval", 4), ("eval", 4)]
    for hook, names in (
        ("on_train_step_end", ("batch", "batch_output", "step")),
        ("on_eval_step_end", ("batch", "batch_output")),
    ):
        parameters = inspect.signature(getattr(TrainerCallback, hook)).parameters
        assert all(parameters[name].default is None for name in names), hook


# ---------------------------------------------------------------- attribute aliases


class ScriptedLoss(TrainerCallback):
    """Records ``score`` from a script, one value per epoch."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("score", self.values[trainer.progress.epoch])


def test_save_best_and_early_stopping_have_the_originals_attribute_names(tmp_path: Path) -> None:
    best = SaveBestModelCallback(tmp_path / "best.pt", watch_metric="score", greater_is_better=True)
    stopper = EarlyStoppingCallback(early_stopping_patience=3, watch_metric="score")
    trainer = make_trainer((ScriptedLoss([0.5, 0.9, 0.7]), best, stopper))
    trainer.train(make_regression_data(8), num_epochs=3, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert best.best_metric_epoch == best.best_epoch == 2
    assert best.operator is op.gt and stopper.operator is op.lt
    # lower is better for the stopper: 0.5, then two epochs without improvement
    assert stopper.early_stopping_patience_counter == stopper.num_epochs_without_improvement == 2
    stopper.early_stopping_patience_counter = 0
    assert stopper.num_epochs_without_improvement == 0


def test_progress_bar_has_pbar_and_eval_pbar() -> None:
    bars: list[tuple[bool, bool]] = []

    class ReadBars(TrainerCallback):
        def __init__(self, bar: ProgressBarCallback) -> None:
            self.bar = bar

        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            bars.append((self.bar.pbar is self.bar.train_bar is not None, self.bar.eval_pbar is None))

        def on_eval_step_end(self, trainer: Any, **kwargs: Any) -> None:
            bars.append((self.bar.pbar is None, self.bar.eval_pbar is self.bar.eval_bar is not None))

    bar = ProgressBarCallback()
    make_trainer((bar, ReadBars(bar))).train(
        make_regression_data(4), num_epochs=1, eval_dataset=EVAL_DATA, per_device_batch_size=4
    )
    assert bars == [(True, True), (True, True), (True, True)]


def test_terminate_on_nan_has_triggered_and_check_for_nan_after_batch() -> None:
    callback = TerminateOnNaNCallback()
    assert callback.triggered is False
    callback.check_for_nan_after_batch({"loss": torch.tensor(1.0)}, step=3)
    assert callback.triggered is False
    with pytest.raises(StopTrainingError, match="non-finite loss at step 3"):
        callback.check_for_nan_after_batch({"loss": torch.tensor(float("nan"))}, step=3)
    assert callback.triggered


def test_terminate_on_nan_also_stops_on_a_non_finite_evaluation_loss_without_exiting() -> None:
    class NanEvalTrainer(Trainer):
        def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
            output = super().calculate_eval_batch_loss(batch)
            return {**output, "loss": output["loss"] * float("nan")}

    callback = TerminateOnNaNCallback()
    trainer = make_trainer((callback,), trainer_class=NanEvalTrainer)
    trainer.train(
        make_regression_data(8), num_epochs=3, eval_dataset=EVAL_DATA, per_device_batch_size=4
    )  # returns
    assert callback.triggered
    assert trainer.progress.global_step == 2  # stopped after the first epoch's evaluation


# ---------------------------------------------------------------- ModelEmaCallback


class CountEval(TrainerCallback):
    """The original's metric-callback pattern: record a metric at each evaluation epoch end."""

    def __init__(self) -> None:
        self.calls = 0

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.calls += 1
        trainer.run_history.update_metric("evals_seen", float(self.calls))


def test_model_ema_callback_has_the_originals_attributes_and_only_its_callbacks_see_the_ema_evaluation(
    tmp_path: Path,
) -> None:
    metric = CountEval()
    ema = ModelEmaCallback(decay=0.5, save_path=tmp_path / "ema.pt", callbacks=(metric,))
    assert ema.model_ema_cls is ModelEma and ema.save_optimizer is False and ema.save_scheduler is False
    assert (
        isinstance(ema.callback_handler, CallbackHandler)
        and ema.callback_handler.callbacks == [metric] == ema.callbacks
    )
    assert ema.operator is op.lt
    # The same metric callback passed to the Trainer and to the EMA callback (the original's
    # pattern) records once per evaluation: 2 epochs, each a model and an EMA evaluation.
    trainer = make_trainer((metric, ema))
    trainer.train(make_regression_data(8), num_epochs=2, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert metric.calls == 4
    assert trainer.run_history.get_metric_values("evals_seen") == [1.0, 3.0]
    assert trainer.run_history.get_metric_values("ema_model_evals_seen") == [2.0, 4.0]
    assert ema.best_metric_epoch == ema.best_epoch in (1, 2)
    assert trainer.callback_handler.callback_list == ["CountEval", "ModelEmaCallback"]


# ---------------------------------------------------------------- SaveTrainingStateCallback


def test_training_states_are_named_step_n_epoch_e_and_final_with_the_global_step_kwarg(
    tmp_path: Path,
) -> None:
    # 20 batches per epoch, accumulation 2: 10 updates per epoch; N counts updates. Saves every
    # 5 updates and every epoch: step_10 and epoch_1 fall on the same update, and both exist.
    saver = SaveTrainingStateCallback(
        tmp_path, save_every_n_epochs=1, save_every_n_steps=5, handle_signals=()
    )
    trainer = make_trainer((saver,))
    trainer.train(
        make_regression_data(40),
        num_epochs=2,
        eval_dataset=EVAL_DATA,
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
    )
    saved = [(step, path.name) for step, path in list_complete_states(tmp_path)]
    assert saved == [(5, "step_5"), (10, "epoch_1"), (10, "step_10"), (15, "step_15"),
                     (20, "epoch_2"), (20, "final"), (20, "step_20")]  # fmt: skip
    for step, name in saved:
        assert make_trainer().load_training_state(tmp_path / name)["global_step"] == step
    # The documented paths resume: epoch_1 starts epoch 2; the folder gives the newest state.
    resumed = make_trainer()
    resumed.train(make_regression_data(40), num_epochs=2, eval_dataset=EVAL_DATA, per_device_batch_size=2,
                  gradient_accumulation_steps=2, resume_from=tmp_path / "epoch_1")  # fmt: skip
    for name, value in trainer.get_model().state_dict().items():
        torch.testing.assert_close(resumed.get_model().state_dict()[name], value, rtol=0, atol=0)
    assert resolve_state_dir(tmp_path).name in {"epoch_2", "final"}  # after the last evaluation


def test_max_checkpoints_deletes_in_save_order(tmp_path: Path) -> None:
    saver = SaveTrainingStateCallback(
        tmp_path, save_every_n_epochs=1, save_every_n_steps=2, max_checkpoints=3, handle_signals=()
    )
    make_trainer((saver,)).train(make_regression_data(16), num_epochs=2, per_device_batch_size=4)
    # Saved: step_2, step_4, epoch_1, step_6, step_8, epoch_2, final: the last three are kept.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch_2", "final", "step_8"]


# ---------------------------------------------------------------- WSDCheckpointCallback


def wsd_run(
    save_dir: Path, callback: WSDCheckpointCallback | None = None, extra: tuple = (), **scheduler_kwargs: Any
) -> tuple[Trainer, WSDCheckpointCallback]:
    callback = callback or WSDCheckpointCallback(save_dir)
    trainer = make_trainer((callback, *extra))
    scheduler_fn = WSDLrScheduler.create_scheduler_fn(num_checkpoints=3, **scheduler_kwargs)
    # 100 samples, batch 4: 25 updates per epoch, 4 epochs: 100 updates.
    trainer.train(
        make_regression_data(100), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=scheduler_fn
    )
    return trainer, callback


def test_wsd_checkpoints_follow_the_worked_example(tmp_path: Path) -> None:
    # docs/callbacks-builtin.md: 100 updates, 3 checkpoints, ratio 0.1: pre-decay at 23, 48, 95;
    # post-decay at 25, 50, 100.
    _, callback = wsd_run(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [f"checkpoint_{s}_wsd_pre_decay" for s in (23, 48, 95)]
        + [f"checkpoint_{s}_wsd_post_decay.pt" for s in (25, 50, 100)]
        + [f"checkpoint_{s}_wsd_post_decay.pt.crc32" for s in (25, 50, 100)]  # ours: each file's checksum
    )
    assert callback.checkpoint_steps == {25, 50, 100} and callback.decay_fraction == 0.1
    assert [info["pre_decay_step"] for info in callback.decay_info] == [23, 48, 95]
    assert callback.last_checkpoint_step == 100
    for step in (23, 48, 95):
        directory = tmp_path / f"checkpoint_{step}_wsd_pre_decay"
        assert directory.is_dir()
        kwargs = make_trainer().load_training_state(directory)
        assert (kwargs["step"], kwargs["checkpoint_type"], kwargs["total_steps"], kwargs["decay_fraction"]) == (
            step, "wsd_pre_decay", 100, 0.1)  # fmt: skip
        datetime.datetime.fromisoformat(kwargs["timestamp"])
    for step in (25, 50, 100):
        saved = safe_torch_load(tmp_path / f"checkpoint_{step}_wsd_post_decay.pt")
        assert (saved["step"], saved["checkpoint_type"], saved["total_steps"], saved["decay_fraction"]) == (
            step, "wsd_post_decay", 100, 0.1)  # fmt: skip
        assert {"optimizer_state_dict", "scheduler_state_dict"} <= saved.keys()
        datetime.datetime.fromisoformat(saved["timestamp"])


def test_a_missing_final_post_decay_checkpoint_is_written_at_the_end_of_the_run(tmp_path: Path) -> None:
    # A schedule one update longer than the run (the original's length): its last checkpoint
    # step, 101, is never reached, so the file is written when the run ends, after 100 updates.
    _, callback = wsd_run(tmp_path, total_steps=101)
    saved = safe_torch_load(tmp_path / "checkpoint_101_wsd_post_decay.pt")
    assert (saved["step"], saved["checkpoint_type"], saved["total_steps"]) == (100, "wsd_post_decay", 101)
    assert callback.saved_checkpoints[-1] == str(tmp_path / "checkpoint_101_wsd_post_decay.pt")


@pytest.mark.parametrize("initial", ["checkpoint_48_wsd_pre_decay", "checkpoint_50_wsd_post_decay.pt"])
def test_initial_checkpoint_is_a_pre_decay_directory_or_a_post_decay_file(
    tmp_path: Path, initial: str
) -> None:
    wsd_run(tmp_path / "first")
    seen: dict[str, Any] = {}

    class Capture(TrainerCallback):
        def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
            seen.update(position=trainer.progress.global_step, updates=trainer.scheduler.num_updates,
                        weights={k: v.clone() for k, v in trainer.get_model().state_dict().items()})  # fmt: skip

    callback = WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=tmp_path / "first" / initial)
    trainer = make_trainer((callback, Capture()), seed=3)
    scheduler_fn = WSDLrScheduler.create_scheduler_fn(num_checkpoints=3, is_continuation_from_checkpoint=True)
    trainer.train(
        make_regression_data(20), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=scheduler_fn
    )
    assert seen["position"] == 0 and seen["updates"] == 0  # a fresh run, a fresh continuation schedule
    expected = (
        safe_torch_load(tmp_path / "first" / initial / "model.pt")
        if initial.endswith("pre_decay")
        else safe_torch_load(tmp_path / "first" / initial)["model_state_dict"]
    )
    for name, value in expected.items():
        torch.testing.assert_close(seen["weights"][name], value)
    # A continuation: a new 5-update schedule from the loaded weights; the checkpoints are its own.
    assert [Path(path).name for path in callback.saved_checkpoints][-1] == "checkpoint_5_wsd_post_decay.pt"


class ReadAtStart(TrainerCallback):
    """Reads the WSD callback's ``last_checkpoint_step`` once it has loaded, then stops the run."""

    def __init__(self, callback: WSDCheckpointCallback) -> None:
        self.callback, self.seen = callback, []

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.seen.append(self.callback.last_checkpoint_step)
        raise StopTrainingError("read")


def test_initial_checkpoint_sets_last_checkpoint_step_from_its_step(tmp_path: Path) -> None:
    wsd_run(tmp_path / "first")
    for initial, step in (("checkpoint_48_wsd_pre_decay", 48), ("checkpoint_50_wsd_post_decay.pt", 50)):
        callback = WSDCheckpointCallback(tmp_path / "unused", initial_checkpoint=tmp_path / "first" / initial)
        reader = ReadAtStart(callback)
        wsd_run(tmp_path / "unused", callback, extra=(reader,))
        assert reader.seen == [step], initial


class CheckpointsOnly:
    """A scheduler of one's own, duck-typed: only ``get_checkpoint_steps`` (and ``step``)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def step(self) -> None:
        pass

    def get_checkpoint_steps(self) -> list[int]:
        return [2, 4]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_wsd_callback_accepts_any_scheduler_with_get_checkpoint_steps_and_rejects_others(
    tmp_path: Path,
) -> None:
    callback = WSDCheckpointCallback(tmp_path)
    make_trainer((callback,)).train(
        make_regression_data(16), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=CheckpointsOnly
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "checkpoint_2_wsd_post_decay.pt",
        "checkpoint_2_wsd_post_decay.pt.crc32",
        "checkpoint_4_wsd_post_decay.pt",
        "checkpoint_4_wsd_post_decay.pt.crc32",
    ]
    trainer = make_trainer((WSDCheckpointCallback(tmp_path / "other"),))
    with pytest.raises(
        ValueError,
        match=r"needs a scheduler with get_checkpoint_steps\(\).*this run has no scheduler \(None\)",
    ):
        trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)


def test_best_metric_epoch_is_the_run_historys_epoch_across_train_calls(tmp_path: Path, capsys: Any) -> None:
    best = SaveBestModelCallback(tmp_path / "best.pt", watch_metric="score", greater_is_better=True)
    scores = ScriptedLoss([0.5, 0.4, 0.3, 0.2, 0.1])
    trainer = make_trainer((scores, best))
    trainer.train(make_regression_data(8), num_epochs=5, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert best.best_metric_epoch == 1
    scores.values = [0.9, 0.6]  # the second call's epochs are history epochs 6 and 7
    trainer.train(
        make_regression_data(8),
        num_epochs=2,
        eval_dataset=EVAL_DATA,
        per_device_batch_size=4,
        reset_run_history=False,
    )
    assert best.best_metric_epoch == best.best_epoch == 6
    assert safe_torch_load(tmp_path / "best.pt")["epoch"] == 6
    assert "Loaded the best model of epoch 6 (score = 0.9)" in capsys.readouterr().out
