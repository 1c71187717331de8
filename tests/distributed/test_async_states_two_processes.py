"""Training states written in the background on 2 real processes (gloo on CPU), and an exact resume.

Run 1 (``workers/async_states.py --mode resume``) saves a state every 3 updates with
``SaveTrainingStateCallback(asynchronous=True, max_checkpoints=3)``: each rank writes its own
files in the background, rank 0 publishes once every rank's files are on disk. Run 2 resumes on
2 processes from run 1's ``step_15`` (mid-epoch, dropout drawing on each rank) and must end
bitwise equal to run 1.

Beside run 1, ``--mode fsize`` with a file-size limit on process 1 only: its background write
fails, so process 0 (whose own files are fine) must not publish the state, and both processes
raise the error at the next save and at the end of the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.launch import launch_workers, start_workers


def test_async_states_on_two_processes_are_published_rotated_and_resume_exactly(tmp_path: Path) -> None:
    states = tmp_path / "states"
    faults = start_workers("async_states.py", tmp_path / "fsize", "--mode", "fsize", "--fault-rank", "1")
    first = launch_workers(
        "async_states.py", tmp_path / "first", "--mode", "resume", "--save-dir", str(states)
    )
    check_the_failed_background_writes(faults.wait().results, tmp_path / "fsize" / "states")
    # Saved at updates 3, 6, ..., 18 and at the end (20); rotation keeps the newest 3, never counting
    # a state still being written; nothing is left hidden.
    assert sorted(path.name for path in states.iterdir()) == ["final", "step_15", "step_18"]
    second = launch_workers(
        "async_states.py", tmp_path / "second", "--mode", "resume",
        "--save-dir", str(tmp_path / "states_resumed"), "--resume-from", str(states / "step_15"),
    )  # fmt: skip
    for rank in (0, 1):
        assert second.results[rank]["global_step"] == first.results[rank]["global_step"] == 20
        assert second.results[rank]["weights"] == first.results[rank]["weights"]


def check_the_failed_background_writes(results: list[dict[str, Any]], states: Path) -> None:
    for key, name in (("at_next_save", "step_2"), ("at_end", "step_4")):
        own, other = results[1][key], results[0][key]
        assert own["type"] == other["type"] == "CheckpointWriteError", results
        assert own["message"].startswith(
            f"Could not save the training state to {states / name}: File too large (errno 27)"
        )
        assert other["message"].startswith(
            f"Could not save the training state to {states / name}: process 1 could not write its files (File too large"
        )
        assert all(
            "Nothing was written; the previous states are intact." in error["message"]
            for error in (own, other)
        )
    # Never published (process 0's own files were fine), and nothing left hidden.
    assert sorted(path.name for path in states.iterdir()) == ["step_1"]
