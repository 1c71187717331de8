"""A save that fails on one rank of 2 raises on both, at once, and leaves nothing behind.

A state whose RNG file of rank 1 alone is damaged is skipped by both ranks when resuming from
its folder: they agree on the state to load. Rank 0 alone creates the state's directory, so a parent that is a file fails there only;
rank 1 alone runs under a file-size limit, so writing its own RNG file fails there only. The
other rank must not wait forever for the one that failed: each raises, the failed rank with
the OS error, the other naming the rank to look at. Afterwards both save again in step and
resume from the earlier state.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.launch import WorkerRun, launch_workers

TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    out = tmp_path_factory.mktemp("save_faults")
    return launch_workers(
        "save_faults.py",
        out,
        "--cases",
        "parent_is_file,fsize,damaged_rank_file",
        "--fault-rank",
        "1",
        timeout_s=TIMEOUT_S,
    )


def results(run: WorkerRun, case: str) -> list[dict[str, Any]]:
    return [result[case] for result in run.results]


def test_parent_that_is_a_file_fails_on_rank_0_and_raises_on_both_ranks(run: WorkerRun) -> None:
    state = run.out_dir / "blocker" / "states" / "step-2"
    own, other = results(run, "parent_is_file")
    assert own["type"] == other["type"] == "CheckpointWriteError", run.describe()
    assert own["message"].startswith(
        f"Could not save the training state to {state}: Not a directory (errno 20)"
    )
    assert own["message"].endswith(f"{run.out_dir / 'blocker'} is a file, not a folder: choose another path.")
    assert other["message"] == (
        f"Could not save the training state to {state}: process 0 failed to write it (its output says "
        f"why). Nothing was written; the previous states are intact."
    )


def test_file_size_limit_on_rank_1_raises_on_both_ranks_naming_its_file_and_the_rank(run: WorkerRun) -> None:
    state = run.out_dir / "states" / "fsize-step-2"
    other, own = results(run, "fsize")
    assert own["errno"] == 27, run.describe()
    assert own["message"].startswith(
        f"Could not save the training state to {state}: File too large (errno 27) while writing "
        f"{run.out_dir / 'states' / '.fsize-step-2.incomplete' / 'rng_state_1.pt'}."
    )
    assert "process 1 failed to write it" in other["message"]


def test_after_the_failures_both_ranks_save_again_resume_and_leave_no_litter(run: WorkerRun) -> None:
    for case in ("parent_is_file", "fsize"):
        assert [result["resumed_global_step"] for result in results(run, case)] == [4, 4]
        assert (run.out_dir / "states" / f"{case}-after" / "manifest.json").exists()
    hidden = [path for path in run.out_dir.rglob(".*") if path.relative_to(run.out_dir).parts[0] != "tmp"]
    assert hidden == []
    assert run.elapsed_s < TIMEOUT_S


def test_a_state_damaged_for_rank_1_only_is_skipped_by_both_ranks_when_resuming(run: WorkerRun) -> None:
    resumed = results(run, "damaged_rank_file")
    assert [result["start_step"] for result in resumed] == [2, 2], run.describe()  # epoch-1's state
    assert [result["global_step"] for result in resumed] == [6, 6]
    warnings = [result["skipped"] for result in resumed]
    assert [len(skipped) for skipped in warnings] == [1, 1]
    for (warning,) in warnings:
        assert warning.startswith(f"Skipped the training state {run.out_dir / 'fallback' / 'epoch-2'}: ")
        assert warning.endswith(f"Resuming from {run.out_dir / 'fallback' / 'epoch-1'} instead.")
    assert "process 1 could not read it (its output says why)" in warnings[0][0]  # rank 0
    assert "rng_state_1.pt" in warnings[1][0]  # rank 1 names its file
