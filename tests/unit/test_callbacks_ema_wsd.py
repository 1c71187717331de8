"""ModelEmaCallback (per-update averaging, EMA evaluation, best EMA weights) and WSDCheckpointCallback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_linear_model, make_regression_data
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, StopTrainingError, TrainerCallback
from pytorch_accelerated.callbacks.ema import ModelEmaCallback
from pytorch_accelerated.callbacks.wsd_checkpoints import WSDCheckpointCallback
from pytorch_accelerated.checkpoints.files import safe_torch_load
from pytorch_accelerated.schedulers import WSDLrScheduler

EVAL_DATA = make_regression_data(12, seed=5)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def make_trainer(callbacks: tuple, seed: int = 0, momentum: float = 0.0) -> Trainer:
    model = make_linear_model(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    return Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)


class RecordUpdates(TrainerCallback):
    """The model's (and the EMA callback's) weights after each optimizer update and each epoch."""

    def __init__(self, ema_callback: ModelEmaCallback | None = None) -> None:
        self.ema_callback, self.initial, self._last_step = ema_callback, {}, 0
        self.model_weights: list[dict[str, torch.Tensor]] = []  # index i: after update i + 1
        self.ema_weights: list[dict[str, torch.Tensor]] = []
        self.ema_per_epoch: list[dict[str, torch.Tensor]] = []

    def ema(self) -> dict[str, torch.Tensor]:
        return weights(self.ema_callback.ema_model.module) if self.ema_callback else {}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.initial = weights(trainer.get_model())

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if trainer.progress.global_step != self._last_step:
            self._last_step = trainer.progress.global_step
            self.model_weights.append(weights(trainer.get_model()))
            self.ema_weights.append(self.ema())

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.ema_per_epoch.append(self.ema())


def hand_ema(
    start: dict[str, torch.Tensor], updates: list[dict[str, torch.Tensor]], decay: float
) -> list[dict]:
    ema, history = dict(start), []
    for current in updates:
        ema = {name: decay * ema[name] + (1 - decay) * current[name] for name in ema}
        history.append(ema)
    return history


class RecordEvalSamples(TrainerCallback):
    """Records the number of samples of each evaluation epoch as ``name``, and each epoch's kind."""

    def __init__(self, name: str) -> None:
        self.name, self.count, self.calls = name, 0, []

    def on_eval_epoch_start(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        self.count = 0

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        self.count += batch_output["batch_size"]

    def on_eval_epoch_end(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        self.calls.append(is_intermediate)
        trainer.run_history.update_metric(self.name, self.count)


class Scripted(TrainerCallback):
    def __init__(self, values: list[float]) -> None:
        self.values = values

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("scripted", self.values[trainer.progress.epoch])


def assert_close_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)


def test_ema_matches_a_hand_computation_after_every_optimizer_update(tmp_path: Path) -> None:
    ema_callback = ModelEmaCallback(decay=0.5, evaluate_during_training=False, save_path=tmp_path / "ema.pt")
    recorder = RecordUpdates(ema_callback)
    trainer = make_trainer((ema_callback, recorder))
    # 6 batches per epoch, 2 per update: 3 updates per epoch, 6 in all.
    trainer.train(
        make_regression_data(24), num_epochs=2, per_device_batch_size=4, gradient_accumulation_steps=2
    )
    assert len(recorder.model_weights) == 6
    expected = hand_ema(recorder.initial, recorder.model_weights, decay=0.5)
    for actual, wanted in zip(recorder.ema_weights, expected, strict=True):
        assert_close_weights(actual, wanted)
    # Without evaluation, the final EMA weights are saved at the end of the run.
    saved = safe_torch_load(tmp_path / "ema.pt")
    assert (saved["epoch"], saved["global_step"], saved["ema_decay"]) == (2, 6, 0.5)
    assert_close_weights(saved["model_state_dict"], expected[-1])


def test_ema_eval_loss_is_recorded_each_epoch_from_the_ema_weights(tmp_path: Path) -> None:
    ema_callback = ModelEmaCallback(decay=0.9, save_path=tmp_path / "ema.pt", load_saved_checkpoint=False)
    trainer = make_trainer((ema_callback,))
    trainer.train(make_regression_data(16), num_epochs=3, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    history = trainer.run_history
    assert len(history.get_metric_values("ema_model_eval_loss_epoch")) == 3
    assert len(history.get_metric_values("eval_loss_epoch")) == 3
    x, y = EVAL_DATA.tensors
    with torch.no_grad():
        expected = nn.functional.mse_loss(ema_callback.ema_model.module(x), y).item()
    assert history.get_latest_metric("ema_model_eval_loss_epoch") == pytest.approx(expected, rel=1e-5)
    assert history.get_latest_metric("ema_model_eval_loss_epoch") != history.get_latest_metric(
        "eval_loss_epoch"
    )


def test_evaluate_after_training_does_not_evaluate_the_ema(tmp_path: Path) -> None:
    trainer = make_trainer((ModelEmaCallback(save_path=tmp_path / "ema.pt"),))
    trainer.train(make_regression_data(16), num_epochs=1, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert set(trainer.evaluate(EVAL_DATA)) == {"evaluation_loss"}
    assert len(trainer.run_history.get_metric_values("ema_model_eval_loss_epoch")) == 1


def test_metric_callbacks_record_prefixed_metrics_and_only_the_ema_callbacks_see_the_ema_evaluation(
    tmp_path: Path,
) -> None:
    trainer_only, ema_only = RecordEvalSamples("samples"), RecordEvalSamples("ema_only_samples")
    ema_callback = ModelEmaCallback(save_path=tmp_path / "ema.pt", callbacks=(ema_only,))
    trainer = make_trainer((trainer_only, ema_callback))
    trainer.train(make_regression_data(16), num_epochs=2, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    history = trainer.run_history
    assert history.get_metric_values("samples") == [12, 12]
    assert "ema_model_samples" not in history.get_metric_names()  # the Trainer's callbacks: not the EMA's
    assert history.get_metric_values("ema_model_ema_only_samples") == [12, 12]
    assert "ema_only_samples" not in history.get_metric_names()
    assert ema_only not in trainer.callback_handler.callbacks


class IntermediateEvalAtSecondBatch(TrainerCallback):
    """Runs an intermediate evaluation; keeps its loss and the model's loss computed by hand."""

    def __init__(self) -> None:
        self.losses: list[tuple[float, float]] = []

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if step == 1:
            x, y = EVAL_DATA.tensors
            with torch.no_grad():
                by_hand = nn.functional.mse_loss(trainer.get_model()(x), y).item()
            self.losses.append((trainer.run_eval_epoch(), by_hand))


@pytest.mark.parametrize(
    ("evaluate_intermediate", "ema_evals"), [(False, [False, False]), (True, [True, False, True, False])]
)
def test_ema_is_evaluated_after_intermediate_evaluations_only_when_asked(
    tmp_path: Path, evaluate_intermediate: bool, ema_evals: list[bool]
) -> None:
    counter, intermediate = RecordEvalSamples("ema_samples"), IntermediateEvalAtSecondBatch()
    ema_callback = ModelEmaCallback(
        save_path=tmp_path / "ema.pt", callbacks=(counter,), evaluate_intermediate=evaluate_intermediate
    )
    trainer = make_trainer((intermediate, ema_callback))
    trainer.train(make_regression_data(16), num_epochs=2, eval_dataset=EVAL_DATA, per_device_batch_size=4)
    assert counter.calls == ema_evals
    history = trainer.run_history
    assert len(history.get_metric_values("ema_model_eval_loss_epoch")) == 2
    assert len(history.get_metric_values("ema_model_intermediate_eval_loss")) == (
        2 if evaluate_intermediate else 0
    )
    # The EMA evaluation does not change what the model's intermediate evaluation returned.
    for returned, by_hand in intermediate.losses:
        assert returned == pytest.approx(by_hand, rel=1e-5)


def test_best_ema_weights_are_saved_and_loaded_back_into_the_ema_copy(tmp_path: Path) -> None:
    path = tmp_path / "ema.pt"
    ema_callback = ModelEmaCallback(decay=0.5, save_path=path, watch_metric="scripted")
    capture = RecordUpdates(ema_callback)
    trainer = make_trainer((Scripted([1.0, 0.5, 0.8, 0.9]), ema_callback, capture))
    trainer.train(make_regression_data(16), num_epochs=4, per_device_batch_size=4)
    saved = safe_torch_load(path)
    assert set(saved) == {"model_state_dict", "epoch", "global_step", "ema_decay", "scripted"}
    assert (saved["epoch"], saved["global_step"], saved["scripted"]) == (2, 8, 0.5)
    assert_close_weights(saved["model_state_dict"], capture.ema_per_epoch[1])
    assert_close_weights(weights(ema_callback.ema_model.module), capture.ema_per_epoch[1])
    assert not torch.equal(ema_callback.ema_model.module.weight, capture.ema_per_epoch[3]["weight"])
    make_linear_model().load_state_dict(saved["model_state_dict"])  # loads into the bare model


@pytest.mark.parametrize("decay", [1.5, -0.1, "0.9"])
def test_ema_callback_rejects_a_decay_outside_0_1_when_created(decay: Any) -> None:
    with pytest.raises(
        ValueError, match=rf"ModelEmaCallback decay must be a number in \[0, 1\] .*got {decay!r}\."
    ):
        ModelEmaCallback(decay=decay)


def test_ema_without_evaluation_data_names_the_metric_and_the_ways_out(tmp_path: Path) -> None:
    trainer = make_trainer((ModelEmaCallback(save_path=tmp_path / "ema.pt"),))
    with pytest.raises(ValueError) as error:
        trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    message = str(error.value)
    assert "watches the metric 'ema_model_eval_loss_epoch', but it was never recorded" in message
    assert "pass eval_dataset to trainer.train(...)" in message
    assert "evaluate_during_training=False" in message


def test_ema_state_dict_round_trip_continues_the_average(tmp_path: Path) -> None:
    first = ModelEmaCallback(decay=0.5, save_path=tmp_path / "ema.pt", watch_metric="scripted")
    make_trainer((Scripted([0.3]), first)).train(
        make_regression_data(8), num_epochs=1, per_device_batch_size=4
    )
    state = first.state_dict()
    assert set(state) == {"best_metric", "best_epoch", "ema_state_dict"}
    assert (state["best_metric"], state["best_epoch"]) == (0.3, 1)

    resumed = ModelEmaCallback(decay=0.5, evaluate_during_training=False, save_path=None)
    resumed.load_state_dict(state)
    recorder = RecordUpdates(resumed)
    make_trainer((resumed, recorder), seed=3).train(
        make_regression_data(8), num_epochs=1, per_device_batch_size=4
    )
    # The average goes on from the restored EMA weights, not from the new model's weights.
    expected = hand_ema(state["ema_state_dict"], recorder.model_weights, decay=0.5)
    assert_close_weights(weights(resumed.ema_model.module), expected[-1])
    assert {k: resumed.state_dict()[k] for k in ("best_metric", "best_epoch")} == {
        "best_metric": 0.3,
        "best_epoch": 1,
    }


# ---------------------------------------------------------------- WSDCheckpointCallback

WSD_FN = WSDLrScheduler.create_scheduler_fn(num_checkpoints=3)


def run_wsd(save_dir: Path) -> tuple[Trainer, WSDCheckpointCallback, RecordUpdates]:
    callback, recorder = WSDCheckpointCallback(save_dir=save_dir), RecordUpdates()
    trainer = make_trainer((callback, recorder), momentum=0.9)
    # 10 updates per epoch, 40 in all: checkpoints at [10, 20, 40], decays of int(0.1 * period) (at
    # least 1) updates from [9, 19, 38].
    trainer.train(make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    return trainer, callback, recorder


def test_wsd_checkpoints_are_saved_exactly_at_decay_starts_and_checkpoint_steps(tmp_path: Path) -> None:
    trainer, callback, recorder = run_wsd(tmp_path / "ckpt")
    assert trainer.scheduler.get_decay_start_steps() == [9, 19, 38]
    assert trainer.scheduler.get_checkpoint_steps() == [10, 20, 40]
    assert callback.checkpoint_steps == {10, 20, 40} and callback.decay_fraction == 0.1
    assert [info["pre_decay_step"] for info in callback.decay_info] == [9, 19, 38]
    assert callback.last_checkpoint_step == 40
    names = [
        "checkpoint_9_wsd_pre_decay",
        "checkpoint_10_wsd_post_decay.pt",
        "checkpoint_19_wsd_pre_decay",
        "checkpoint_20_wsd_post_decay.pt",
        "checkpoint_38_wsd_pre_decay",
        "checkpoint_40_wsd_post_decay.pt",
    ]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(names)
    assert callback.saved_checkpoints == [str(tmp_path / "ckpt" / name) for name in names]
    for name in names:
        step = int(name.split("_")[1])
        if name.endswith(".pt"):  # post-decay: a checkpoint file
            saved = safe_torch_load(tmp_path / "ckpt" / name)
            assert saved["scheduler_state_dict"]["_num_updates"] == step
            weights_saved = saved["model_state_dict"]
        else:  # pre-decay: a training state directory
            saved = make_trainer(()).load_training_state(tmp_path / "ckpt" / name)
            weights_saved = safe_torch_load(tmp_path / "ckpt" / name / "model.pt")
        kind = "wsd_post_decay" if name.endswith(".pt") else "wsd_pre_decay"
        assert (saved["checkpoint_type"], saved["step"], saved["global_step"]) == (kind, step, step)
        assert (saved["total_steps"], saved["decay_fraction"]) == (40, 0.1)
        assert saved["epoch"] == (step - 1) // 10 + 1
        assert_close_weights(weights_saved, recorder.model_weights[step - 1])


@pytest.mark.parametrize(
    ("scheduler_fn", "found"),
    [
        (None, "this run has no scheduler (None)"),
        (lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 2), "this run has a StepLR"),
    ],
)
def test_wsd_callback_without_a_wsd_scheduler_says_how_to_create_one(
    tmp_path: Path, scheduler_fn: Any, found: str
) -> None:
    trainer = make_trainer((WSDCheckpointCallback(save_dir=tmp_path),))
    with pytest.raises(ValueError) as error:
        trainer.train(make_regression_data(8), num_epochs=1, create_scheduler_fn=scheduler_fn)
    assert (
        "WSDCheckpointCallback needs a scheduler with get_checkpoint_steps(), such as WSDLrScheduler"
        in str(error.value)
    )
    assert found in str(error.value)
    assert "create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(" in str(error.value)


class CaptureStart(TrainerCallback):
    def __init__(self, stop: bool) -> None:
        self.stop, self.weights, self.num_updates, self.lr, self.momentum = stop, {}, None, None, None
        self.position: dict[str, int] = {}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.position = trainer.progress.state_dict()
        self.weights, self.num_updates = weights(trainer.get_model()), trainer.scheduler.num_updates
        self.lr = trainer.optimizer.param_groups[0]["lr"]
        self.momentum = trainer.optimizer.state[next(trainer.get_model().parameters())].get("momentum_buffer")
        if self.stop:
            raise StopTrainingError("captured")


@pytest.mark.parametrize("is_continuation", [False, True])
def test_initial_checkpoint_loads_model_and_optimizer_and_the_schedule_unless_a_continuation(
    tmp_path: Path, is_continuation: bool
) -> None:
    run_wsd(tmp_path / "first")
    pre_decay = tmp_path / "first" / "checkpoint_19_wsd_pre_decay"  # a training state directory
    saved = {
        "model_state_dict": safe_torch_load(pre_decay / "model.pt"),
        "optimizer_state_dict": safe_torch_load(pre_decay / "optimizer.pt"),
    }
    capture = CaptureStart(stop=True)
    trainer = make_trainer(
        (WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=pre_decay), capture),
        seed=7,
        momentum=0.9,
    )
    scheduler_fn = WSDLrScheduler.create_scheduler_fn(
        num_checkpoints=3, is_continuation_from_checkpoint=is_continuation
    )
    trainer.train(
        make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=scheduler_fn
    )
    assert_close_weights(capture.weights, saved["model_state_dict"])
    torch.testing.assert_close(capture.momentum, saved["optimizer_state_dict"]["state"][0]["momentum_buffer"])
    assert capture.num_updates == (0 if is_continuation else 19)
    assert capture.lr == pytest.approx(0.05)  # the peak: the stable branch, not the saved optimizer's value
    assert capture.position == {
        "epoch": 0,
        "global_step": 0,
        "batch_index": 0,
        "epoch_step": 0,
    }  # a fresh run


def test_initial_checkpoint_file_loads_a_post_decay_checkpoint_and_its_step(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    post_decay = tmp_path / "first" / "checkpoint_20_wsd_post_decay.pt"
    capture = CaptureStart(stop=True)
    callback = WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=post_decay)
    trainer = make_trainer((callback, capture), seed=7, momentum=0.9)
    trainer.train(make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    assert_close_weights(capture.weights, safe_torch_load(post_decay)["model_state_dict"])
    assert callback.last_checkpoint_step == 20 and capture.num_updates == 20


def test_a_run_from_a_pre_decay_checkpoint_saves_the_following_checkpoints(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    callback = WSDCheckpointCallback(
        tmp_path / "second", initial_checkpoint=tmp_path / "first" / "checkpoint_19_wsd_pre_decay"
    )
    trainer = make_trainer((callback,), seed=7, momentum=0.9)
    trainer.train(make_regression_data(40), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    # The schedule goes on from update 19: its checkpoint at 20 is this run's update 1. The run
    # ends at step 29, before the last decay (from 38): no final post-decay file is written.
    assert [Path(p).name for p in callback.saved_checkpoints] == ["checkpoint_20_wsd_post_decay.pt"]
    saved = safe_torch_load(tmp_path / "second" / "checkpoint_20_wsd_post_decay.pt")
    assert (saved["step"], saved["global_step"], saved["checkpoint_type"]) == (20, 1, "wsd_post_decay")


def test_wsd_state_dict_round_trips_and_a_restored_state_skips_the_initial_checkpoint(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    callback = WSDCheckpointCallback(
        tmp_path / "second", initial_checkpoint=tmp_path / "first" / "checkpoint_9_wsd_pre_decay"
    )
    state = {"saved_checkpoints": ["a.pt"], "initial_checkpoint_loaded": True, "last_checkpoint_step": 9}
    callback.load_state_dict(state)
    assert callback.state_dict() == state
    capture = CaptureStart(stop=True)
    trainer = make_trainer((callback, capture), seed=7, momentum=0.9)
    before = weights(trainer.model)
    trainer.train(make_regression_data(40), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    assert_close_weights(capture.weights, before)
    assert capture.momentum is None  # the optimizer state was not loaded either
    assert callback.state_dict() == {
        "saved_checkpoints": ["a.pt"],
        "initial_checkpoint_loaded": False,
        "last_checkpoint_step": 9,
    }


def test_a_resumed_run_ends_with_the_ema_of_the_uninterrupted_run(tmp_path: Path) -> None:
    def run(seed: int, **kwargs: Any) -> ModelEmaCallback:
        ema_callback = ModelEmaCallback(decay=0.5, evaluate_during_training=False, save_path=None)
        saver = SaveTrainingStateCallback(
            tmp_path / "states", save_every_n_epochs=1, save_at_end=False, handle_signals=()
        )
        make_trainer((ema_callback, saver), seed=seed).train(
            make_regression_data(16), num_epochs=2, per_device_batch_size=4, **kwargs
        )
        return ema_callback

    uninterrupted = weights(run(seed=0).ema_model.module)
    resumed = run(seed=3, resume_from=tmp_path / "states" / "epoch_1")
    assert_close_weights(weights(resumed.ema_model.module), uninterrupted)


def test_a_resumed_run_is_not_restarted_from_the_initial_checkpoint(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    initial = tmp_path / "first" / "checkpoint_9_wsd_pre_decay"

    def run(**kwargs: Any) -> Trainer:
        saver = SaveTrainingStateCallback(
            tmp_path / "states", save_every_n_epochs=1, save_at_end=False, handle_signals=()
        )
        trainer = make_trainer(
            (WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=initial), saver), momentum=0.9
        )
        trainer.train(
            make_regression_data(40),
            num_epochs=2,
            per_device_batch_size=4,
            create_scheduler_fn=WSD_FN,
            **kwargs,
        )
        return trainer

    uninterrupted = weights(run().get_model())
    resumed = run(resume_from=tmp_path / "states" / "epoch_1")
    assert_close_weights(weights(resumed.get_model()), uninterrupted)
