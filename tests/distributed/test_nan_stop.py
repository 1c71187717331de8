"""A NaN loss seen by one process stops the run on every process at the same step, cleanly.

If the stop were decided per process, the other process would wait forever in its next
gradient all-reduce: the worker group would hit the launch timeout and these tests would fail.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.launch import DEFAULT_TIMEOUT_S, WorkerRun, launch_workers

NAN_AT_STEP = 5  # NaNLossOnRank1.nan_at_step in workers/nan_stop.py
SCENARIOS = ["default_callbacks", "check_every_step"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    return launch_workers("nan_stop.py", tmp_path_factory.mktemp("nan_stop"), nproc=2)


def per_rank(run: WorkerRun, scenario: str) -> list[dict[str, Any]]:
    return [result[scenario] for result in run.results]


def test_both_ranks_exit_0_within_the_timeout(run: WorkerRun) -> None:
    assert run.returncode == 0, run.describe()
    assert run.elapsed_s < DEFAULT_TIMEOUT_S
    for scenario in SCENARIOS:
        ranks = per_rank(run, scenario)
        assert [r["num_processes"] for r in ranks] == [2, 2]
        assert [r["world_size"] for r in ranks] == [2, 2]
        # Only rank 1 ever returned a NaN loss, once.
        assert [r["nan_injected_at"] for r in ranks] == [[], [NAN_AT_STEP]]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_both_ranks_stop_at_the_same_global_step(run: WorkerRun, scenario: str) -> None:
    steps = [r["global_step"] for r in per_rank(run, scenario)]
    assert steps[0] == steps[1], steps


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_run_stops_after_the_nan_step_and_before_the_end(run: WorkerRun, scenario: str) -> None:
    for r in per_rank(run, scenario):
        assert NAN_AT_STEP < r["global_step"] < r["planned_steps"], r["global_step"]


def test_checking_every_step_stops_both_ranks_right_after_the_nan_update(run: WorkerRun) -> None:
    # Rank 0's own loss was finite at that step: it stops only because rank 1 saw a NaN.
    assert [r["global_step"] for r in per_rank(run, "check_every_step")] == [NAN_AT_STEP + 1] * 2


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stop_training_error_then_training_run_end_fire_on_both_ranks(run: WorkerRun, scenario: str) -> None:
    for r in per_rank(run, scenario):
        events = r["events"]
        assert events[-2:] == ["on_stop_training_error", "on_training_run_end"], events[-6:]
        assert events.count("on_stop_training_error") == 1
        assert events.count("on_training_run_end") == 1
