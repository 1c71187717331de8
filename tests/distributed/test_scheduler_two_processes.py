"""A schedule created from placeholders ends on its final value at the last update, on 2 processes.

The original library stepped the scheduler once per process per update, so a schedule built
from the number of updates per epoch ended after 1/P of the run.
"""

from __future__ import annotations

import pytest

from tests.launch import WorkerRun, launch_workers

RUNS = ["cosine-1", "cosine-2", "wsd-1", "wsd-2"]
LR_MIN = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    run: WorkerRun = launch_workers("scheduler_end.py", tmp_path_factory.mktemp("scheduler_end"), nproc=2)
    return run.results


@pytest.mark.parametrize("name", RUNS)
def test_schedule_is_stepped_once_per_update_and_ends_on_lr_min_at_the_last_update(
    runs: list[dict], name: str
) -> None:
    for result in (runs[0][name], runs[1][name]):
        assert result["num_processes"] == 2
        total_updates = 3 * result["steps_per_epoch"]
        assert result["global_step"] == result["scheduler_updates"] == total_updates
        assert len(result["lrs"]) == total_updates
        assert result["lrs"][-1] == pytest.approx(LR_MIN, rel=1e-9, abs=1e-12)
        # Still decaying right before the end: the schedule was not squeezed into part of the run.
        assert result["lrs"][-2] > LR_MIN * 1.01


@pytest.mark.parametrize("name", RUNS)
def test_both_processes_follow_the_same_schedule(runs: list[dict], name: str) -> None:
    assert runs[0][name]["lrs"] == runs[1][name]["lrs"]


def test_accumulation_halves_the_updates_per_epoch_on_two_processes(runs: list[dict]) -> None:
    # 7 batches per process per epoch: 7 updates, or 4 with 2 batches per update.
    assert runs[0]["cosine-1"]["steps_per_epoch"] == 7
    assert runs[0]["cosine-2"]["steps_per_epoch"] == 4
