"""Every count the package takes is checked by one function, with one wording.

``_internal/validation.check_whole_number`` (and ``schedulers/base.check_int``, which delegates
to it) is the only check of whole-number arguments. Each place that uses it is listed in
:data:`PLACES`: a bad value raises ``ValueError`` with the message
``"[Owner: ]name must be a whole number >= minimum[ or None], got value."``, a valid value
passes, and None passes exactly where the argument is optional.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import pytorch_accelerated
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    EarlyStoppingCallback,
    LimitBatchesCallback,
    LimitEvalStepsCallback,
    PlotRunCallback,
    SaveTrainingStateCallback,
    StepBasedEvaluationCallback,
    TerminateOnNaNCallback,
    TrackingCallback,
)
from pytorch_accelerated.callbacks.limits import limit_batches_callback_from_env
from pytorch_accelerated.schedulers import CosineLrScheduler, WSDLrScheduler
from pytorch_accelerated.utils import DataLoaderSlice, LimitBatches
from tests.helpers import make_regression_data, make_trainer

PACKAGE = Path(pytorch_accelerated.__file__).resolve().parent
ENV = "PT_ACC_LIMIT_BATCHES"
ENV_NAME = f"The environment variable {ENV} (batches per epoch)"
DATA = make_regression_data(16)


def optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)


def train_with(argument: str) -> Callable[[Any], Any]:
    def call(value: Any) -> None:
        settings: dict[str, Any] = {"num_epochs": 1, "per_device_batch_size": 4, argument: value}
        make_trainer().train(DATA, **settings)

    return call


def evaluate_with_batch_size(value: Any) -> None:
    make_trainer().evaluate(DATA, per_device_batch_size=value)


def evaluate_with_seed(value: Any) -> None:
    make_trainer().evaluate(DATA, seed=value)


def with_env_limit(make: Callable[[], Any]) -> Callable[[Any], Any]:
    def call(value: Any) -> Any:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV, value)
            return make()

    return call


def cosine_with(argument: str) -> Callable[[Any], Any]:
    def call(value: Any) -> CosineLrScheduler:
        settings: dict[str, Any] = {"total_num_epochs": 4, "num_update_steps_per_epoch": 10, argument: value}
        return CosineLrScheduler(optimizer(), **settings)

    return call


def wsd_with(argument: str) -> Callable[[Any], Any]:
    def call(value: Any) -> WSDLrScheduler:
        length: dict[str, Any] = (
            {"total_steps": value}
            if argument == "total_steps"
            else {"num_epochs": 2, "num_update_steps_per_epoch": 50}
        )
        if argument != "total_steps":
            length[argument] = value
        return WSDLrScheduler(optimizer(), **length)

    return call


def wsd_phase_info(value: Any) -> dict[str, Any]:
    return WSDLrScheduler(optimizer(), total_steps=100).get_phase_info(value)


def save_training_state_callback_with(argument: str) -> Callable[[Any], Any]:
    def call(value: Any) -> SaveTrainingStateCallback:
        return SaveTrainingStateCallback("unused", handle_signals=(), **{argument: value})

    return call


def plot_callback_with(argument: str) -> Callable[[Any], Any]:
    def call(value: Any) -> PlotRunCallback:
        return PlotRunCallback(**{argument: value})

    return call


class ReturnsEpoch(Trainer):
    """An override of load_training_state that restores nothing itself and returns an epoch."""

    returned: Any = None

    def load_training_state(self, input_dir: Any) -> dict[str, Any]:
        return {"current_epoch": self.returned}


def train_returning_epoch(value: Any) -> None:
    trainer = make_trainer(trainer_class=ReturnsEpoch)
    trainer.returned = value
    trainer.train(DATA, num_epochs=3, per_device_batch_size=4, resume_from="restored-by-the-override")


@dataclass(frozen=True)
class Place:
    """One argument checked by check_whole_number, and how to pass it a value."""

    id: str
    source: str  # the package file (relative to the package) whose call checks it
    owner: str  # the class or function the message names first ("" for none)
    name: str
    minimum: int
    optional: bool
    call: Callable[[Any], Any]
    valid: Any
    bad: tuple[Any, ...]
    none_reaches_check: bool = True  # False where None means something else (WSD run length)


def find_learning_rate_with_num_steps(value: Any) -> Any:
    return make_trainer().find_learning_rate(DATA, per_device_batch_size=4, num_steps=value)


VALIDATION = "_internal/validation.py"
PLACES = [
    Place(
        "find_learning_rate-num_steps",
        "lr_finder.py",
        "find_learning_rate",
        "num_steps",
        2,
        False,
        find_learning_rate_with_num_steps,
        5,
        (1, 2.5, "5"),
    ),
    Place("train-num_epochs", VALIDATION, "", "num_epochs", 1, False, train_with("num_epochs"), 1, (0, 2.5)),
    Place(
        "train-per_device_batch_size",
        VALIDATION,
        "",
        "per_device_batch_size",
        1,
        False,
        train_with("per_device_batch_size"),
        4,
        (-1, True),
    ),
    Place(
        "train-gradient_accumulation_steps",
        VALIDATION,
        "",
        "gradient_accumulation_steps",
        1,
        False,
        train_with("gradient_accumulation_steps"),
        2,
        (0, "3"),
    ),
    Place(
        "train-max_num_train_steps",
        VALIDATION,
        "",
        "max_num_train_steps",
        1,
        True,
        train_with("max_num_train_steps"),
        1,
        (0, 2.5),
    ),
    Place(
        "evaluate-per_device_batch_size",
        VALIDATION,
        "",
        "per_device_batch_size",
        1,
        False,
        evaluate_with_batch_size,
        4,
        (0, "3"),
    ),
    Place("train-seed", VALIDATION, "", "seed", 0, True, train_with("seed"), 0, (-1, "abc", 1.5)),
    Place("evaluate-seed", VALIDATION, "", "seed", 0, True, evaluate_with_seed, 7, (-2, "42")),
    Place(
        "train-train_dataloader_kwargs-batch_size",
        VALIDATION,
        "",
        "train_dataloader_kwargs['batch_size']",
        1,
        True,
        lambda value: train_with("train_dataloader_kwargs")({"batch_size": value}),
        2,
        (0, 2.5),
    ),
    Place(
        "evaluate-dataloader_kwargs-batch_size",
        VALIDATION,
        "",
        "dataloader_kwargs['batch_size']",
        1,
        True,
        lambda value: make_trainer().evaluate(DATA, dataloader_kwargs={"batch_size": value}),
        2,
        (0, "2"),
    ),
    Place(
        "env-limit_batches_callback_from_env",
        "callbacks/limits.py",
        "",
        ENV_NAME,
        1,
        False,
        with_env_limit(limit_batches_callback_from_env),
        "2",
        ("0", "-1", "2.5", "three"),
        none_reaches_check=False,
    ),
    Place(
        "env-Trainer()",
        "callbacks/limits.py",
        "",
        ENV_NAME,
        1,
        False,
        with_env_limit(make_trainer),
        "2",
        ("0", "1.5"),
        none_reaches_check=False,
    ),
    Place(
        "TrackingCallback-log_every_n_steps",
        "callbacks/trackers.py",
        "TrackingCallback",
        "log_every_n_steps",
        1,
        False,
        lambda value: TrackingCallback(log_every_n_steps=value),
        1,
        (0, 2.5),
    ),
    *(
        Place(
            f"PlotRunCallback-{name}",
            "callbacks/plotting.py",
            "PlotRunCallback",
            name,
            1,
            False,
            plot_callback_with(name),
            2,
            (0, 1.5),
        )
        for name in ("dpi", "columns")
    ),
    Place(
        "predict-per_device_batch_size",
        "prediction.py",
        "",
        "per_device_batch_size",
        1,
        False,
        lambda value: make_trainer().predict(DATA, per_device_batch_size=value),
        4,
        (0, "3"),
    ),
    Place(
        "TerminateOnNaNCallback-check_every_n_steps",
        "callbacks/defaults.py",
        "TerminateOnNaNCallback",
        "check_every_n_steps",
        1,
        False,
        TerminateOnNaNCallback,
        1,
        (0, 2.5),
    ),
    *(
        Place(
            f"SaveTrainingStateCallback-{name}",
            "callbacks/training_state.py",
            "SaveTrainingStateCallback",
            name,
            1,
            optional,
            save_training_state_callback_with(name),
            1,
            bad,
        )
        for name, optional, bad in (
            ("save_every_n_epochs", True, (0, True)),
            ("save_every_n_steps", True, (-1, 2.5)),
            ("max_checkpoints", True, (0, "3")),
            ("check_signals_every_n_steps", False, (0, 2.5)),
        )
    ),
    Place(
        "StepBasedEvaluationCallback-eval_every_n_steps",
        "callbacks/evaluation.py",
        "StepBasedEvaluationCallback",
        "eval_every_n_steps",
        1,
        False,
        StepBasedEvaluationCallback,
        1,
        (0, True),
    ),
    Place(
        "LimitEvalStepsCallback-num_eval_steps",
        "callbacks/evaluation.py",
        "LimitEvalStepsCallback",
        "num_eval_steps",
        1,
        False,
        LimitEvalStepsCallback,
        1,
        (-1, "3"),
    ),
    Place(
        "LimitBatchesCallback-num_batches",
        "callbacks/limits.py",
        "LimitBatchesCallback",
        "num_batches",
        1,
        False,
        LimitBatchesCallback,
        1,
        (0, 2.5),
    ),
    Place(
        "LimitBatches-num_batches",
        "utils.py",
        "LimitBatches",
        "num_batches",
        1,
        False,
        LimitBatches,
        1,
        (0, True),
    ),
    Place(
        "EarlyStoppingCallback-early_stopping_patience",
        "callbacks/monitoring.py",
        "EarlyStoppingCallback",
        "early_stopping_patience",
        1,
        False,
        EarlyStoppingCallback,
        1,
        (0, 2.5),
    ),
    Place(
        "DataLoaderSlice-slice_size",
        "utils.py",
        "DataLoaderSlice",
        "slice_size",
        0,
        True,
        lambda value: DataLoaderSlice([1, 2, 3], value),
        0,
        (-1, 2.5),
    ),
    *(
        Place(
            f"CosineLrScheduler-{name}",
            "schedulers/cosine.py",
            "",
            name,
            minimum,
            False,
            cosine_with(name),
            valid,
            bad,
        )
        for name, minimum, valid, bad in (
            ("total_num_epochs", 1, 4, (0, 2.5)),
            ("num_update_steps_per_epoch", 1, 1, (0, True)),
            ("num_warmup_epochs", 0, 0, (-1, "3")),
            ("num_cooldown_epochs", 0, 0, (-1, 1.0)),
        )
    ),
    *(
        Place(
            # num_warmup_steps=None means 1% of the run (docs/schedulers.md).
            f"WSDLrScheduler-{name}",
            "schedulers/wsd.py",
            "",
            name,
            minimum,
            name == "num_warmup_steps",
            wsd_with(name),
            valid,
            bad,
            none_reaches_check=none_reaches_check,
        )
        for name, minimum, valid, bad, none_reaches_check in (
            ("total_steps", 1, 100, (0, 2.5), False),
            ("num_epochs", 1, 2, (0, True), False),
            ("num_update_steps_per_epoch", 1, 50, (-1, "3"), False),
            ("num_warmup_steps", 0, 0, (-1, 2.5), True),
            ("num_checkpoints", 1, 3, (0, 3.0), True),
        )
    ),
    Place(
        "WSDLrScheduler.get_phase_info-step",
        "schedulers/wsd.py",
        "",
        "step",
        0,
        False,
        wsd_phase_info,
        0,
        (-1, 2.5),
    ),
    Place(
        "load_training_state-current_epoch",
        "runs.py",
        "ReturnsEpoch.load_training_state returned",
        "current_epoch",
        1,
        False,
        train_returning_epoch,
        2,
        (0, 2.5, "3"),
        none_reaches_check=False,  # None: the override returned no epoch, the run starts at 1
    ),
]
BAD_CASES = [
    pytest.param(place, value, id=f"{place.id}-{value!r}") for place in PLACES for value in place.bad
]


def expected_message(place: Place, value: Any) -> str:
    owner = f"(?:{re.escape(place.owner)}: )?" if place.owner else ""
    allowed = f"a whole number >= {place.minimum}" + (" or None" if place.optional else "")
    return rf"^{owner}{re.escape(place.name)} must be {re.escape(allowed)}, got {re.escape(repr(value))}\."


@pytest.mark.parametrize(("place", "value"), BAD_CASES)
def test_a_bad_whole_number_raises_value_error_with_the_one_wording(place: Place, value: Any) -> None:
    with pytest.raises(ValueError) as error:
        place.call(value)
    message = str(error.value)
    assert re.match(expected_message(place, value), message), message
    if place.name == ENV_NAME:  # the variable's message also says how to fix it
        assert message.endswith(
            "Unset it to train on every batch, or use `with pytorch_accelerated.utils.LimitBatches(n):`."
        )


@pytest.mark.parametrize("place", [pytest.param(place, id=place.id) for place in PLACES])
def test_a_valid_whole_number_passes_and_none_only_where_optional(place: Place) -> None:
    place.call(place.valid)
    if not place.none_reaches_check:
        return
    if place.optional:
        place.call(None)
    else:
        with pytest.raises(ValueError) as error:
            place.call(None)
        assert re.match(expected_message(place, None), str(error.value)), str(error.value)


def test_valid_whole_numbers_are_used_as_given() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ENV, " 3 ")
        callback = limit_batches_callback_from_env()
        assert isinstance(callback, LimitBatchesCallback) and callback.num_batches == 3
        patch.setenv(ENV, "none")
        assert limit_batches_callback_from_env() is None
    assert CosineLrScheduler(optimizer(), total_num_epochs=4, num_update_steps_per_epoch=10).total_steps == 40
    assert WSDLrScheduler(optimizer(), total_steps=100, num_checkpoints=3).get_checkpoint_steps() == [
        25,
        50,
        100,
    ]
    assert len(DataLoaderSlice([1, 2, 3], 0)) == 0 and len(DataLoaderSlice([1, 2, 3], None)) == 3


def _names_checked_in(path: Path) -> set[str]:
    """The literal argument names passed to check_whole_number / check_int in one source file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        function = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if function not in ("check_whole_number", "check_int"):
            continue
        position = 1 if function == "check_whole_number" else 0
        argument = next((k.value for k in node.keywords if k.arg == "name"), None)
        if argument is None and len(node.args) > position:
            argument = node.args[position]
        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
            names.add(argument.value)
    return names


def test_every_literal_whole_number_check_in_the_package_has_a_case_here() -> None:
    covered = {(place.source, place.name) for place in PLACES}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = path.relative_to(PACKAGE).as_posix()
        missing += [(source, name) for name in _names_checked_in(path) if (source, name) not in covered]
    assert not missing, f"whole-number checks without a case in PLACES: {missing}"


def _non_docstring_strings(tree: ast.AST) -> list[str]:
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_the_whole_number_wording_is_defined_only_in_internal_validation() -> None:
    sources = {
        path.relative_to(PACKAGE).as_posix(): path.read_text(encoding="utf-8")
        for path in PACKAGE.rglob("*.py")
    }
    with_phrase = sorted(name for name, text in sources.items() if "must be a whole number" in text)
    assert with_phrase == [VALIDATION]
    # No message text (strings that are not docstrings) elsewhere spells the wording out either.
    with_message = sorted(
        name
        for name, text in sources.items()
        if any("whole number" in string for string in _non_docstring_strings(ast.parse(text)))
    )
    assert with_message == [VALIDATION]
