"""ConvertSyncBatchNormCallback converts the model's batch norms before accelerate wraps it, on a
real group of 2 CPU processes, and leaves a single process's model alone.

torch synchronises batch norm only on GPU-like devices (SyncBatchNorm's training forward raises
for CPU tensors in torch 2.x), so on CPU the group shows the conversion, evaluates correctly
(running statistics, no synchronisation) and is refused training with a clear error: no
training run is faked here.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import WorkerRun, launch_workers, load_worker_module
from torch import nn

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    run: WorkerRun = launch_workers("syncbn_worker.py", tmp_path_factory.mktemp("syncbn2"), nproc=2)
    assert [r["num_processes"] for r in run.results] == [2, 2], run.describe()
    assert [r["world_size"] for r in run.results] == [2, 2]
    return run.results


def oracle_eval_loss() -> float:
    """Plain PyTorch: the unconverted model in eval mode over the whole evaluation set."""
    worker = load_worker_module("syncbn_worker")
    common = load_worker_module("common")
    model = worker.make_bn_model().eval()
    x, y = common.make_data(worker.NUM_EVAL_SAMPLES)
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


def test_batch_norms_are_sync_batch_norms_in_the_model_wrapped_for_two_processes(two: list[dict[str, Any]]) -> None:
    for result in two:
        assert result["converted"] is True
        assert result["kinds_after_init"] == ["SyncBatchNorm"]
        assert result["wrapper"] == "DistributedDataParallel"
        assert result["kinds_in_wrapped_model"] == ["SyncBatchNorm"]


def test_the_optimizer_still_updates_every_parameter_of_the_converted_model(two: list[dict[str, Any]]) -> None:
    assert [r["optimizer_holds_every_parameter"] for r in two] == [True, True]


def test_converted_model_evaluates_like_the_original_on_cpu(two: list[dict[str, Any]]) -> None:
    expected = oracle_eval_loss()
    assert [r["evaluation_loss"] for r in two] == pytest.approx([expected, expected], rel=1e-6)


def test_training_on_cpu_processes_is_refused_with_a_message_naming_the_fix(two: list[dict[str, Any]]) -> None:
    for result in two:
        assert result["device"] == "cpu"
        assert result["train_error"] is not None
        assert "torch can only synchronise them on GPUs" in result["train_error"]
        assert "Remove the callback for runs on 'cpu' processes." in result["train_error"]


def test_one_process_keeps_its_batch_norm_and_trains(tmp_path: Any) -> None:
    (result,) = launch_workers("syncbn_worker.py", tmp_path, nproc=1).results
    assert result["converted"] is False
    assert result["model_is_the_given_one"] is True
    assert result["kinds_after_init"] == result["kinds_in_wrapped_model"] == ["BatchNorm1d"]
    assert result["train_error"] is None
