"""The range test and Optuna's pruning on a real group of 2 processes (tests/distributed/workers/tune_worker.py):
the range test gives the losses and the suggestion of one process at the same global batch, a
train() after it is bit for bit the one without it, and a trial pruned by the main process's
study ends train() with TrialPruned on both processes after the same evaluation, and under
resume_from="auto" is never recorded as a failure (so never held back as a repeated one)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from tests.launch import launch_workers

pytest.importorskip("optuna")

RANGE = {"start_lr": 1e-3, "end_lr": 100.0, "num_steps": 40}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return launch_workers("tune_worker.py", tmp_path_factory.mktemp("tune"), "--batch", "8", nproc=2).results


def one_process_range_test(worker_common: ModuleType) -> Any:
    torch.manual_seed(0)
    model = nn.Linear(worker_common.NUM_FEATURES, worker_common.NUM_OUTPUTS)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=())
    return trainer.find_learning_rate(
        worker_common.linear_targets_dataset(256), per_device_batch_size=16, **RANGE
    )


def test_two_processes_give_the_one_process_losses_and_suggestion_at_the_same_global_batch(
    ranks: list[dict[str, Any]], worker_common: ModuleType
) -> None:
    expected = one_process_range_test(worker_common)
    first, second = (rank["range_test"] for rank in ranks)
    assert first == second  # the losses are averaged over the processes: the same on each
    assert expected.diverged and first["diverged"] and len(first["losses"]) == len(expected.losses) < 40
    assert first["learning_rates"] == pytest.approx(expected.learning_rates, rel=1e-12)
    assert first["losses"] == pytest.approx(expected.losses, rel=1e-4)
    assert first["suggestion"] == expected.suggestion


def test_a_train_after_the_range_test_is_bit_for_bit_the_train_without_it_on_every_process(
    ranks: list[dict[str, Any]],
) -> None:
    for rank in ranks:
        assert rank["after_range_test"] == rank["without_range_test"]
    assert ranks[0]["after_range_test"] == ranks[1]["after_range_test"]


def test_a_trial_pruned_on_the_main_process_ends_train_on_every_process_after_the_same_evaluation(
    ranks: list[dict[str, Any]],
) -> None:
    pruned = [rank["pruned"] for rank in ranks]
    assert [p["outcome"] for p in pruned] == ["pruned", "pruned"]
    # Two epochs of 8 updates (64 samples, 2 x 4 per batch), pruned after the second evaluation.
    assert [p["global_step"] for p in pruned] == [16, 16]
    assert pruned[0]["eval_losses"] == pruned[1]["eval_losses"] and len(pruned[0]["eval_losses"]) == 2
    assert pruned[0]["reported"] == {"0": pruned[0]["eval_losses"][0], "1": pruned[0]["eval_losses"][1]}
    assert pruned[1]["reported"] is None  # rank 1 holds no study


def test_a_trial_that_is_not_pruned_reports_every_epoch_and_runs_to_its_end(
    ranks: list[dict[str, Any]],
) -> None:
    runs = [rank["not_pruned"] for rank in ranks]
    assert [r["outcome"] for r in runs] == ["completed", "completed"] and [
        r["global_step"] for r in runs
    ] == [40, 40]
    assert runs[0]["reported"] == {str(epoch): loss for epoch, loss in enumerate(runs[0]["eval_losses"])}


def test_a_pruned_trial_under_auto_resume_records_no_failure_on_any_process(
    ranks: list[dict[str, Any]],
) -> None:
    # Before: each launch recorded a failure on each process; the third was a RepeatedFailureError.
    assert [rank["auto_pruned"] for rank in ranks] == [["pruned"] * 3] * 2
    assert [rank["records_left"] for rank in ranks] == [False, False]
