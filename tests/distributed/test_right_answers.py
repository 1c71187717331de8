"""Right answers on several processes (workers/right_answers.py), against plain-PyTorch oracles.

One launch on 2 processes and one on 1 (overlapped), each running every case:
token-count weighting with ``num_items_in_batch`` as an int / 0-d / 1-element tensor, training
over a stream, evaluating a stream each sample once, and data sets that differ across processes.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from tests.launch import start_workers

LR = 0.5
KINDS = ["int", "0d", "1element"]
ONE_PASS = [(0, 8), (8, 16), (16, 20)]  # 20 samples, 8 per update (the last update: 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    out = tmp_path_factory.mktemp("right_answers")
    groups = {
        nproc: start_workers("right_answers.py", out / f"nproc{nproc}", nproc=nproc) for nproc in (2, 1)
    }
    return {nproc: group.wait().results for nproc, group in groups.items()}


def token_oracle(common: ModuleType, chunks: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    """SGD where each update's gradient is that of the mean over every token of its samples."""
    model = common.make_mlp(seed=0)
    x, y = common.make_data(20, seed=1)
    counts = (1 + torch.arange(20) % 4).float()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    for start, end in chunks:
        per_sample = ((model(x[start:end]) - y[start:end]) ** 2).mean(dim=1)
        loss = (per_sample * counts[start:end]).sum() / counts[start:end].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.state_dict()


def assert_weights_equal(weights: dict[str, Any], expected: dict[str, torch.Tensor]) -> None:
    for name, value in expected.items():
        torch.testing.assert_close(
            torch.tensor(weights[name], dtype=torch.float64), value.double(), rtol=1e-5, atol=1e-6
        )


def test_the_group_had_two_processes(runs: dict[int, list[dict[str, Any]]]) -> None:
    assert [result["world_size"] for result in runs[2]] == [2, 2]
    assert runs[1][0]["world_size"] == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nproc", [1, 2])
def test_num_items_in_batch_weights_every_token_of_the_update_on_all_processes(
    runs: dict[int, list[dict[str, Any]]], worker_common: ModuleType, kind: str, nproc: int
) -> None:
    expected = token_oracle(worker_common, ONE_PASS)
    for result in runs[nproc]:
        assert result[f"items_{kind}"]["global_step"] == 3
        assert_weights_equal(result[f"items_{kind}"]["weights"], expected)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_stream_trains_until_it_ends_with_a_partial_last_window(
    runs: dict[int, list[dict[str, Any]]], worker_common: ModuleType, nproc: int
) -> None:
    expected = token_oracle(worker_common, ONE_PASS)
    for result in runs[nproc]:
        stream = result["stream"]
        assert (stream["global_step"], stream["epochs"], stream["steps_per_epoch"]) == (3, 1, None)
        assert_weights_equal(stream["weights"], expected)


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_stream_trains_for_max_num_train_steps_over_several_passes(
    runs: dict[int, list[dict[str, Any]]], worker_common: ModuleType, nproc: int
) -> None:
    expected = token_oracle(worker_common, ONE_PASS + ONE_PASS[:2])
    for result in runs[nproc]:
        stream = result["stream_max_steps"]
        assert (stream["global_step"], stream["epochs"]) == (5, 2)
        assert_weights_equal(stream["weights"], expected)


@pytest.mark.parametrize("num_samples", [1, 3, 33])
@pytest.mark.parametrize("nproc", [1, 2])
def test_evaluating_a_stream_counts_each_sample_once(
    runs: dict[int, list[dict[str, Any]]], worker_common: ModuleType, num_samples: int, nproc: int
) -> None:
    model = worker_common.make_mlp(seed=0)
    x, y = worker_common.make_data(num_samples, seed=2)
    with torch.no_grad():
        predictions = model(x)
    expected_loss = ((predictions - y) ** 2).mean(dim=1).double().mean().item()
    for result in runs[nproc]:
        evaluated = result[f"eval_stream_{num_samples}"]
        assert sorted(evaluated["indices"]) == list(range(num_samples))
        order = sorted(range(num_samples), key=evaluated["indices"].__getitem__)
        torch.testing.assert_close(torch.tensor(evaluated["predictions"])[order], predictions)
        assert evaluated["loss"] == pytest.approx(expected_loss, rel=1e-6)


@pytest.mark.parametrize(
    ("case", "argument", "shown"),
    [
        ("split_error", "train_dataset", "30 samples, Subset indices hash 0x"),
        ("length_error", "train_dataset", "process 0: 16 samples; process 1: 17 samples"),
        ("evaluate_error", "dataset", "process 0: 16 samples; process 1: 17 samples"),
    ],
)
def test_data_sets_that_differ_across_processes_fail_on_every_process_before_training(
    runs: dict[int, list[dict[str, Any]]], case: str, argument: str, shown: str
) -> None:
    for result in runs[2]:
        message = result[case]
        assert message is not None and message.startswith(f"{argument} differs across processes")
        assert shown in message
        assert "random_split(dataset, lengths, generator=torch.Generator().manual_seed(0))" in message
    assert runs[2][0]["split_error"] == runs[2][1]["split_error"]
    assert runs[1][0][case] is None  # one process: nothing to compare


def test_a_seeded_split_is_the_same_everywhere(runs: dict[int, list[dict[str, Any]]]) -> None:
    assert [result["seeded_split_error"] for result in runs[2]] == [None, None]
