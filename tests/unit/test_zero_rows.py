"""Padding batches of zero rows (docs/inside-the-trainer.md, "Evaluation across processes"):
cutting a collated batch to some of its samples whatever its structure, sharing a stream's last
batches among processes, the default loss of a zero-row batch, and the note on an error there."""

from __future__ import annotations

from collections import UserDict
from typing import Any, NamedTuple

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.data import last_round_shares, num_rows, select_rows, zero_rows
from pytorch_accelerated.loaders import TrainerLoaders


class Pair(NamedTuple):
    inputs: Any
    labels: Any


def nested_batch(rows: int) -> dict[str, Any]:
    return {
        "pixels": torch.arange(rows * 6.0).reshape(rows, 2, 3),
        "pair": Pair(torch.arange(rows), ["a", "b", "c"][:rows]),
        "meta": UserDict({"ids": torch.arange(rows) + 10, "scale": torch.tensor(2.0)}),
        "tokens": [torch.zeros(rows, 4, dtype=torch.long), torch.ones(rows, 4, dtype=torch.long)],
    }


def test_zero_rows_keeps_the_structure_dtypes_and_trailing_shapes_of_a_nested_batch() -> None:
    empty = zero_rows(nested_batch(3))
    assert empty["pixels"].shape == (0, 2, 3) and empty["pixels"].dtype == torch.float32
    assert isinstance(empty["pair"], Pair) and empty["pair"].inputs.shape == (0,)
    assert empty["pair"].labels == []  # a list of per-sample strings is emptied too
    assert isinstance(empty["meta"], UserDict) and empty["meta"]["ids"].shape == (0,)
    assert empty["meta"]["scale"].item() == 2.0  # a 0-d tensor is not per sample: kept
    assert [t.shape for t in empty["tokens"]] == [(0, 4), (0, 4)]
    assert num_rows(empty) == 0 and num_rows(nested_batch(3)) == 3


def test_select_rows_takes_the_same_samples_from_every_part() -> None:
    part = select_rows(nested_batch(3), slice(1, 3))
    assert part["pair"].labels == ["b", "c"] and part["pair"].inputs.tolist() == [1, 2]
    assert part["meta"]["ids"].tolist() == [11, 12]
    assert torch.equal(part["pixels"], nested_batch(3)["pixels"][1:3])


@pytest.mark.parametrize(
    ("sizes", "num_processes", "expected"),
    [
        ([5], 2, [3, 2]),
        ([4, 1], 3, [2, 2, 1]),
        ([2], 3, [1, 1]),
        ([1], 3, [1]),
        ([2, 2], 3, [1, 1, 2]),
    ],
)
def test_a_streams_last_batches_are_shared_out_in_order(
    sizes: list[int], num_processes: int, expected: list[int]
) -> None:
    start, batches = 0, []
    for size in sizes:
        batches.append((torch.arange(start, start + size), [f"s{i}" for i in range(start, start + size)]))
        start += size
    shares = last_round_shares(batches, num_processes)
    assert [num_rows(share) for share in shares] == expected
    assert torch.cat([share[0] for share in shares]).tolist() == list(
        range(start)
    )  # each sample once, in order
    assert [name for share in shares for name in share[1]] == [f"s{i}" for i in range(start)]


def test_the_default_eval_loss_of_zero_rows_is_zero_without_calling_the_loss() -> None:
    calls: list[int] = []

    def loss_func(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        calls.append(len(outputs))
        return nn.functional.mse_loss(outputs, targets)  # NaN on zero rows

    trainer = Trainer(nn.Linear(3, 1), loss_func, None, callbacks=())
    output = trainer.calculate_eval_batch_loss((torch.zeros(0, 3), torch.zeros(0, 1)))
    assert (output["loss"].item(), output["batch_size"], output["model_outputs"].shape) == (0.0, 0, (0, 1))
    assert calls == []


def test_an_error_on_a_padding_batch_gets_a_note_naming_the_fix() -> None:
    loaders = TrainerLoaders(Accelerator(cpu=True))
    error = RuntimeError("cannot reshape tensor of 0 elements into shape [0, -1]")
    loaders.explain_padding_failure(error)
    assert not getattr(error, "__notes__", None)  # a real batch: the error as it was
    loaders.eval_batch_is_padding = True
    loaders.explain_padding_failure(error)
    (note,) = error.__notes__
    assert "padding batch of zero rows: process 0 has no sample left" in note
    assert "torch.flatten(x, 1)" in note and "evaluate at least as many samples as processes" in note
