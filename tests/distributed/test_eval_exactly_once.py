"""Evaluation over 2 processes counts every sample exactly once, whatever the data set size.

With accelerate's default even batches, N=37 or N=9 with B=4 would give one process padded
duplicates (N=9: the second round of batches would be padding only on process 1; N=3: all of
process 1's batch); here no sample is evaluated twice, seen twice by a callback or weighs in the
evaluation loss twice.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.launch import launch_workers

PER_DEVICE_BATCH = 4
SIZES = [37, 9, 3]
#: Every size >= 1 with any batch size: 1 sample leaves process 1 a padding batch of zero rows;
#: 3, 5 or 33 samples in batches of 1 give process 0 one batch of 2.
GRID = [(num_samples, batch_size) for num_samples in (1, 2, 3, 5, 33) for batch_size in (1, 3)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    run = launch_workers(
        "eval_exactly_once.py",
        tmp_path_factory.mktemp("eval_exactly_once"),
        "--batch-size",
        str(PER_DEVICE_BATCH),
        "--sizes",
        json.dumps(SIZES),
        "--grid",
        json.dumps(GRID),
        nproc=2,
    )
    return run.results


def plain_pytorch_mean_loss(common: ModuleType, num_samples: int) -> float:
    """The mean over every sample of its own MSE, for the fixed model the worker evaluates."""
    model = common.make_mlp(seed=0)
    x, y = common.make_data(num_samples, seed=2)
    with torch.no_grad():
        per_sample = ((model(x) - y) ** 2).mean(dim=1)
    return per_sample.double().mean().item()


def test_worker_ran_as_a_group_of_two_processes(ranks: list[dict[str, Any]]) -> None:
    assert [result["world_size"] for result in ranks] == [2, 2]
    assert [result["train_eval"]["num_processes"] for result in ranks] == [2, 2]


@pytest.mark.parametrize("num_samples", SIZES)
def test_gathered_indices_are_every_sample_exactly_once(
    ranks: list[dict[str, Any]], num_samples: int
) -> None:
    for result in ranks:
        gathered = result[f"evaluate_{num_samples}"]["gathered"]
        assert sorted(gathered) == list(range(num_samples)), f"duplicates or gaps: {sorted(gathered)}"


@pytest.mark.parametrize("num_samples", SIZES)
def test_ranks_evaluate_disjoint_shares_that_cover_the_data_set(
    ranks: list[dict[str, Any]], num_samples: int
) -> None:
    shares = [
        [i for batch in result[f"evaluate_{num_samples}"]["local_batches"] for i in batch] for result in ranks
    ]
    assert all(shares), f"a rank evaluated no sample: {shares}"
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(num_samples))


@pytest.mark.parametrize("num_samples", SIZES)
def test_both_ranks_run_the_same_number_of_eval_batches(
    ranks: list[dict[str, Any]], num_samples: int
) -> None:
    counts = [len(result[f"evaluate_{num_samples}"]["local_batches"]) for result in ranks]
    assert counts[0] == counts[1] > 0
    assert all(batch for result in ranks for batch in result[f"evaluate_{num_samples}"]["local_batches"])


@pytest.mark.parametrize("num_samples", SIZES)
def test_evaluation_loss_equals_the_plain_pytorch_mean_per_sample_loss(
    ranks: list[dict[str, Any]], worker_common: ModuleType, num_samples: int
) -> None:
    expected = plain_pytorch_mean_loss(worker_common, num_samples)
    for result in ranks:
        assert result[f"evaluate_{num_samples}"]["evaluation_loss"] == pytest.approx(expected, rel=1e-6)


def test_eval_epoch_during_training_counts_every_sample_once(
    ranks: list[dict[str, Any]], worker_common: ModuleType
) -> None:
    num_samples = SIZES[0]
    expected = plain_pytorch_mean_loss(worker_common, num_samples)
    for result in ranks:
        assert sorted(result["train_eval"]["gathered"]) == list(range(num_samples))
        assert result["train_eval"]["eval_loss_epoch"] == pytest.approx(expected, rel=1e-6)


def test_gather_concatenates_tensors_of_different_lengths_without_padding(
    ranks: list[dict[str, Any]],
) -> None:
    expected = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [100.0, 101.0]]
    assert [result["gather"] for result in ranks] == [expected, expected]


def test_gather_with_padding_value_strips_the_padding_rows(ranks: list[dict[str, Any]]) -> None:
    # As in 0.1.61 (docs/migration.md): the padding rows are stripped after the gather.
    expected = [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [100.0, 101.0]]
    assert [result["gather_padded"] for result in ranks] == [expected, expected]


def test_gather_with_padding_value_gives_compat_worked_example_three_rows(
    ranks: list[dict[str, Any]],
) -> None:
    # Process 0 holds [[1,2],[3,4]], process 1 [[5,6]], padding_value=-1: 3 rows (was 4 with [-1,-1]).
    expected = [[1, 2], [3, 4], [5, 6]]
    assert [result["gather_compat"] for result in ranks] == [expected, expected]


def test_metric_callback_reading_run_config_works_on_a_fresh_trainers_evaluate(
    ranks: list[dict[str, Any]],
) -> None:
    # evaluate() on a fresh Trainer sets run_config (docs/migration.md); the original's pattern
    # computes the metric on the world main process only.
    evaluations = len(SIZES) + len(GRID) + 2  # evaluate() calls, then the two training runs
    assert [result["mse"]["is_world_process_zero"] for result in ranks] == [
        [True] * evaluations,
        [False] * evaluations,
    ]
    assert len(ranks[0]["mse"]["computed"]) == evaluations
    assert ranks[0]["mse"]["computed"] == pytest.approx(ranks[1]["mse"]["computed"])  # the same gathered rows


def test_eval_batch_size_kwarg_wins_with_two_processes(ranks: list[dict[str, Any]]) -> None:
    # docs/migration.md: per_device_batch_size=16, eval batch_size=64, P=2 -> 64 / 64 / 128.
    for result in ranks:
        assert result["eval_batch_sizes"] == [64]
        assert (result["eval_per_device_batch_size"], result["eval_total_batch_size"]) == (64, 128)


@pytest.mark.parametrize(("num_samples", "batch_size"), GRID)
def test_any_size_and_batch_size_evaluates_each_sample_once_as_one_process_would(
    ranks: list[dict[str, Any]], worker_common: ModuleType, num_samples: int, batch_size: int
) -> None:
    model = worker_common.make_mlp(seed=0)
    x, _ = worker_common.make_data(num_samples, seed=2)
    with torch.no_grad():
        predictions = model(x)
    expected_loss = plain_pytorch_mean_loss(worker_common, num_samples)
    for result in ranks:
        run = result[f"grid_{num_samples}_{batch_size}"]
        assert sorted(run["gathered"]) == list(range(num_samples))
        order = sorted(range(num_samples), key=run["gathered"].__getitem__)
        torch.testing.assert_close(torch.tensor(run["predictions"])[order], predictions)
        assert run["evaluation_loss"] == pytest.approx(expected_loss, rel=1e-6)
    runs = [result[f"grid_{num_samples}_{batch_size}"] for result in ranks]
    assert len(runs[0]["local_batches"]) == len(runs[1]["local_batches"])
    own = [
        [i for batch, pad in zip(run["local_batches"], run["padding"], strict=True) if not pad for i in batch]
        for run in runs
    ]
    assert sorted(own[0] + own[1]) == list(range(num_samples))
    for run in runs:  # a padding batch has zero rows: the callback sees no sample of it
        assert all(
            batch == [] for batch, pad in zip(run["local_batches"], run["padding"], strict=True) if pad
        )


def test_only_a_process_without_samples_gets_a_padding_batch_of_zero_rows(
    ranks: list[dict[str, Any]],
) -> None:
    # 3 samples in batches of 1: no padding, process 0 takes samples 0 and 2 in one batch.
    assert [result["grid_3_1"]["padding"] for result in ranks] == [[False], [False]]
    assert [result["grid_3_1"]["local_batches"] for result in ranks] == [[[0, 2]], [[1]]]
    assert [result["grid_1_3"]["padding"] for result in ranks] == [[False], [True]]
    assert [result["grid_1_3"]["local_batches"] for result in ranks] == [[[0]], [[]]]
