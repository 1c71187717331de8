"""``trainer.predict``: every sample's outputs, in data-set order, on one process.

The 2-process behaviour (sharding, padding batches, gathering) is in
tests/distributed/test_predict_two_processes.py.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from pytorch_accelerated import Trainer
from tests.helpers import EventRecorder, make_linear_model, make_regression_data


def identity_trainer(**kwargs: Any) -> Trainer:
    """A Trainer whose model returns ``x * 1``: a prediction shows which sample it came from."""
    model = nn.Linear(1, 1, bias=False)
    nn.init.ones_(model.weight)
    return Trainer(model, loss_func=None, optimizer=None, callbacks=(), **kwargs)


def numbered(num_samples: int) -> TensorDataset:
    return TensorDataset(torch.arange(float(num_samples)).unsqueeze(1), torch.zeros(num_samples))


class Nested(nn.Module):
    """Returns a dict holding a tuple, a list and a namedtuple, with int and float tensors."""

    Pair = namedtuple("Pair", ["double", "negated"])

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        y = x * self.weight
        return {
            "y": y,
            "more": (y.long(), [y + 1]),
            "pair": self.Pair(2 * y, -y),
            "ordered": OrderedDict(first=y[:, 0]),
        }


class Sequences(Dataset):
    """Sample ``i`` is the tokens ``1 .. 1 + i % 4``: lengths 1 to 4."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(1, 2 + index % 4)


def pad_batch(sequences: list[torch.Tensor]) -> torch.Tensor:
    return nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0)


class PerToken(nn.Module):
    """``(B, L, 2)`` outputs: ``[token, -token]`` per real token, -1 at the batch's own padding."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))

    def forward(self, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        values = torch.stack([tokens * self.weight, -tokens * self.weight], dim=-1)
        return {
            "per_token": torch.where((tokens != 0).unsqueeze(-1), values, -1.0),
            "length": (tokens != 0).sum(1),
        }


# ---------------------------------------------------------------------------- results


def test_predictions_are_in_data_set_order_with_an_uneven_last_batch() -> None:
    predictions = identity_trainer().predict(numbered(13), per_device_batch_size=4)
    assert predictions.shape == (13, 1)
    assert predictions.flatten().tolist() == list(range(13))
    assert predictions.device.type == "cpu"


def test_predictions_equal_the_model_outputs_computed_by_hand() -> None:
    data = make_regression_data(11)
    model = make_linear_model()
    trainer = Trainer(model, loss_func=None, optimizer=None, callbacks=())
    with torch.no_grad():
        expected = model(data.tensors[0])
    torch.testing.assert_close(trainer.predict(data, per_device_batch_size=3), expected)


def test_nested_outputs_keep_their_structure_with_each_tensor_concatenated() -> None:
    trainer = Trainer(Nested(), loss_func=None, optimizer=None, callbacks=())
    predictions = trainer.predict(numbered(7), per_device_batch_size=3)
    y = torch.arange(7.0).unsqueeze(1)
    assert set(predictions) == {"y", "more", "pair", "ordered"}
    assert torch.equal(predictions["y"], y)
    assert isinstance(predictions["more"], tuple) and isinstance(predictions["more"][1], list)
    assert predictions["more"][0].dtype == torch.int64 and torch.equal(predictions["more"][0], y.long())
    assert torch.equal(predictions["more"][1][0], y + 1)
    assert isinstance(predictions["pair"], Nested.Pair) and torch.equal(predictions["pair"].negated, -y)
    assert isinstance(predictions["ordered"], OrderedDict) and torch.equal(
        predictions["ordered"]["first"], y[:, 0]
    )


def test_a_transformers_model_output_comes_back_as_the_same_type() -> None:
    modeling_outputs = pytest.importorskip("transformers.modeling_outputs")

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(()))

        def forward(self, input_ids: torch.Tensor) -> Any:
            return modeling_outputs.SequenceClassifierOutput(logits=input_ids * self.weight)

    class Encoded(Dataset):
        def __len__(self) -> int:
            return 5

        def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.tensor([float(index), 0.0])}

    trainer = Trainer(Classifier(), loss_func=None, optimizer=None, callbacks=())
    predictions = trainer.predict(Encoded(), per_device_batch_size=2)  # dict batches: model(**batch)
    assert isinstance(predictions, modeling_outputs.SequenceClassifierOutput)
    assert predictions.logits[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_ragged_outputs_are_padded_to_the_longest_with_the_padding_value() -> None:
    trainer = Trainer(PerToken(), loss_func=None, optimizer=None, callbacks=())
    predictions = trainer.predict(
        Sequences(), per_device_batch_size=3, collate_fn=pad_batch, padding_value=-100
    )
    per_token = predictions["per_token"]
    assert per_token.shape == (10, 4, 2)
    lengths = [1 + index % 4 for index in range(10)]
    for index, length in enumerate(lengths):
        first = index - index % 3  # of its batch of 3
        longest_in_batch = max(lengths[first : first + 3])
        tokens = torch.arange(1.0, length + 1)
        assert torch.equal(per_token[index, :length], torch.stack([tokens, -tokens], dim=-1))
        # The collate_fn's padding, as the model saw it, then predict's up to the longest of all.
        assert (per_token[index, length:longest_in_batch] == -1).all()
        assert (per_token[index, longest_in_batch:] == -100).all()
    assert predictions["length"].tolist() == lengths


def test_ragged_outputs_are_padded_with_zero_by_default() -> None:
    trainer = Trainer(PerToken(), loss_func=None, optimizer=None, callbacks=())
    per_token = trainer.predict(Sequences(), per_device_batch_size=1, collate_fn=pad_batch)["per_token"]
    assert per_token.shape == (10, 4, 2)
    assert per_token[0, 1:].abs().sum() == 0 and per_token[3].abs().sum() > 0


def test_an_overridden_calculate_predict_batch_outputs_is_used() -> None:
    class ProbabilitiesTrainer(Trainer):
        def calculate_predict_batch_outputs(self, batch: Any) -> Any:
            inputs, targets = batch
            return {"twice": self.model(inputs) * 2, "targets": targets}

    model = nn.Linear(1, 1, bias=False)
    nn.init.ones_(model.weight)
    data = TensorDataset(torch.arange(5.0).unsqueeze(1), torch.arange(10, 15))
    predictions = ProbabilitiesTrainer(model, None, None, callbacks=()).predict(data, per_device_batch_size=2)
    assert predictions["twice"].flatten().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert predictions["targets"].tolist() == [10, 11, 12, 13, 14]


def test_a_batch_that_is_only_inputs_is_passed_to_the_model_whole() -> None:
    class Inputs(Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.tensor([float(index)])

    assert identity_trainer().predict(Inputs()).flatten().tolist() == [0.0, 1.0, 2.0]


# ---------------------------------------------------------------------------- the trainer around it


class RecordsMode(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)
        self.modes: list[bool] = []
        self.grad_enabled: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        self.grad_enabled.append(torch.is_grad_enabled())
        return self.linear(x)


@pytest.mark.parametrize("training", [True, False])
def test_predicts_in_eval_mode_without_gradients_and_restores_the_mode(training: bool) -> None:
    model = RecordsMode()
    model.train(training)
    predictions = Trainer(model, None, None, callbacks=()).predict(numbered(5), per_device_batch_size=2)
    assert model.modes == [False, False, False] and model.grad_enabled == [False, False, False]
    assert model.training is training
    assert not predictions.requires_grad


def test_the_mode_is_restored_when_a_batch_fails() -> None:
    class Failing(Trainer):
        def calculate_predict_batch_outputs(self, batch: Any) -> Any:
            raise RuntimeError("this batch failed")

    model = RecordsMode()
    with pytest.raises(RuntimeError, match="this batch failed"):
        Failing(model, None, None, callbacks=()).predict(numbered(3))
    assert model.training is True


def test_a_fresh_trainer_gets_an_evaluation_run_config_and_keeps_no_eval_dataset() -> None:
    trainer = identity_trainer()
    assert trainer.run_config is None
    trainer.predict(numbered(5), per_device_batch_size=3)
    assert trainer.run_config is not None and trainer.run_config.evaluation_only
    assert trainer.run_config.eval_per_device_batch_size == 3
    assert trainer.eval_dataset is None and trainer.eval_dataloader is None
    with pytest.raises(ValueError, match="evaluate\\(\\) needs a dataset"):
        trainer.evaluate()


def test_after_train_it_predicts_with_the_trained_model_and_leaves_the_run_as_it_was() -> None:
    train_data, eval_data, new_data = (
        make_regression_data(24),
        make_regression_data(8, seed=1),
        make_regression_data(5, seed=2),
    )
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(train_data, num_epochs=2, eval_dataset=eval_data, per_device_batch_size=8)
    config, eval_loader, collate_fn = trainer.run_config, trainer.eval_dataloader, trainer.collate_fn
    model.train()

    predictions = trainer.predict(
        new_data, per_device_batch_size=2, collate_fn=lambda samples: torch.stack([x for x, _ in samples])
    )

    with torch.no_grad():
        torch.testing.assert_close(predictions, model(new_data.tensors[0]))
    assert trainer.run_config is config and trainer.eval_dataloader is eval_loader
    assert trainer.eval_dataset is eval_data and trainer.collate_fn is collate_fn
    assert model.training  # as it was before
    assert set(trainer.evaluate()) == {"evaluation_loss"}  # still on the run's eval_dataset
    trainer.train(train_data, num_epochs=1, per_device_batch_size=8)
    assert trainer.progress.global_step == 3


def test_predict_fires_no_callback_event_and_records_nothing() -> None:
    log: list[str] = []
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), None, callbacks=(EventRecorder(log),))
    trainer.predict(make_regression_data(6))
    assert log == ["on_init_end"]
    assert not trainer.run_history.get_metric_names()


# ---------------------------------------------------------------------------- bad input


def test_an_empty_data_set_is_an_error_naming_it_and_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"predict\(\) got an empty dataset \(TensorDataset, len 0\).*at least one sample"
    ):
        identity_trainer().predict(TensorDataset(torch.empty(0, 1)))


def test_a_stream_is_an_error_that_says_what_to_pass() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Any:
            return iter([torch.ones(1)])

    with pytest.raises(TypeError, match=r"map-style data set .* got Stream.*TensorDataset"):
        identity_trainer().predict(Stream())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"per_device_batch_size": 0}, "per_device_batch_size must be a whole number >= 1, got 0"),
        ({"dataloader_kwargs": {"shuffle": True}}, r"may not set shuffle .*Subset"),
        ({"dataloader_kwargs": {"sampler": [0, 1]}}, "may not set sampler"),
        ({"dataloader_kwargs": [("batch_size", 2)]}, "dataloader_kwargs must be a dict"),
        ({"collate_fn": "stack"}, "collate_fn must be a function"),
        ({"padding_value": "pad"}, "padding_value must be a number"),
    ],
)
def test_arguments_are_checked_as_evaluate_checks_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        identity_trainer().predict(numbered(3), **kwargs)


def test_an_output_without_one_row_per_sample_is_an_error_that_says_what_to_return() -> None:
    class WithLoss(Trainer):
        def calculate_predict_batch_outputs(self, batch: Any) -> Any:
            return {"logits": self.model(batch[0]), "loss": torch.tensor(0.5)}

    with pytest.raises(
        ValueError, match=r"outputs\['loss'\] of shape \(\) for a batch of 2 samples.*outputs.logits"
    ):
        WithLoss(make_linear_model(1), None, None, callbacks=()).predict(numbered(4), per_device_batch_size=2)


def test_an_output_that_is_not_a_tensor_is_an_error_naming_where_it_is() -> None:
    class WithText(Trainer):
        def calculate_predict_batch_outputs(self, batch: Any) -> Any:
            return (self.model(batch[0]), "label")

    with pytest.raises(TypeError, match=r"outputs\[1\] = str, not a tensor"):
        WithText(make_linear_model(1), None, None, callbacks=()).predict(numbered(4))


def test_outputs_whose_structure_changes_between_batches_are_an_error() -> None:
    class Changing(Trainer):
        def calculate_predict_batch_outputs(self, batch: Any) -> Any:
            outputs = self.model(batch[0])
            return {"a": outputs} if batch[0][0, 0] == 0 else {"b": outputs}

    with pytest.raises(
        ValueError, match=r"\[\"outputs\['b'\]\"\] for one batch and at \[\"outputs\['a'\]\"\]"
    ):
        Changing(make_linear_model(1), None, None, callbacks=()).predict(numbered(4), per_device_batch_size=2)


def test_a_create_eval_dataloader_override_that_drops_the_sharding_is_an_error() -> None:
    class PlainLoader(Trainer):
        def create_eval_dataloader(self, batch_size: int, eval_dl_kwargs: Any = None) -> Any:
            return torch.utils.data.DataLoader(self.eval_dataset, batch_size=batch_size)

    with pytest.raises(TypeError, match="ShardedEvalBatchSampler .* got a BatchSampler"):
        PlainLoader(make_linear_model(1), None, None, callbacks=()).predict(numbered(4))
