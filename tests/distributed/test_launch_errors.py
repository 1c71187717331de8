"""A group launched so that accelerate would not join it fails at once, with an error that says how to launch."""

from __future__ import annotations

import pytest

from tests.launch import WorkerRun, launch_workers

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    return launch_workers(
        "launch_error.py",
        tmp_path_factory.mktemp("launch_error"),
        nproc=2,
        timeout_s=TIMEOUT_S,
        expect_success=False,
    )


def test_each_process_raises_a_runtime_error_naming_both_launch_fixes(run: WorkerRun) -> None:
    for rank, result in enumerate(run.results):
        assert result is not None, f"rank {rank} wrote no result.\n{run.describe()}"
        assert result["error_type"] == "RuntimeError", run.describe()
        assert "torchrun --nproc_per_node 2" in result["message"]
        assert "ACCELERATE_USE_CPU=1" in result["message"]
        assert "WORLD_SIZE=2" in result["message"]


def test_group_exits_non_zero_with_the_error_in_its_output_without_hanging(run: WorkerRun) -> None:
    assert run.returncode != 0, run.describe()
    assert run.elapsed_s < TIMEOUT_S
    assert "RuntimeError" in run.output, run.describe()
    assert "torchrun --nproc_per_node 2" in run.output, run.describe()
    assert "ACCELERATE_USE_CPU=1" in run.output, run.describe()
