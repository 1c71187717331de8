"""ModelEma (the averaged copy) and ModelEmaCallback (per-update averaging, EMA evaluation, best EMA
weights, state round trips, resume)."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.callbacks.ema import ModelEmaCallback
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from pytorch_accelerated.utils import ModelEma
from tests.helpers import (
    RecordUpdates,
    assert_close_weights,
    make_linear_model,
    make_regression_data,
    weights,
)
from tests.helpers import make_trainer as make_any_trainer


class CountingNet(nn.Module):
    """A small model with batch norm plus an integer and a boolean buffer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("calls", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("seen", torch.tensor(False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.fill_(True)
        return self.bn(self.linear(x))


def make_model() -> CountingNet:
    torch.manual_seed(0)
    return CountingNet()


def train_a_little(model: nn.Module) -> None:
    """Changes every parameter and, through a forward in training mode, every buffer."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.train()
    model(torch.randn(8, 4) * 3 + 1)


def test_update_matches_a_hand_computation_for_every_tensor_over_three_updates():
    model = make_model()
    ema = ModelEma(model, decay=0.9)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        train_a_little(model)
        ema.update(model)
        for name, current in model.state_dict().items():
            if current.is_floating_point():
                expected[name] = 0.9 * expected[name] + 0.1 * current
            else:
                expected[name] = current.clone()
    ema_state = ema.module.state_dict()
    assert ema_state.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(ema_state[name], value, rtol=1e-6, atol=1e-6, msg=name)


def test_integer_and_bool_buffers_are_copied_not_averaged():
    model = make_model()
    ema = ModelEma(model, decay=0.9)
    for _ in range(3):
        train_a_little(model)
    ema.update(model)
    assert ema.module.calls.dtype == torch.int64 and ema.module.calls.item() == 3
    assert ema.module.bn.num_batches_tracked.item() == 3
    assert ema.module.seen.item() is True


def test_ema_of_a_batch_norm_model_averages_running_stats_and_evaluates_with_them():
    model = make_model()
    ema = ModelEma(model, decay=0.5)
    initial_mean = model.bn.running_mean.clone()
    train_a_little(model)
    ema.update(model)
    torch.testing.assert_close(ema.module.bn.running_mean, 0.5 * initial_mean + 0.5 * model.bn.running_mean)

    # In eval mode the outputs depend on the running stats, which set() copies exactly.
    ema.set(model)
    x = torch.randn(5, 4)
    model.eval()
    assert not ema.module.training and not ema.module.bn.training
    torch.testing.assert_close(ema(x), model(x))


def test_set_copies_every_tensor_exactly():
    model = make_model()
    ema = ModelEma(model, decay=0.99)
    train_a_little(model)
    ema.set(model)
    for name, value in model.state_dict().items():
        assert torch.equal(ema.module.state_dict()[name], value), name


def test_copy_is_in_eval_mode_requires_no_grad_and_is_independent_of_the_model():
    model = make_model()
    ema = ModelEma(model)
    assert not ema.module.training
    assert not any(p.requires_grad for p in ema.parameters())
    assert all(p.requires_grad for p in model.parameters())
    before = ema.module.linear.weight.clone()
    train_a_little(model)
    assert torch.equal(ema.module.linear.weight, before)


def test_forward_runs_the_averaged_copy():
    model = make_model()
    ema = ModelEma(model, decay=1.0)
    train_a_little(model)
    ema.update(model)  # decay 1 keeps the initial weights
    x = torch.randn(5, 4)
    torch.testing.assert_close(ema(x), ema.module(x))
    assert not torch.allclose(ema(x), model.eval()(x))


def test_decay_zero_follows_the_model():
    model = make_model()
    ema = ModelEma(model, decay=0.0)
    train_a_little(model)
    ema.update(model)
    torch.testing.assert_close(ema.module.linear.weight, model.linear.weight)


@pytest.mark.parametrize("decay", [-0.1, 1.5, math.nan, "0.9", None, True])
def test_bad_decay_raises_naming_the_value_and_the_valid_range(decay):
    with pytest.raises(ValueError, match=rf"decay must be a number in \[0, 1\], but got {decay!r}\. "):
        ModelEma(make_model(), decay=decay)


def test_update_with_a_different_model_raises_naming_the_mismatch():
    ema = ModelEma(make_model())
    with pytest.raises(ValueError, match=r"missing: \['bn.bias'.*unexpected: \[\]\)\. Pass the same model"):
        ema.update(nn.Sequential())
    with pytest.raises(ValueError, match="differ from the averaged copy's"):
        ema.set(nn.Linear(4, 3))


def test_update_casts_the_model_tensors_to_the_copy_dtype():
    model = make_model()
    ema = ModelEma(model, decay=0.5).to(torch.float64)
    train_a_little(model)
    ema.update(model)
    assert ema.module.linear.weight.dtype == torch.float64
    assert ema.module.calls.dtype == torch.int64 and ema.module.calls.item() == 1


def test_state_dict_round_trips_into_another_model_ema():
    source = ModelEma(make_model(), decay=0.9)
    target = ModelEma(CountingNet(), decay=0.9)  # different random weights
    assert all(key.startswith("module.") for key in source.state_dict())
    assert not torch.equal(target.module.linear.weight, source.module.linear.weight)
    target.load_state_dict(source.state_dict())
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_a_compiled_model_is_unwrapped():
    model = make_model()
    ema = ModelEma(torch.compile(model), decay=0.5)
    assert isinstance(ema.module, CountingNet)
    train_a_little(model)
    ema.set(torch.compile(model))
    assert torch.equal(ema.module.linear.weight, model.linear.weight)


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_distributed_data_parallel_model_is_unwrapped(single_process_group):
    model = make_model()
    ddp_model = nn.parallel.DistributedDataParallel(model)
    ema = ModelEma(ddp_model, decay=0.5)
    assert isinstance(ema.module, CountingNet)
    initial = ema.module.linear.weight.clone()
    train_a_little(model)
    ema.update(ddp_model)
    torch.testing.assert_close(ema.module.linear.weight, 0.5 * initial + 0.5 * model.linear.weight)


# ---------------------------------------------------------------- ModelEmaCallback

make_trainer = functools.partial(make_any_trainer, lr=0.05)
EVAL_DATA = make_regression_data(12, seed=5)


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
