"""Early stopping, save-best and the EMA callback on a real group of 2 CPU processes.

The ranks are given different scripted metrics: if each decided alone, rank 0 would stop at
epoch 3 while rank 1 trained on and waited forever in its next gradient all-reduce, and the
group would hit the launch timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.launch import WorkerRun, launch_workers


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    run = launch_workers("callbacks_worker.py", tmp_path_factory.mktemp("callbacks"), nproc=2)
    for scenario in ("early_stopping", "ema"):
        assert [r[scenario]["num_processes"] for r in run.results] == [2, 2], run.describe()
    return run


def per_rank(run: WorkerRun, scenario: str) -> list[dict[str, Any]]:
    return [result[scenario] for result in run.results]


def test_early_stopping_stops_both_ranks_at_rank_0s_epoch(run: WorkerRun) -> None:
    for r in per_rank(run, "early_stopping"):
        assert r["epochs_run"] == 3
        assert r["global_step"] == 3 * r["steps_per_epoch"]
        assert r["last_events"] == ["on_stop_training_error", "on_training_run_end"]


def test_save_best_follows_rank_0_and_reloads_epoch_2_on_both_ranks(run: WorkerRun) -> None:
    ranks = per_rank(run, "early_stopping")
    # Rank 1's own metric improved at epoch 3; rank 0's decision (no improvement) holds.
    assert [r["best_epoch"] for r in ranks] == [2, 2]
    for r in ranks:
        assert r["final_minus_epoch_2"] == 0.0
        assert r["final_minus_epoch_3"] > 0.0
    assert ranks[0]["final_weights"] == ranks[1]["final_weights"]
    saved = torch.load(run.out_dir / "best.pt", weights_only=True)
    assert (saved["epoch"], saved["eval_loss_epoch"]) == (2, 0.8)


def test_ema_weights_are_equal_on_both_ranks_and_follow_every_update(run: WorkerRun) -> None:
    ranks = per_rank(run, "ema")
    assert ranks[0]["ema_weights"] == ranks[1]["ema_weights"]
    for r in ranks:
        assert r["num_updates"] == 2 * 4  # 32 samples / (2 processes x 4) per epoch, 2 epochs
        assert r["ema_minus_hand"] < 1e-6
        assert r["model_minus_ema"] > 1e-3


def test_ema_eval_loss_is_recorded_each_epoch_and_agreed_by_both_ranks(run: WorkerRun) -> None:
    ranks = per_rank(run, "ema")
    assert ranks[0]["ema_model_eval_loss_epoch"] == ranks[1]["ema_model_eval_loss_epoch"]
    assert ranks[0]["best_epoch"] == ranks[1]["best_epoch"]
    for r in ranks:
        assert len(r["ema_model_eval_loss_epoch"]) == 2
        assert r["ema_model_eval_loss_epoch"] != r["eval_loss_epoch"]
    saved = torch.load(Path(run.out_dir) / "ema.pt", weights_only=True)
    losses = ranks[0]["ema_model_eval_loss_epoch"]
    assert saved["epoch"] == ranks[0]["best_epoch"] == losses.index(min(losses)) + 1
