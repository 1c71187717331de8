"""OptunaPruningCallback on real one-process runs with real Optuna studies: what it reports and
when, pruning, step-based evaluation, order among callbacks, no work on updates that do not
evaluate, bad input; and the package without optuna (a fresh interpreter that hides it)."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from pytorch_accelerated.callbacks import (
    OptunaPruningCallback,
    SaveTrainingStateCallback,
    StepBasedEvaluationCallback,
    TrainerCallback,
)
from pytorch_accelerated.trainer import Trainer
from tests.helpers import REPO_ROOT, make_regression_data, make_trainer, subprocess_env

optuna = pytest.importorskip("optuna")

make_trainer = functools.partial(make_trainer, lr=0.05)
TRAIN, EVAL = make_regression_data(64, seed=1), make_regression_data(32, seed=2)


def new_trial(pruner: Any = None) -> tuple[Any, Any]:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=pruner or optuna.pruners.NopPruner())
    return study, study.ask()


def train(trainer: Trainer, num_epochs: int = 4) -> None:
    trainer.train(TRAIN, num_epochs=num_epochs, eval_dataset=EVAL, per_device_batch_size=8)


def test_each_epoch_s_evaluation_is_reported_at_the_epoch_counted_from_zero() -> None:
    study, trial = new_trial()
    trainer = make_trainer((OptunaPruningCallback(trial),))
    train(trainer)
    reported = study.trials[0].intermediate_values
    assert reported == dict(enumerate(trainer.run_history.get_metric_values("eval_loss_epoch")))
    assert list(reported) == [0, 1, 2, 3]


def test_a_pruned_trial_ends_train_with_trial_pruned_after_that_epoch_s_evaluation() -> None:
    # ThresholdPruner prunes once a value passes `upper`, after its warm-up steps (0 and 1 here).
    study, trial = new_trial(optuna.pruners.ThresholdPruner(upper=0.0, n_warmup_steps=2))
    trainer = make_trainer((OptunaPruningCallback(trial),))
    with pytest.raises(optuna.TrialPruned, match=r"pruned at step 2: eval_loss_epoch = [0-9.]+") as raised:
        train(trainer, num_epochs=6)
    assert "raised in callback OptunaPruningCallback.on_training_run_epoch_end" in getattr(
        raised.value, "__notes__", []
    )
    # Three epochs ran (8 updates each), and no update after the third epoch's evaluation.
    assert (
        trainer.progress.global_step == 24
        and len(trainer.run_history.get_metric_values("eval_loss_epoch")) == 3
    )
    assert list(study.trials[0].intermediate_values) == [0, 1, 2]


def test_study_optimize_records_the_pruned_trial_with_its_last_value() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(pruner=optuna.pruners.ThresholdPruner(upper=0.0, n_warmup_steps=1))

    def objective(trial: Any) -> float:
        trainer = make_trainer((OptunaPruningCallback(trial),))
        train(trainer)
        return trainer.run_history.get_latest_metric("eval_loss_epoch")

    study.optimize(objective, n_trials=1)
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.PRUNED and trial.value == trial.intermediate_values[1]


# ---------------------------------------------------------------------------- resume_from="auto"


class FailsAt(TrainerCallback):
    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == 3:
            raise RuntimeError("a real failure at update 3")


def auto_trial(folder: Path, *extra: TrainerCallback) -> type[BaseException] | None:
    """One launch of a trial pruned after its second evaluation (update 16), saving into ``folder``
    with ``resume_from="auto"``; what it raised."""
    _, trial = new_trial(optuna.pruners.ThresholdPruner(upper=0.0, n_warmup_steps=1))
    trainer = make_trainer((OptunaPruningCallback(trial), SaveTrainingStateCallback(folder), *extra))
    try:
        trainer.train(TRAIN, num_epochs=6, eval_dataset=EVAL, per_device_batch_size=8, resume_from="auto")
    except Exception as error:  # noqa: BLE001 (what each launch ends with is the result)
        return type(error)
    return None


def test_a_pruned_trial_under_auto_resume_is_no_failure_however_often_it_is_launched(tmp_path: Path) -> None:
    folder = tmp_path / "trial"
    outcomes = [auto_trial(folder) for _ in range(3)]
    assert outcomes == [optuna.TrialPruned] * 3  # before: the third launch was a RepeatedFailureError
    assert not (folder / ".failures").exists()


def test_a_pruned_trial_clears_the_record_of_an_earlier_real_failure(tmp_path: Path) -> None:
    folder = tmp_path / "trial"
    assert auto_trial(folder, FailsAt()) is RuntimeError
    assert (folder / ".failures" / "rank0.json").is_file()  # a real failure is recorded
    assert auto_trial(folder) is optuna.TrialPruned  # it got past update 3: the run ended on purpose
    assert not (folder / ".failures").exists()


class RecordsAccuracy(TrainerCallback):
    """A metric recorded at the end of every evaluation, as a torchmetrics callback would."""

    def on_eval_epoch_end(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        trainer.run_history.update_metric("accuracy", float(trainer.progress.global_step))


@pytest.mark.parametrize("pruning_first", [True, False])
def test_a_metric_another_callback_records_at_the_evaluation_s_end_is_reported_whatever_the_order(
    pruning_first: bool,
) -> None:
    study, trial = new_trial()
    callbacks = [OptunaPruningCallback(trial, monitor="accuracy"), RecordsAccuracy()]
    train(make_trainer(tuple(callbacks if pruning_first else reversed(callbacks))), num_epochs=2)
    assert study.trials[0].intermediate_values == {0: 8.0, 1: 16.0}


@pytest.mark.parametrize("pruning_first", [True, False])
def test_with_step_based_evaluation_the_step_is_the_update_count(pruning_first: bool) -> None:
    study, trial = new_trial()
    callbacks = [
        OptunaPruningCallback(trial, monitor="intermediate_eval_loss"),
        StepBasedEvaluationCallback(3),
    ]
    trainer = make_trainer(tuple(callbacks if pruning_first else reversed(callbacks)))
    train(trainer, num_epochs=2)  # 8 updates per epoch: evaluations after updates 3, 6, 9, 12, 15
    history = trainer.run_history
    assert study.trials[0].intermediate_values == dict(
        zip(
            history.get_metric_values("intermediate_eval_step"),
            history.get_metric_values("intermediate_eval_loss"),
            strict=True,
        )
    )
    assert list(study.trials[0].intermediate_values) == [3, 6, 9, 12, 15]


def test_with_step_based_evaluation_the_epoch_s_evaluation_is_reported_at_its_update_count() -> None:
    study, trial = new_trial()
    trainer = make_trainer((OptunaPruningCallback(trial), StepBasedEvaluationCallback(5)))
    train(trainer, num_epochs=2)
    assert list(study.trials[0].intermediate_values) == [8, 16]


class CountsAgreements(Trainer):
    agreements = 0

    def any_process(self, flag: Any) -> bool:
        CountsAgreements.agreements += 1
        return super().any_process(flag)


class RecordsTorchCalls(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class WatchedPruning(OptunaPruningCallback):
    """The callback, its per-batch events run under a recorder of every torch call they make."""

    def __init__(self, trial: Any) -> None:
        super().__init__(trial)
        self.per_batch_calls: list[str] = []

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        with RecordsTorchCalls() as recorder:
            super().on_train_step_start(trainer, **kwargs)
        self.per_batch_calls += recorder.calls


def test_updates_that_do_not_evaluate_cost_no_torch_call_and_no_agreement() -> None:
    _, trial = new_trial()
    pruning = WatchedPruning(trial)
    CountsAgreements.agreements = 0
    trainer = make_trainer((pruning,), trainer_class=CountsAgreements)
    train(trainer, num_epochs=3)
    assert pruning.per_batch_calls == []
    assert CountsAgreements.agreements == 3  # one per evaluation


def test_a_monitor_that_is_not_recorded_is_an_error_naming_the_metrics_there_are() -> None:
    _, trial = new_trial()
    with pytest.raises(
        ValueError,
        match=r"OptunaPruningCallback\(monitor='eval_los'\): the run history has no metric of that name after "
        r"an evaluation; it has \['eval_loss_epoch', 'train_loss_epoch'\]\. Pass one of these as monitor",
    ):
        train(make_trainer((OptunaPruningCallback(trial, monitor="eval_los"),)))


def test_a_run_without_evaluation_set_is_refused_at_its_start() -> None:
    _, trial = new_trial()
    trainer = make_trainer((OptunaPruningCallback(trial),))
    with pytest.raises(
        ValueError, match=r"reports a metric after each evaluation, but this run has no evaluation set"
    ):
        trainer.train(TRAIN, num_epochs=1, per_device_batch_size=8)


def test_the_main_process_needs_the_trial() -> None:
    trainer = make_trainer((OptunaPruningCallback(None),))
    with pytest.raises(ValueError, match=r"has trial=None on the main process, which reports to the study"):
        train(trainer, num_epochs=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trial": "trial-3"}, r"takes the optuna trial passed to your objective .* got 'trial-3' \(str\)"),
        ({"trial": None, "monitor": ""}, r"takes the name of a metric of the run history, .* got ''"),
    ],
)
def test_bad_arguments_are_refused_when_the_callback_is_made(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        OptunaPruningCallback(**kwargs)


def test_a_value_that_is_not_a_number_is_an_error_saying_so() -> None:
    class RecordsText(TrainerCallback):
        def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
            trainer.run_history.update_metric("label", "good")

    _, trial = new_trial()
    with pytest.raises(
        TypeError, match=r"monitor='label'\): the metric's latest value is 'good', which is not a number"
    ):
        train(make_trainer((RecordsText(), OptunaPruningCallback(trial, monitor="label"))), num_epochs=1)


def test_a_one_element_tensor_is_reported_as_its_number() -> None:
    class RecordsTensor(TrainerCallback):
        def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
            trainer.run_history.update_metric("score", torch.tensor([0.25]))

    study, trial = new_trial()
    train(make_trainer((RecordsTensor(), OptunaPruningCallback(trial, monitor="score"))), num_epochs=1)
    assert study.trials[0].intermediate_values == {0: 0.25}


HIDE_OPTUNA = """
import sys

class HideOptuna:
    def find_spec(self, name, path=None, target=None):
        if name == "optuna" or name.startswith("optuna."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, HideOptuna())
import pytorch_accelerated
from pytorch_accelerated.callbacks import OptunaPruningCallback
print("imported", "optuna" in sys.modules)
try:
    OptunaPruningCallback(None)
except ImportError as error:
    print("ImportError:", error)
"""


def test_the_package_imports_without_optuna_and_the_callback_names_the_extra(tmp_path: Any) -> None:
    result = subprocess.run(
        [sys.executable, "-c", HIDE_OPTUNA],
        cwd=REPO_ROOT,
        env=subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "imported False",
        "ImportError: OptunaPruningCallback needs optuna, which is not installed: "
        "pip install 'pytorch-accelerated[tune]'  (or pip install optuna).",
    ]
