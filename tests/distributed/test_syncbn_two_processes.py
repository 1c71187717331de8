"""ConvertSyncBatchNormCallback on a real group of 2 CPU processes, and on one process.

torch supports SyncBatchNorm only on GPU-like devices: DistributedDataParallel refuses to wrap a
CPU model holding one ("SyncBatchNorm layers only work with GPU modules") and its training
forward raises for CPU tensors (torch 2.14). So on CPU processes the callback leaves the model
unchanged and says so, and the same script still trains. The conversion itself (on GPUs) needs
a machine with two GPUs and is not exercised here: no GPU run is faked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.launch import WorkerRun, launch_workers

NOTICE = "ConvertSyncBatchNormCallback: torch supports SyncBatchNorm only on"


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    run = launch_workers("syncbn_worker.py", tmp_path_factory.mktemp("syncbn2"), nproc=2)
    assert [r["num_processes"] for r in run.results] == [2, 2], run.describe()
    assert [r["world_size"] for r in run.results] == [2, 2]
    assert [r["device"] for r in run.results] == ["cpu", "cpu"]
    return run


def test_cpu_processes_keep_their_batch_norm_in_the_wrapped_model(two: WorkerRun) -> None:
    for result in two.results:
        assert result["converted"] is False
        assert result["model_is_the_given_one"] is True
        assert result["kinds_after_init"] == ["BatchNorm1d"]
        assert result["wrapper"] == "DistributedDataParallel"
        assert result["kinds_in_wrapped_model"] == ["BatchNorm1d"]


def test_cpu_processes_say_once_that_batch_norm_stays_per_process(two: WorkerRun) -> None:
    assert two.output.count(NOTICE) == 1, two.describe()  # printed by the node's main process
    assert "batch-norm statistics stay per process in this run." in two.output


def test_cpu_processes_evaluate_and_train_the_unchanged_model(two: WorkerRun) -> None:
    # The worker's plain-PyTorch oracle: the untouched model in eval mode over the whole set.
    expected = two.results[0]["oracle_eval_loss"]
    assert [r["evaluation_loss"] for r in two.results] == pytest.approx([expected, expected], rel=1e-6)
    # 16 samples, batches of 4 over 2 processes: 2 updates per epoch, 2 epochs.
    assert [r["global_step"] for r in two.results] == [4, 4]


def test_one_process_keeps_its_batch_norm_silently(tmp_path: Path) -> None:
    run = launch_workers("syncbn_worker.py", tmp_path, nproc=1)
    (result,) = run.results
    assert result["num_processes"] == 1
    assert result["converted"] is False
    assert result["model_is_the_given_one"] is True
    assert result["kinds_after_init"] == result["kinds_in_wrapped_model"] == ["BatchNorm1d"]
    assert result["global_step"] == 8
    assert NOTICE not in run.output
