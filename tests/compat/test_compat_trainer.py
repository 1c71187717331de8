"""The Trainer of pytorch-accelerated 0.1.61 keeps working (docs/migration.md): gather, the
run-config max, dataloader kwargs, the optimizer type, and ``evaluate()`` on a fresh Trainer
setting ``run_config``.

Each is exercised in 0.1.61's form, and ours too where both are accepted. The 2-process cases
(the gather example of docs/migration.md, the eval batch size with P = 2, the metric callback on an
evaluation-only Trainer) are in tests/distributed/test_eval_exactly_once.py, which launches once.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torchmetrics
from accelerate import Accelerator
from accelerate.utils.deepspeed import DummyOptim
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_accelerated.loaders as loaders_module
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback


def regression_data(num_samples: int, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    return TensorDataset(
        torch.randn(num_samples, 3, generator=generator), torch.randn(num_samples, 1, generator=generator)
    )


def make_trainer(
    optimizer: Any = "sgd", callbacks: Any = (), trainer_cls: type[Trainer] = Trainer
) -> Trainer:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    if optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    elif callable(optimizer):
        optimizer = optimizer(model)
    return trainer_cls(model, nn.MSELoss(), optimizer, callbacks=callbacks)


# ---------------------------------------------------------------- gather(t, padding_value=None)


def test_gather_with_padding_value_strips_padding_rows_and_1d_padding_elements() -> None:
    trainer = make_trainer()
    rows = torch.tensor([[1, 2], [-1, -1], [3, -1]])
    assert trainer.gather(rows, padding_value=-1).tolist() == [[1, 2], [3, -1]]  # only all-padding rows go
    assert trainer.gather(torch.tensor([4, -1, 5]), padding_value=-1).tolist() == [4, 5]


def test_gather_without_padding_value_keeps_every_row() -> None:
    trainer = make_trainer()
    rows = torch.tensor([[1, 2], [-1, -1]])
    assert trainer.gather(rows).tolist() == [[1, 2], [-1, -1]]


# ---------------------------------------------------------------- run config: max_num_train_steps


def test_run_config_reports_max_num_train_steps_as_epochs_times_updates_when_not_given() -> None:
    trainer = make_trainer()
    trainer.train(regression_data(40), num_epochs=3, per_device_batch_size=8, gradient_accumulation_steps=2)
    config = trainer.run_config
    assert (
        config.num_update_steps_per_epoch == 3 == config.num_local_update_steps_per_epoch
    )  # ours: ceil(5 / 2)
    assert config.max_num_train_steps == 9  # the original's epochs * steps, without its + 1
    assert trainer.progress.global_step == 9


def test_a_given_max_num_train_steps_is_reported_and_stops_the_run() -> None:
    trainer = make_trainer()
    trainer.train(regression_data(40), num_epochs=3, per_device_batch_size=8, max_num_train_steps=4)
    assert trainer.run_config.max_num_train_steps == 4
    assert trainer.progress.global_step == 4


def test_the_reported_max_does_not_stop_a_run_whose_loader_a_callback_lengthens() -> None:
    class LongerLoader(TrainerCallback):
        def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
            trainer.train_dataloader = DataLoader(regression_data(32), batch_size=8)

    trainer = make_trainer(callbacks=[LongerLoader()])
    trainer.train(regression_data(16), num_epochs=1, per_device_batch_size=8)
    assert trainer.run_config.max_num_train_steps == 2  # reported: 1 epoch x 2 updates
    assert trainer.progress.global_step == 4  # our step counts are unchanged: the epoch runs to its end


# ---------------------------------------------------------------- dataloader kwargs


def test_run_config_stores_the_merged_dataloader_kwargs() -> None:
    trainer = make_trainer()
    trainer.train(
        regression_data(16),
        num_epochs=1,
        eval_dataset=regression_data(8),
        per_device_batch_size=4,
        train_dataloader_kwargs={"drop_last": True},
        eval_dataloader_kwargs={"batch_size": 2},
    )
    train_kwargs, eval_kwargs = trainer.run_config.train_dl_kwargs, trainer.run_config.eval_dl_kwargs
    assert {"batch_size": 4, "shuffle": True, "drop_last": True}.items() <= train_kwargs.items()
    assert {"batch_size": 2, "shuffle": False}.items() <= eval_kwargs.items()
    assert {"num_workers", "pin_memory"} <= train_kwargs.keys() & eval_kwargs.keys()  # the defaults


def test_eval_batch_size_kwarg_wins_on_one_process() -> None:
    # The eval batch size of docs/migration.md on P = 1: eval batch 64, per-device 64, total 64
    # (128 on P = 2).
    sizes: list[int] = []

    class RecordEvalBatchSizes(TrainerCallback):
        def on_eval_step_end(self, trainer: Any, batch: Any, **kwargs: Any) -> None:
            sizes.append(len(batch[0]))

    trainer = make_trainer(callbacks=[RecordEvalBatchSizes()])
    trainer.train(
        regression_data(32),
        num_epochs=1,
        eval_dataset=regression_data(64),
        per_device_batch_size=16,
        eval_dataloader_kwargs={"batch_size": 64},
    )
    assert sizes == [64]
    config = trainer.run_config
    assert (config.eval_per_device_batch_size, config.eval_total_batch_size) == (64, 64)
    assert config.train_per_device_batch_size == 16


def test_loaders_are_built_with_dataset_by_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class RecordingDataLoader(DataLoader):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append((args, kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loaders_module, "DataLoader", RecordingDataLoader)
    train_data, eval_data = regression_data(8), regression_data(4)
    make_trainer().train(train_data, num_epochs=1, eval_dataset=eval_data, per_device_batch_size=4)
    assert [args for args, _ in calls] == [(), ()]
    assert [kwargs["dataset"] for _, kwargs in calls] == [train_data, eval_data]
    assert all("collate_fn" in kwargs for _, kwargs in calls)


# ---------------------------------------------------------------- optimizer type and prepare


class RecordingAccelerator(Accelerator):
    """The real Accelerator; it records what each ``prepare`` call was given."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prepare_calls: list[tuple[type, ...]] = []

    def prepare(self, *args: Any, **kwargs: Any) -> Any:
        self.prepare_calls.append(tuple(type(arg) for arg in args))
        return super().prepare(*args, **kwargs)


class RecordingTrainer(Trainer):
    def _create_accelerator(self) -> Accelerator:
        return RecordingAccelerator()


class DuckOptimizer:
    """Not a torch optimizer: only ``step`` and ``zero_grad``, over SGD."""

    def __init__(self, model: nn.Module) -> None:
        self.inner = torch.optim.SGD(model.parameters(), lr=0.1)
        self.steps = 0

    def step(self) -> None:
        self.steps += 1
        self.inner.step()

    def zero_grad(self) -> None:
        self.inner.zero_grad()


def test_dummy_optim_goes_to_one_prepare_call_with_model_and_train_loader() -> None:
    # DeepSpeed with the optimizer in its config: DummyOptim is accepted, and model, optimizer and
    # the training loader reach accelerate in ONE prepare call (DeepSpeed reads the batch size there).
    trainer = make_trainer(lambda model: DummyOptim(model.parameters()), trainer_cls=RecordingTrainer)
    with pytest.raises(AttributeError, match="DummyOptim"):  # no DeepSpeed engine here to step it
        trainer.train(
            regression_data(8), num_epochs=1, eval_dataset=regression_data(4), per_device_batch_size=4
        )
    calls = trainer.accelerator.prepare_calls
    assert calls[0][:2] == (nn.Linear, DummyOptim) and issubclass(calls[0][2], DataLoader)
    assert all(nn.Linear not in call and DummyOptim not in call for call in calls[1:])


def test_a_plain_optimizer_keeps_separate_prepare_calls_and_the_direct_step_path() -> None:
    trainer = make_trainer(trainer_cls=RecordingTrainer)
    optimizer = trainer.optimizer
    trainer.train(regression_data(8), num_epochs=1, per_device_batch_size=4)
    calls = trainer.accelerator.prepare_calls
    assert calls[:2] == [(nn.Linear,), (torch.optim.SGD,)]
    assert trainer.optimizer is optimizer  # stepped directly, not through accelerate's wrapper


def test_an_object_with_step_and_zero_grad_is_accepted_as_optimizer() -> None:
    trainer = make_trainer(DuckOptimizer)
    trainer.train(regression_data(16), num_epochs=2, per_device_batch_size=8)
    assert trainer.optimizer.steps == 4


def test_anything_else_as_optimizer_is_a_type_error_naming_the_accepted_kinds() -> None:
    with pytest.raises(
        TypeError,
        match=r"optimizer must be a torch.optim.Optimizer, accelerate's DummyOptim .* "
        r"step\(\) and zero_grad\(\) methods, got object",
    ):
        make_trainer(lambda model: object())


# ---------------------------------------------------------------- evaluate() on a fresh Trainer


class MetricCallback(TrainerCallback):
    """The original's metric callback: torchmetrics updated with gathered rows, computed and
    printed on the world main process, read from ``trainer.run_config``."""

    def __init__(self) -> None:
        self.metric = torchmetrics.MeanSquaredError()
        self.results: list[float] = []

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: Any, **kwargs: Any) -> None:
        self.metric.update(
            trainer.gather_for_metrics(batch_output["model_outputs"]), trainer.gather_for_metrics(batch[1])
        )

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.run_config.is_world_process_zero:
            self.results.append(self.metric.compute().item())
            trainer.print(f"mse: {self.results[-1]}")
        self.metric.reset()


def test_evaluate_on_a_fresh_trainer_sets_run_config_for_the_metric_callback_pattern() -> None:
    metric = MetricCallback()
    trainer = make_trainer(optimizer=None, callbacks=[metric])
    data = regression_data(10)
    metrics = trainer.evaluate(data, per_device_batch_size=4)
    config = trainer.run_config
    assert config is not None and config.evaluation_only and config.is_world_process_zero
    assert (config.eval_per_device_batch_size, config.eval_total_batch_size, config.num_processes) == (
        4,
        4,
        1,
    )
    assert config.max_num_train_steps is None and config.num_update_steps_per_epoch is None
    with torch.no_grad():
        expected = nn.functional.mse_loss(trainer.model(data.tensors[0]), data.tensors[1]).item()
    assert metric.results == [pytest.approx(expected)]
    assert metrics["evaluation_loss"] == pytest.approx(expected)
    trainer.evaluate(data, dataloader_kwargs={"batch_size": 5})  # a later evaluation gets its own config
    assert trainer.run_config.eval_per_device_batch_size == 5


def test_evaluate_after_train_keeps_the_training_runs_config() -> None:
    trainer = make_trainer(callbacks=[MetricCallback()])
    trainer.train(regression_data(16), num_epochs=2, per_device_batch_size=8)
    training_config = trainer.run_config
    trainer.evaluate(regression_data(10), per_device_batch_size=4)
    assert trainer.run_config is training_config and not training_config.evaluation_only


# ---------------------------------------------------------------- scheduler_step


class StepsTheScheduler(Trainer):
    """0.1.61's pattern: an override that assumes a scheduler exists, as the loop only called
    it then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scheduler_steps = 0

    def scheduler_step(self) -> None:
        self.scheduler.step()
        self.scheduler_steps += 1


def test_an_override_of_scheduler_step_without_a_scheduler_is_never_called() -> None:
    trainer = make_trainer(trainer_cls=StepsTheScheduler)
    trainer.train(regression_data(8), num_epochs=2, per_device_batch_size=4)  # no AttributeError
    assert trainer.progress.global_step == 4 and trainer.scheduler_steps == 0


def test_an_override_of_scheduler_step_runs_once_per_update_with_a_scheduler() -> None:
    trainer = make_trainer(trainer_cls=StepsTheScheduler)
    trainer.train(
        regression_data(8),
        num_epochs=2,
        per_device_batch_size=4,
        create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.StepLR(
            optimizer, step_size=1, gamma=0.5
        ),
    )
    assert trainer.scheduler_steps == 4
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.5**4)
