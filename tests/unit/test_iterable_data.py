"""Streams (``IterableDataset`` without ``__len__``) and evaluation padding on one real process.

The 2-process cases (training over a stream, evaluating a stream each sample once, data sets
that differ across processes) are in tests/distributed/test_right_answers.py.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from pytorch_accelerated import Trainer, TrainerPlaceholderValues
from pytorch_accelerated.callbacks import get_default_callbacks
from pytorch_accelerated.data import ShardedEvalBatchSampler, ShardedStreamLoader
from tests.helpers import make_trainer as make_any_trainer


class Stream(IterableDataset):
    """``num_samples`` fixed ``(x, y)`` pairs, read in order; no ``__len__``."""

    def __init__(self, num_samples: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x, self.y = (
            torch.randn(num_samples, 3, generator=generator),
            torch.randn(num_samples, 1, generator=generator),
        )

    def __iter__(self) -> Any:
        yield from zip(self.x, self.y, strict=True)


class SizedStream(Stream):
    def __len__(self) -> int:
        return len(self.x)


make_trainer = functools.partial(make_any_trainer, lr=0.1)


def test_a_stream_trains_for_max_num_train_steps_with_the_progress_bar() -> None:
    trainer = make_trainer(get_default_callbacks(progress_bar=True))
    # 33 samples in batches of 4: 9 batches per pass, 5 updates (the last window is 1 batch).
    trainer.train(
        Stream(33),
        num_epochs=1,
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
        max_num_train_steps=7,
    )
    assert trainer.progress.global_step == 7
    assert trainer.run_config.num_update_steps_per_epoch is None
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


def test_a_stream_trains_one_pass_per_epoch_and_evaluates_with_the_bar() -> None:
    trainer = make_trainer(get_default_callbacks(progress_bar=True))
    trainer.train(
        Stream(33),
        num_epochs=2,
        eval_dataset=Stream(10),
        per_device_batch_size=4,
        gradient_accumulation_steps=2,
    )
    assert trainer.progress.global_step == 2 * 5
    assert len(trainer.run_history.get_metric_values("eval_loss_epoch")) == 2


def test_a_stream_with_a_length_knows_its_steps() -> None:
    trainer = make_trainer(get_default_callbacks(progress_bar=False))
    trainer.train(SizedStream(33), num_epochs=1, per_device_batch_size=4, gradient_accumulation_steps=2)
    assert trainer.run_config.num_update_steps_per_epoch == trainer.progress.global_step == 5


@pytest.mark.parametrize("placeholder", ["NUM_UPDATE_STEPS_PER_EPOCH", "TRAIN_DATALOADER_LEN"])
def test_a_scheduler_that_needs_the_steps_of_a_stream_says_they_are_unknown(placeholder: str) -> None:
    trainer = make_trainer(get_default_callbacks(progress_bar=False))
    scheduler = functools.partial(
        torch.optim.lr_scheduler.OneCycleLR,
        max_lr=0.1,
        epochs=1,
        steps_per_epoch=getattr(TrainerPlaceholderValues, placeholder),
    )
    with pytest.raises(
        ValueError, match=rf"{placeholder} is not known for this run: the training data set is a stream"
    ):
        trainer.train(Stream(8), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=scheduler)


def test_a_stream_that_yields_nothing_is_an_error_not_a_silent_nan() -> None:
    trainer = make_trainer(get_default_callbacks(progress_bar=False))
    # accelerate's dispatching loader finds it first; a loader of our own, the Trainer's check.
    with pytest.raises(ValueError, match=r"gave no batch in this epoch|Batch does not contain any data"):
        trainer.train(Stream(0), num_epochs=1, per_device_batch_size=4)


def test_evaluating_a_stream_counts_each_sample_once() -> None:
    data = Stream(33)
    model = nn.Linear(3, 1)
    with torch.no_grad():
        expected = ((model(data.x) - data.y) ** 2).mean().item()
    metrics = Trainer(model, nn.MSELoss(), None).evaluate(data, per_device_batch_size=4)
    assert metrics["evaluation_loss"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("num_processes", [2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
@pytest.mark.parametrize("num_samples", [1, 2, 3, 5, 7, 33])
def test_evaluation_shards_take_each_sample_once_in_equal_batch_counts(
    num_samples: int, batch_size: int, num_processes: int
) -> None:
    samplers = [
        ShardedEvalBatchSampler(num_samples, batch_size, num_processes, p) for p in range(num_processes)
    ]
    shares = [list(sampler) for sampler in samplers]
    assert len({len(share) for share in shares}) == 1 and all(
        len(batch) > 0 for share in shares for batch in share
    )
    own = [
        i
        for sampler, share in zip(samplers, shares, strict=True)
        for batch in share[: sampler.num_real_batches]
        for i in batch
    ]
    assert sorted(own) == list(range(num_samples))
    # Every batch of a process with samples is its own; only a process without one pads (once).
    assert [sampler.num_real_batches for sampler in samplers] == [
        len(share) if p < num_samples else 0 for p, share in enumerate(shares)
    ]
    # Batch size 1 on a set that P does not divide: the longer processes take one batch of 2.
    two = batch_size == 1 and num_samples > num_processes and num_samples % num_processes
    sizes = [len(batch) for share in shares for batch in share]
    assert max(sizes) == 2 if two else max(sizes) <= batch_size


@pytest.mark.parametrize("num_processes", [2, 3])
@pytest.mark.parametrize("num_batches", [1, 2, 4, 5])
def test_a_stream_is_split_by_batches_with_marked_padding(num_batches: int, num_processes: int) -> None:
    loader = DataLoader(Stream(num_batches * 2), batch_size=2)
    shards = [
        ShardedStreamLoader(loader, torch.device("cpu"), num_processes, p) for p in range(num_processes)
    ]
    batches = [
        [(number, batch[0], shard.num_real_batches) for number, batch in enumerate(shard)] for shard in shards
    ]
    assert {len(share) for share in batches} == {math.ceil(num_batches / num_processes)}
    own = [x for share in batches for number, x, real in share if real is None or number < real]
    by_first_column = [torch.cat(rows) for rows in (own, loader_x(loader))]
    torch.testing.assert_close(*(rows[rows[:, 0].argsort()] for rows in by_first_column))
    # The last round's batches (of 2) are shared out: zero rows (marked padding) only for the
    # processes left over when it has fewer samples than processes.
    last_round = num_batches % num_processes
    empty = [len(x) == 0 for share in batches for number, x, real in share]
    marked = [real is not None and number >= real for share in batches for number, x, real in share]
    assert empty == marked
    assert sum(empty) == (max(0, num_processes - 2 * last_round) if last_round else 0)


def loader_x(loader: DataLoader) -> list[torch.Tensor]:
    return [batch[0] for batch in loader]


def test_training_states_of_a_stream_save_and_resume_to_the_same_weights(tmp_path: Any) -> None:
    from pytorch_accelerated.callbacks import SaveTrainingStateCallback

    def run(max_steps: int, resume: bool) -> Trainer:
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        saver = SaveTrainingStateCallback(tmp_path, save_every_n_steps=2, save_at_end=False)
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=[saver])
        trainer.train(
            Stream(33),
            num_epochs=3,
            per_device_batch_size=4,
            gradient_accumulation_steps=2,
            max_num_train_steps=max_steps,
            resume_from=tmp_path if resume else None,
        )
        return trainer

    # 5 updates per pass (the last window of each pass is 1 batch); states at steps 2, 4, 6.
    uninterrupted = run(7, resume=False).model.weight.detach().clone()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_2", "step_4", "step_6"]
    resumed = run(7, resume=True)
    assert resumed.progress.global_step == 7
    assert torch.equal(resumed.model.weight.detach(), uninterrupted)
