"""Bad input gets an error that names what was wrong and how to fix it."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import PrintProgressCallback, SaveTrainingStateCallback, TrainerCallback
from tests.helpers import make_linear_model, make_regression_data, make_trainer


def test_model_that_is_not_a_module_is_rejected_with_the_type_seen() -> None:
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got function"):
        make_trainer(model=lambda x: x, optimizer=torch.optim.SGD(make_linear_model().parameters(), lr=0.01))


def test_optimizer_of_the_wrong_type_is_rejected_with_an_example() -> None:
    with pytest.raises(
        TypeError,
        match=r"optimizer must be a torch.optim.Optimizer, .*DummyOptim.*step\(\) and zero_grad\(\).*got list.*torch.optim.SGD",
    ):
        make_trainer(optimizer=[1, 2])


def test_missing_optimizer_fails_train_before_any_work_and_says_how_to_pass_one() -> None:
    trainer = make_trainer(optimizer=None)
    with pytest.raises(ValueError, match=r"train\(\) needs an optimizer.*optimizer=None"):
        trainer.train(make_regression_data(4), num_epochs=1)


def test_missing_loss_function_names_the_method_to_override() -> None:
    trainer = make_trainer(loss_func=None)
    with pytest.raises(ValueError, match=r"calculate_train_batch_loss needs a loss function.*loss_func=None"):
        trainer.train(make_regression_data(4), num_epochs=1)


def test_loss_function_that_is_not_callable_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"loss_func must be callable.*'mse'"):
        make_trainer(loss_func="mse")


def test_empty_dataset_is_rejected_naming_the_argument() -> None:
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 3), torch.zeros(0, 1))
    with pytest.raises(ValueError, match=r"train_dataset is empty"):
        make_trainer().train(empty, num_epochs=1)
    with pytest.raises(ValueError, match=r"eval_dataset is empty"):
        make_trainer().train(make_regression_data(4), num_epochs=1, eval_dataset=empty)


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("per_device_batch_size", 0),
        ("num_epochs", 0),
        ("gradient_accumulation_steps", -1),
        ("max_num_train_steps", 0),
        ("per_device_batch_size", 2.5),
    ],
)
def test_counts_below_one_are_rejected_with_the_value_seen(argument: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"num_epochs": 1, argument: value}
    allowed = "a whole number >= 1 or None" if argument == "max_num_train_steps" else "a whole number >= 1"
    with pytest.raises(ValueError, match=rf"{argument} must be {allowed}, got {value!r}"):
        make_trainer().train(make_regression_data(4), **kwargs)


@pytest.mark.parametrize("argument", ["gradient_clip_value", "max_grad_norm"])
def test_non_positive_clipping_values_are_rejected(argument: str) -> None:
    with pytest.raises(ValueError, match=rf"{argument} must be a number > 0 or None, got -1.0"):
        make_trainer().train(make_regression_data(4), num_epochs=1, **{argument: -1.0})


class SingleTensorDataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.ones(3)


def test_batch_the_default_loss_cannot_unpack_explains_the_expected_pair() -> None:
    with pytest.raises(
        TypeError,
        match=r"expects each batch to be a pair \(inputs, targets\).*override calculate_train_batch_loss",
    ):
        make_trainer().train(SingleTensorDataset(), num_epochs=1, per_device_batch_size=1)


def test_loss_that_is_not_a_scalar_tensor_is_rejected_with_its_shape() -> None:
    trainer = make_trainer(loss_func=nn.MSELoss(reduction="none"))
    with pytest.raises(ValueError, match=r"not a scalar tensor \(got \(2, 1\)\).*reduction='mean'"):
        trainer.train(make_regression_data(4), num_epochs=1, per_device_batch_size=2)


def test_batch_output_without_loss_lists_what_was_returned() -> None:
    class NoLoss(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            return {"batch_size": 2}

    model = make_linear_model()
    trainer = NoLoss(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(
        TypeError, match=r"must return a dict with at least 'loss' and 'batch_size'.*\['batch_size'\]"
    ):
        trainer.train(make_regression_data(4), num_epochs=1, per_device_batch_size=2)


def test_misspelt_callback_hook_is_rejected_with_a_suggestion() -> None:
    class Typo(TrainerCallback):
        def on_train_epoch_ends(self, trainer: Any, **kwargs: Any) -> None:
            pass

    with pytest.raises(
        ValueError,
        match=r"Typo.on_train_epoch_ends is not a Trainer event.*Did you mean 'on_train_epoch_end'\?",
    ):
        make_trainer(callbacks=(Typo(),))


def test_callback_that_is_not_a_trainer_callback_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"callbacks must be TrainerCallback instances or classes, got 3"):
        make_trainer(callbacks=(3,))


def test_resume_from_a_missing_directory_fails_before_training(tmp_path: Any) -> None:
    trainer = make_trainer()
    weights = trainer.model.weight.detach().clone()
    with pytest.raises(FileNotFoundError, match=r"resume_from='.*somewhere': no such directory"):
        trainer.train(make_regression_data(4), num_epochs=1, resume_from=tmp_path / "somewhere")
    assert torch.equal(trainer.model.weight, weights)


def test_evaluate_without_any_dataset_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match=r"evaluate\(\) needs a dataset"):
        make_trainer().evaluate()


# ---------------------------------------------------------------------------- train() and evaluate() arguments


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        (
            "create_scheduler_fn",
            "cosine",
            r"create_scheduler_fn must be a function optimizer -> scheduler \(or None\), got 'cosine' \(str\).*CosineLrScheduler.create_scheduler_fn\(\)",
        ),
        ("seed", "abc", r"seed must be a whole number >= 0 or None, got 'abc'\."),
        ("seed", 2**40, r"seed must be at most 2\*\*32 - 1 .*got 1099511627776"),
        (
            "collate_fn",
            3,
            r"collate_fn must be a function that makes a batch from a list of samples \(or None\), got 3 \(int\)",
        ),
        (
            "train_dataloader_kwargs",
            [("batch_size", 4)],
            r"train_dataloader_kwargs must be a dict of DataLoader arguments \(or None\), got list.*\{'batch_size': 4\}",
        ),
        (
            "eval_dataloader_kwargs",
            "big",
            r"eval_dataloader_kwargs must be a dict of DataLoader arguments \(or None\), got str",
        ),
        (
            "train_dataloader_kwargs",
            {"batch_size": 0},
            r"train_dataloader_kwargs\['batch_size'\] must be a whole number >= 1 or None, got 0\.",
        ),
        ("reset_run_history", "no", r"reset_run_history must be True or False, got 'no' \(str\)"),
        (
            "resume_from",
            3,
            r'resume_from must be a path \(str or os.PathLike\) to a training state or a folder of them, "auto" '
            r"\(the folder of the SaveTrainingStateCallback, or a new run\), or None; got 3 \(int\)",
        ),
    ],
)
def test_train_arguments_of_the_wrong_type_name_the_argument_and_the_fix(
    argument: str, value: Any, message: str
) -> None:
    trainer = make_trainer()
    with pytest.raises((TypeError, ValueError), match=message):
        trainer.train(make_regression_data(4), num_epochs=1, **{argument: value})
    assert trainer.run_config is None  # rejected before anything was set up


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("seed", "abc", r"seed must be a whole number >= 0 or None, got 'abc'\."),
        ("collate_fn", "stack", r"collate_fn must be a function .*got 'stack' \(str\)"),
        (
            "dataloader_kwargs",
            8,
            r"dataloader_kwargs must be a dict of DataLoader arguments \(or None\), got int",
        ),
        ("per_device_batch_size", "8", r"per_device_batch_size must be a whole number >= 1, got '8'\."),
    ],
)
def test_evaluate_arguments_of_the_wrong_type_name_the_argument(
    argument: str, value: Any, message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        make_trainer().evaluate(make_regression_data(4), **{argument: value})


def test_callbacks_none_says_to_pass_a_list() -> None:
    with pytest.raises(
        TypeError,
        match=r"callbacks must be a list of callbacks, got None: pass callbacks=\(\) for none, or DEFAULT_CALLBACKS",
    ):
        make_trainer(callbacks=None)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (PrintProgressCallback(), r"PrintProgressCallback\(\)"),
        (PrintProgressCallback, "PrintProgressCallback"),
    ],
)
def test_a_single_callback_says_to_pass_a_list(value: Any, shown: str) -> None:
    with pytest.raises(
        TypeError,
        match=rf"callbacks must be a list of callbacks, got one PrintProgressCallback: pass a list: callbacks=\[{shown}\]",
    ):
        make_trainer(callbacks=value)


def test_check_signals_every_n_steps_as_a_string_names_the_argument_and_the_value() -> None:
    with pytest.raises(
        ValueError,
        match=r"SaveTrainingStateCallback: check_signals_every_n_steps must be a whole number >= 1, got '5'\.",
    ):
        SaveTrainingStateCallback(check_signals_every_n_steps="5")  # type: ignore[arg-type]


class TupleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.linear(x), x


class SequenceClassifierOutput(OrderedDict):
    """Shaped like a transformers ``ModelOutput``: an OrderedDict whose keys are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class ModelOutputModel(TupleModel):
    def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
        return SequenceClassifierOutput(logits=self.linear(x))


def classification_data() -> torch.utils.data.TensorDataset:
    return torch.utils.data.TensorDataset(torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))


@pytest.mark.parametrize(
    ("model_class", "loss_func", "returned"),
    [
        (TupleModel, nn.CrossEntropyLoss(), r"a tuple of 2"),
        (TupleModel, nn.MSELoss(), r"a tuple of 2"),
        (
            ModelOutputModel,
            nn.CrossEntropyLoss(),
            r"a SequenceClassifierOutput \(a dict with keys \['logits'\]; a transformers ModelOutput\?\)",
        ),
    ],
)
def test_model_returning_a_tuple_or_a_model_output_says_how_to_get_the_logits(
    model_class: Any, loss_func: Any, returned: str
) -> None:
    model = model_class()
    trainer = Trainer(model, loss_func, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(
        TypeError,
        match=rf"The model returned {returned}, not a tensor.*override calculate_train_batch_loss and calculate_eval_batch_loss.*or wrap the model",
    ) as caught:
        trainer.train(classification_data(), num_epochs=1, per_device_batch_size=2)
    assert isinstance(caught.value.__cause__, (TypeError, AttributeError))  # the loss function's own error


def test_loss_function_error_with_a_tensor_output_reaches_the_caller_unchanged() -> None:
    def bad_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise TypeError("my own mistake")

    model = make_linear_model()
    trainer = Trainer(model, bad_loss, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(TypeError, match=r"^my own mistake$"):
        trainer.train(make_regression_data(4), num_epochs=1)
