"""Precision and DeepSpeed/FSDP pass-through, on the CPU (docs/recipes/precision.md).

- bf16 autocast really runs (an inner layer's output is bf16) and trains like fp32;
- fp16 asked for on a CPU warns that fp32 runs instead, however it was asked for;
- an update fp16's gradient scaler skips advances neither the scheduler nor the step counters
  (a real ``torch.amp.GradScaler("cpu")`` in a real Accelerator, which skips the update when it
  finds an inf gradient);
- under DeepSpeed, model, optimizer and training loader reach accelerate in one ``prepare`` call;
  clipping by value under DeepSpeed or FSDP is refused before training.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import DeepSpeedPlugin, DistributedType
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import StopTrainingError, TrainerCallback

FP16_WARNING = r"mixed_precision='fp16' was requested, but fp16 does not run on this CPU device: .* full precision \(fp32\)"


@pytest.fixture(autouse=True)
def fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps the precision of the first Accelerator of a process: start each test
    from none, and leave none behind for the tests that run after these."""
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


def make_data(num_samples: int = 64, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, 4, generator=generator)
    return TensorDataset(features, features @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


def make_model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))


def record_inner_dtypes(model: nn.Sequential) -> list[torch.dtype]:
    """The dtype of the first layer's output at every forward pass (accelerate converts the
    model's own outputs back to fp32, so the proof is inside the model)."""
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    return seen


class PrecisionTrainer(Trainer):
    """The third way to set the precision: in code, by overriding ``_create_accelerator``."""

    mixed_precision = "no"

    def _create_accelerator(self) -> Accelerator:
        return Accelerator(mixed_precision=self.mixed_precision)


def precision_trainer(mixed_precision: str, model: nn.Module, lr: float = 0.05) -> Trainer:
    trainer_cls = type(
        f"{mixed_precision.upper()}Trainer", (PrecisionTrainer,), {"mixed_precision": mixed_precision}
    )
    # Built here, not by tests.helpers.make_trainer: the fp16 warning must point at this file.
    return trainer_cls(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=lr), callbacks=())


def fp16_warnings(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in caught if "mixed_precision='fp16' was requested" in str(w.message)]


# ---------------------------------------------------------------- bf16 on the CPU


def test_bf16_on_the_cpu_runs_the_forward_pass_in_bf16_and_trains_like_fp32() -> None:
    losses, dtypes = {}, {}
    for precision in ("no", "bf16"):
        AcceleratorState._reset_state()
        model = make_model()
        dtypes[precision] = record_inner_dtypes(model)
        trainer = precision_trainer(precision, model)
        trainer.train(make_data(), num_epochs=4, eval_dataset=make_data(32, seed=1), per_device_batch_size=8)
        assert trainer.run_config is not None and trainer.run_config.mixed_precision == precision
        losses[precision] = trainer.run_history.get_metric_values("eval_loss_epoch")
    assert set(dtypes["no"]) == {torch.float32} and set(dtypes["bf16"]) == {torch.bfloat16}
    assert losses["bf16"][-1] < 0.2 * losses["bf16"][0]  # it trains...
    # ... and follows fp32 (bf16 keeps 8 bits of mantissa: a few percent per epoch)
    assert losses["bf16"] == pytest.approx(losses["no"], rel=0.1)


def test_after_a_bf16_run_the_users_model_runs_in_bf16_until_unwrapped_without_the_fp32_wrapper() -> None:
    """docs/recipes/precision.md, "Your model after a mixed-precision run"."""
    model = make_model()
    trainer = precision_trainer("bf16", model)
    trainer.train(make_data(16), num_epochs=1, per_device_batch_size=8)
    seen = record_inner_dtypes(model)
    features = torch.randn(2, 4)
    assert model(features).dtype == torch.float32 and seen == [torch.bfloat16]  # patched by accelerate
    assert trainer.get_model() is model  # the same, patched object
    plain = trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    assert plain is model
    model(features)
    assert seen == [torch.bfloat16, torch.float32]  # the plain forward again, in place


# ---------------------------------------------------------------- fp16 where it cannot run


def test_fp16_asked_for_in_code_on_the_cpu_warns_once_that_fp32_runs_instead() -> None:
    model = make_model()
    dtypes = record_inner_dtypes(model)
    with pytest.warns(UserWarning, match=FP16_WARNING) as caught:
        trainer = precision_trainer("fp16", model)
    [warning] = fp16_warnings(list(caught))
    assert "use bf16" in str(warning.message) and "fp16 needs a GPU" in str(warning.message)
    assert warning.filename == __file__  # it points at the line that created the Trainer
    with warnings.catch_warnings(record=True) as during_training:
        warnings.simplefilter("always")
        trainer.train(make_data(16), num_epochs=1, per_device_batch_size=8)
    assert fp16_warnings(during_training) == []  # once per Trainer, not per run or step
    assert set(dtypes) == {torch.float32}  # what the warning says: fp32, no autocast
    assert trainer.accelerator.scaler is None


def test_fp16_from_the_launcher_environment_on_the_cpu_warns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # `accelerate launch --mixed_precision fp16` and `accelerate config` reach the script as this
    # variable; the Trainer's own _create_accelerator reads it through accelerate.
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    model = make_model()
    with pytest.warns(UserWarning, match=FP16_WARNING):
        Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())


def test_bf16_and_fp32_give_no_precision_warning() -> None:
    for precision in ("no", "bf16"):
        AcceleratorState._reset_state()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            precision_trainer(precision, make_model())
        assert fp16_warnings(caught) == []


# ---------------------------------------------------------------- an update the scaler skips


class ScaledFP16Trainer(Trainer):
    """fp16 autocast and a real gradient scaler on the CPU: what accelerate sets up on a GPU,
    which it declines to do on a CPU (it runs fp32 there), so the scaler is set here."""

    def _create_accelerator(self) -> Accelerator:
        accelerator = Accelerator(mixed_precision="fp16")
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        accelerator.native_amp = True  # fp16 autocast in the forward pass, unscaling before clipping
        return accelerator


class UpdateRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.updates: list[tuple[int, int, int]] = []  # (batch, global_step, epoch_step)
        self.batches = 0

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, step: int = 0, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        self.batches += 1
        if is_update_step:
            self.updates.append((step, trainer.progress.global_step, trainer.progress.epoch_step))


def overflowing_data() -> TensorDataset:
    """16 samples; sample 5 is inf, so the window of batches 2-3 (batch size 2, accumulation 2)
    has inf gradients: the scaler skips that update."""
    data = make_data(16)
    data.tensors[0][5] = float("inf")
    return data


def train_with_overflow(max_num_train_steps: int | None) -> tuple[Trainer, UpdateRecorder, list[torch.dtype]]:
    model = make_model()
    dtypes = record_inner_dtypes(model)
    recorder = UpdateRecorder()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = ScaledFP16Trainer(model, nn.MSELoss(), optimizer, callbacks=[recorder])
    trainer.train(
        overflowing_data(),
        num_epochs=1,
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        max_num_train_steps=max_num_train_steps,
        create_scheduler_fn=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
        train_dataloader_kwargs={"shuffle": False},
    )
    return trainer, recorder, dtypes


def test_an_update_the_fp16_scaler_skips_advances_neither_the_scheduler_nor_the_step_counters() -> None:
    trainer, recorder, dtypes = train_with_overflow(max_num_train_steps=None)
    assert set(dtypes) == {torch.float16}  # the forward pass ran under fp16 autocast
    assert trainer.accelerator.scaler.get_scale() == 2.0**9  # the scaler found the inf and halved
    # 4 windows of 2 batches, the second skipped: 3 updates, each counted and announced once
    assert trainer.progress.global_step == 3 and recorder.batches == 8
    assert recorder.updates == [(1, 1, 1), (5, 2, 2), (7, 3, 3)]  # (batch, global_step, epoch_step)
    assert trainer.scheduler.last_epoch == 3 and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(
        0.01 * 0.5**3
    )
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_max_num_train_steps_counts_updates_that_were_applied() -> None:
    # 2 updates asked for, the second window skipped: the run goes on one window more, to
    # batch 5 (without the skip it would stop after batch 3)
    trainer, recorder, _ = train_with_overflow(max_num_train_steps=2)
    assert trainer.progress.global_step == 2 and recorder.batches == 6
    assert [batch for batch, *_ in recorder.updates] == [1, 5]


# ---------------------------------------------------------------- DeepSpeed and FSDP pass-through


class EngineReportingAccelerator(Accelerator):
    """A real one-process CPU Accelerator that reports ``engine`` as its distributed type, as one
    configured for DeepSpeed or FSDP does (neither can run here), and records the objects of every
    ``prepare`` call; preparing itself is done as on the CPU."""

    def __init__(self, engine: DistributedType, plugin: DeepSpeedPlugin | None = None) -> None:
        self.engine, self.plugin, self.reporting, self.prepare_calls = engine, plugin, False, []
        super().__init__(cpu=True)
        self.reporting = True

    @property
    def distributed_type(self) -> DistributedType:
        return self.engine if self.reporting else super().distributed_type

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        return self.plugin

    def prepare(self, *args: Any, device_placement: Any = None) -> Any:
        self.prepare_calls.append(args)
        self.reporting = False
        try:
            return super().prepare(*args, device_placement=device_placement)
        finally:
            self.reporting = True


def engine_trainer(
    engine: DistributedType, callbacks: Any = (), plugin: DeepSpeedPlugin | None = None
) -> Trainer:
    class EngineTrainer(Trainer):
        def _create_accelerator(self) -> Accelerator:
            return EngineReportingAccelerator(engine, plugin)

    model = make_model()
    return EngineTrainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters()), callbacks=callbacks)


class StopAfterSetUp(TrainerCallback):
    """Stops the run once set-up (preparation included) is done: the engine cannot train here."""

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        raise StopTrainingError("set-up done")


def test_under_deepspeed_model_optimizer_and_train_loader_go_to_one_prepare_call() -> None:
    trainer = engine_trainer(DistributedType.DEEPSPEED, callbacks=[StopAfterSetUp()])
    model, optimizer = trainer.model, trainer.optimizer
    train_data, eval_data = make_data(16), make_data(8, seed=1)
    trainer.train(train_data, num_epochs=1, eval_dataset=eval_data, per_device_batch_size=4)
    first, *others = trainer.accelerator.prepare_calls
    assert first[0] is model and first[1] is optimizer and len(first) == 3
    # the training loader, unprepared, with the integer batch size DeepSpeed reads
    assert type(first[2]) is DataLoader and first[2].dataset is train_data and first[2].batch_size == 4
    # nothing of those three is prepared again; the evaluation loader is prepared on its own
    assert all(obj not in (model, optimizer, first[2]) for call in others for obj in call)
    assert trainer.model is not model or trainer.optimizer is not optimizer  # what prepare returned is kept


def test_without_an_engine_model_and_optimizer_are_prepared_one_by_one() -> None:
    # The same recording, reporting plain one-process training: the DeepSpeed test can fail.
    trainer = engine_trainer(DistributedType.NO, callbacks=[StopAfterSetUp()])
    model, optimizer = trainer.model, trainer.optimizer
    trainer.train(make_data(16), num_epochs=1, per_device_batch_size=4)
    assert [call for call in trainer.accelerator.prepare_calls][:2] == [(model,), (optimizer,)]


@pytest.mark.parametrize(
    ("engine", "fix"),
    [
        (DistributedType.DEEPSPEED, r"set the norm in the DeepSpeed config \(gradient_clipping: 1.0"),
        (DistributedType.FSDP, r"train\(max_grad_norm=1.0, ...\) in place of gradient_clip_value"),
    ],
)
def test_clipping_by_value_under_deepspeed_or_fsdp_is_refused_before_training(
    engine: DistributedType, fix: str
) -> None:
    trainer = engine_trainer(engine)
    name = "DeepSpeed" if engine == DistributedType.DEEPSPEED else "FSDP"
    with pytest.raises(
        ValueError,
        match=rf"gradient_clip_value=0.5 clips each gradient element, which accelerate does not support under {name}.*{fix}",
    ):
        trainer.train(make_data(16), num_epochs=1, per_device_batch_size=4, gradient_clip_value=0.5)
    assert trainer.accelerator.prepare_calls == [] and trainer.progress.global_step == 0  # before any set-up
    with pytest.raises(
        Exception, match="do not support `clip_grad_value_`"
    ):  # what accelerate would do later
        trainer.accelerator.clip_grad_value_(trainer.model.parameters(), 0.5)


@pytest.mark.parametrize(
    ("in_train", "in_config"),
    [(2, None), (1, 4)],
    ids=["train(gradient_accumulation_steps=2)", "gradient_accumulation_steps: 4 in the DeepSpeed config"],
)
def test_gradient_accumulation_under_deepspeed_is_refused_before_training(
    in_train: int, in_config: int | None
) -> None:
    # accelerate would mark every batch as a window's end for DeepSpeed's engine: it would
    # update after every batch, silently. (A real DeepSpeedPlugin: it needs no deepspeed.)
    plugin = (
        None if in_config is None else DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=in_config)
    )
    trainer = engine_trainer(DistributedType.DEEPSPEED, plugin=plugin)
    with pytest.raises(
        ValueError,
        match=rf"Gradient accumulation is not supported under DeepSpeed \(train\(gradient_accumulation_steps="
        rf"{in_train}\), DeepSpeed config gradient_accumulation_steps={in_config}\).*Set gradient_accumulation_steps to 1 in both",
    ):
        trainer.train(
            make_data(16), num_epochs=1, per_device_batch_size=4, gradient_accumulation_steps=in_train
        )
    assert trainer.accelerator.prepare_calls == []


def test_deepspeed_without_accumulation_is_accepted() -> None:
    plugin = DeepSpeedPlugin(zero_stage=3, gradient_accumulation_steps=1)
    trainer = engine_trainer(DistributedType.DEEPSPEED, callbacks=[StopAfterSetUp()], plugin=plugin)
    trainer.train(make_data(16), num_epochs=1, per_device_batch_size=4, max_grad_norm=1.0)
    assert len(trainer.accelerator.prepare_calls[0]) == 3
