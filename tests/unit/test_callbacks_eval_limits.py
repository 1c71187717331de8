"""StepBasedEvaluationCallback, LimitEvalStepsCallback, LimitBatchesCallback and LimitBatches, on real runs."""

from __future__ import annotations

import doctest
import os
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.callbacks.evaluation import LimitEvalStepsCallback, StepBasedEvaluationCallback
from pytorch_accelerated.callbacks.limits import LimitBatchesCallback, limit_batches_callback_from_env
from pytorch_accelerated.utils import LimitBatches
from tests.helpers import IndexedDataset, make_regression_data

ENV = "PT_ACC_LIMIT_BATCHES"
TRAIN, EVAL = make_regression_data(40, seed=0), make_regression_data(40, seed=1)  # 10 batches of 4 each


class Probe(TrainerCallback):
    """Records each evaluation (when, on what, how long) and the model's mode after one."""

    def __init__(self) -> None:
        self.evals: list[dict[str, Any]] = []
        self.train_indices: dict[int, list[int]] = {}
        self.after_intermediate: list[tuple[bool, bool]] = []  # (model.training, dropout differs)
        self._check_next_step = False

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        if self._check_next_step:
            x = EVAL.tensors[0][:8]
            with torch.no_grad():
                differs = not torch.equal(trainer.model(x), trainer.model(x))
            self.after_intermediate.append((trainer.model.training, differs))
            self._check_next_step = False

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if len(batch) == 3:
            self.train_indices.setdefault(trainer.progress.epoch, []).extend(batch[2].tolist())

    def on_eval_epoch_start(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        x, y = EVAL.tensors
        with torch.no_grad():  # plain-PyTorch oracle: the mean loss over the whole set, now
            expected = nn.functional.mse_loss(trainer.model(x), y).item()
        self.evals.append(
            dict(
                intermediate=is_intermediate,
                step=trainer.progress.global_step,
                batch_index=trainer.progress.batch_index,
                training=trainer.model.training,
                expected_loss=expected,
                num_batches=0,
            )
        )

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        self.evals[-1]["num_batches"] += 1

    def on_eval_epoch_end(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        assert self.evals[-1]["intermediate"] == is_intermediate
        self._check_next_step = is_intermediate

    def counts(self, intermediate: bool) -> list[int]:
        return [e["num_batches"] for e in self.evals if e["intermediate"] == intermediate]


def make_trainer(*callbacks: TrainerCallback) -> tuple[Trainer, Probe]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.5), nn.Linear(16, 1))
    probe = Probe()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(*callbacks, probe)
    )
    return trainer, probe


def test_step_based_evaluation_runs_after_every_nth_update_and_records_loss_and_step() -> None:
    trainer, probe = make_trainer(StepBasedEvaluationCallback(3))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4)
    intermediate = [e for e in probe.evals if e["intermediate"]]
    assert [e["step"] for e in intermediate] == [3, 6, 9, 12, 15, 18]
    history = trainer.run_history
    assert history.get_metric_values("intermediate_eval_step") == [3, 6, 9, 12, 15, 18]
    losses = history.get_metric_values("intermediate_eval_loss")
    assert losses == pytest.approx([e["expected_loss"] for e in intermediate], rel=1e-5)
    assert len(history.get_metric_values("eval_loss_epoch")) == 2  # epoch-end evaluations only
    assert all(not e["training"] for e in probe.evals)  # evaluated in eval mode


def test_step_based_evaluation_with_accumulation_fires_once_per_update_not_per_batch() -> None:
    trainer, probe = make_trainer(StepBasedEvaluationCallback(2))
    # 10 batches, windows of 3 -> updates after batches 3, 6, 9 and 10 of each epoch.
    trainer.train(
        TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4, gradient_accumulation_steps=3
    )
    intermediate = [(e["step"], e["batch_index"]) for e in probe.evals if e["intermediate"]]
    assert intermediate == [(2, 6), (4, 10), (6, 6), (8, 10)]


def test_model_is_back_in_train_mode_with_dropout_after_an_intermediate_evaluation() -> None:
    trainer, probe = make_trainer(StepBasedEvaluationCallback(4))
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL, per_device_batch_size=4)
    # Evaluations after updates 4 and 8; each is followed by a training step (the 5th, the 9th).
    assert probe.after_intermediate == [(True, True), (True, True)]


def test_step_based_evaluation_without_eval_dataset_fails_at_run_start_naming_the_fix() -> None:
    trainer, probe = make_trainer(StepBasedEvaluationCallback(2))
    with pytest.raises(ValueError, match=r"no evaluation set\. Pass train\(\.\.\., eval_dataset=\.\.\.\)"):
        trainer.train(TRAIN, num_epochs=1, per_device_batch_size=4)
    assert trainer.progress.global_step == 0


def test_limit_eval_steps_shortens_only_intermediate_evaluations_by_default() -> None:
    trainer, probe = make_trainer(LimitEvalStepsCallback(2), StepBasedEvaluationCallback(5))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4)
    trainer.evaluate(EVAL, per_device_batch_size=4)
    assert probe.counts(intermediate=True) == [2, 2, 2, 2]
    assert probe.counts(intermediate=False) == [10, 10, 10]  # two epoch ends, then evaluate()
    assert len(trainer.eval_dataloader) == 10  # the full loader is back


def test_limit_eval_steps_for_every_evaluation_when_asked() -> None:
    trainer, probe = make_trainer(
        LimitEvalStepsCallback(3, limit_intermediate_only=False), StepBasedEvaluationCallback(5)
    )
    trainer.train(TRAIN, num_epochs=1, eval_dataset=EVAL, per_device_batch_size=4)
    trainer.evaluate(EVAL, per_device_batch_size=4)
    assert probe.counts(intermediate=True) == [3, 3]
    assert probe.counts(intermediate=False) == [3, 3]


def test_limit_batches_limits_training_and_evaluation_and_restores_the_loaders() -> None:
    trainer, probe = make_trainer(LimitBatchesCallback(3), StepBasedEvaluationCallback(2))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4)
    assert trainer.progress.global_step == 6
    assert probe.counts(intermediate=False) == [3, 3]
    assert probe.counts(intermediate=True) == [3, 3, 3]  # after updates 2, 4 and 6
    assert (len(trainer.train_dataloader), len(trainer.eval_dataloader)) == (10, 10)


def test_limit_batches_takes_different_shuffled_batches_each_epoch() -> None:
    trainer, probe = make_trainer(LimitBatchesCallback(2))
    trainer.train(IndexedDataset(TRAIN), num_epochs=3, per_device_batch_size=4)
    epochs = [sorted(probe.train_indices[epoch]) for epoch in range(3)]
    assert all(len(indices) == 8 for indices in epochs)
    assert epochs[0] != epochs[1] != epochs[2]


@pytest.mark.parametrize("limit_first", [True, False])
def test_limit_batches_and_limit_eval_steps_together_apply_the_smaller_limit(limit_first: bool) -> None:
    limits: list[TrainerCallback] = [LimitBatchesCallback(4), LimitEvalStepsCallback(2)]
    trainer, probe = make_trainer(*(limits if limit_first else limits[::-1]), StepBasedEvaluationCallback(3))
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4)
    assert probe.counts(intermediate=True) == [2, 2]
    assert probe.counts(intermediate=False) == [4, 4]
    assert len(trainer.eval_dataloader) == 10


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: StepBasedEvaluationCallback(0),
            "StepBasedEvaluationCallback: eval_every_n_steps must be a whole number >= 1, got 0.",
        ),
        (
            lambda: StepBasedEvaluationCallback(2.5),
            "eval_every_n_steps must be a whole number >= 1, got 2.5.",
        ),
        (
            lambda: LimitEvalStepsCallback(-1),
            "LimitEvalStepsCallback: num_eval_steps must be a whole number >= 1, got -1.",
        ),
        (
            lambda: LimitBatchesCallback(0),
            "LimitBatchesCallback: num_batches must be a whole number >= 1, got 0.",
        ),
        (lambda: LimitBatches(True), "LimitBatches: num_batches must be a whole number >= 1, got True."),
    ],
)
def test_bad_arguments_raise_a_clear_value_error(make: Any, message: str) -> None:
    with pytest.raises(ValueError) as error:
        make()
    assert message in str(error.value)


def test_limit_eval_steps_rejects_a_non_bool_limit_intermediate_only() -> None:
    with pytest.raises(TypeError, match="limit_intermediate_only to be True or False, got 'yes'"):
        LimitEvalStepsCallback(2, limit_intermediate_only="yes")  # type: ignore[arg-type]


def test_limit_batches_sets_the_variable_inside_and_restores_the_previous_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV, raising=False)
    with LimitBatches(3):
        assert os.environ[ENV] == "3"
        with pytest.raises(RuntimeError), LimitBatches(1):
            assert os.environ[ENV] == "1"
            raise RuntimeError("boom")
        assert os.environ[ENV] == "3"
    assert ENV not in os.environ
    monkeypatch.setenv(ENV, "7")
    with LimitBatches(2):
        assert limit_batches_callback_from_env().num_batches == 2  # type: ignore[union-attr]
    assert os.environ[ENV] == "7"


def test_limit_batches_docstring_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(LimitBatches):
        runner.run(test)
    assert runner.summarize(verbose=False) == (0, 3)


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_limit_batches_variable_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(ENV, value)
    with pytest.raises(
        ValueError, match=rf"{ENV} \(batches per epoch\) must be a whole number >= 1, got '{value}'"
    ):
        limit_batches_callback_from_env()
    monkeypatch.delenv(ENV)
    assert limit_batches_callback_from_env() is None


def test_trainer_created_under_limit_batches_runs_limited_epochs_and_says_so_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with LimitBatches(2):
        trainer, probe = make_trainer()
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=4)
    assert trainer.progress.global_step == 4
    assert probe.counts(intermediate=False) == [2, 2]
    assert capsys.readouterr().out.count(ENV) == 1


def test_callbacks_are_importable_from_the_callbacks_package() -> None:
    from pytorch_accelerated import callbacks

    assert callbacks.StepBasedEvaluationCallback is StepBasedEvaluationCallback
    assert callbacks.LimitEvalStepsCallback is LimitEvalStepsCallback
    assert callbacks.LimitBatchesCallback is LimitBatchesCallback
    assert hasattr(callbacks, "ConvertSyncBatchNormCallback")
