"""A group launched so that accelerate would not join it fails at once, with an error that says
how to fix it: here the docs' pattern, a Trainer subclass whose ``_create_accelerator`` returns
``Accelerator(mixed_precision="bf16")``, under torchrun on a machine without GPUs; and the fix the
recipe shows (``cpu=True`` there) forms one group."""

from __future__ import annotations

import pytest
import torch

from tests.launch import WorkerRun, start_workers

TIMEOUT_S = 60.0

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the case of a machine without GPUs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    groups = {  # started together, so that their start-ups overlap
        mode: start_workers(
            "launch_error.py",
            tmp_path_factory.mktemp(mode),
            "--mode",
            mode,
            nproc=2,
            timeout_s=TIMEOUT_S * 2,
            expect_success=mode == "fixed",
            torchrun=True,  # the launch check is under test
        )
        for mode in ("override", "fixed")
    }
    return {mode: group.wait() for mode, group in groups.items()}


@pytest.fixture(scope="module")
def run(runs: dict[str, WorkerRun]) -> WorkerRun:
    return runs["override"]


def test_each_process_raises_a_runtime_error_naming_the_override_and_both_fixes(run: WorkerRun) -> None:
    for rank, result in enumerate(run.results):
        assert result is not None, f"rank {rank} wrote no result.\n{run.describe()}"
        assert result["error_type"] == "RuntimeError", run.describe()
        message = result["message"]
        assert message.startswith(
            "The launcher started 2 processes (WORLD_SIZE=2), but each one joined a group of 1: they "
            "would all train the whole run separately. The Accelerator comes from "
            "BF16Trainer._create_accelerator, and on a machine without GPUs accelerate forms a group "
            "of processes only when told to run on the CPU"
        ), message
        assert (
            "Create it with Accelerator(cpu=True, mixed_precision='bf16', ...) in BF16Trainer._create"
            in message
        )
        assert "`ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 script.py`" in message
        assert "launch with `torchrun --nproc_per_node 2" not in message  # the launch was right


def test_group_exits_non_zero_with_the_error_in_its_output_without_hanging(run: WorkerRun) -> None:
    assert run.returncode != 0, run.describe()
    assert run.elapsed_s < TIMEOUT_S * 2
    assert "RuntimeError" in run.output, run.describe()
    assert "BF16Trainer._create_accelerator" in run.output, run.describe()
    assert "ACCELERATE_USE_CPU=1" in run.output, run.describe()


def test_the_recipes_override_with_cpu_true_forms_one_group_of_two_in_bf16(
    runs: dict[str, WorkerRun],
) -> None:
    results = runs["fixed"].results
    assert results == [{"num_processes": 2, "mixed_precision": "bf16", "global_step": 2}] * 2, runs[
        "fixed"
    ].describe()
