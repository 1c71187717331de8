"""Exact resume on 2 real processes (gloo on CPU), and a clean stop on SIGTERM.

Four runs of ``workers/resume_worker.py``, two at a time to share their start-up:

1. uninterrupted, saving a training state every 4 optimizer steps;
2. stopped by SIGTERM sent to both worker processes while rank 0 waits after step 5 (and rank
   1 waits for it inside the next gradient all-reduce);
3. resumed on 2 processes from run 1's state at step 12 (mid-epoch);
4. relaunched with ``resume_from`` the folder where run 2 saved its states.

3 and 4 must end bitwise equal to 1 (dropout draws on each process, so each rank's RNG state
must come back to that rank).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.launch import DEFAULT_TIMEOUT_S, RunningGroup, WorkerRun, start_workers

TOTAL_STEPS = 27  # 3 epochs x 9 steps, in workers/resume_worker.py
PAUSE_AT_STEP = 5
# SaveTrainingStateCallback's processes agree on a signal every 10 steps and at every epoch
# end: the first agreement after step 5 is the end of epoch 1, at step 9.
STOP_STEP = 9
MID_EPOCH_STEP = 12  # step 3 of epoch 2: batch 6 of 17


def send_sigterm_to_both_once_paused(group: RunningGroup) -> None:
    pid_files = [group.out_dir / f"pid{rank}" for rank in (0, 1)]
    deadline = time.monotonic() + DEFAULT_TIMEOUT_S
    while not ((group.out_dir / "paused").exists() and all(path.exists() for path in pid_files)):
        if not group.running() or time.monotonic() > deadline:
            run = group.wait()
            pytest.fail(
                f"The run ended or hung before rank 0 paused at step {PAUSE_AT_STEP}.\n{run.describe()}"
            )
        time.sleep(0.05)
    for path in pid_files:
        os.kill(int(path.read_text()), signal.SIGTERM)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    root = tmp_path_factory.mktemp("resume_two_processes")
    uninterrupted = start_workers(
        "resume_worker.py", root / "uninterrupted", "--save-dir", str(root / "states")
    )
    stopped = start_workers(
        "resume_worker.py",
        root / "sigterm",
        "--save-dir", str(root / "sigterm_states"),
        "--pause-at-step", str(PAUSE_AT_STEP),
    )  # fmt: skip
    send_sigterm_to_both_once_paused(stopped)
    done = {"uninterrupted": uninterrupted.wait(), "sigterm": stopped.wait()}
    # What the stopped run left, before the relaunch saves more states into the same folder.
    sigterm_states = root / "sigterm_states"
    done["sigterm"].saved = {  # type: ignore[attr-defined]
        p.name: json.loads((p / "manifest.json").read_text())
        for p in sigterm_states.iterdir()
        if (p / "manifest.json").exists()
    }
    resumed = start_workers(
        "resume_worker.py",
        root / "resumed",
        "--save-dir", str(root / "resumed_states"),
        "--resume-from", str(root / "states" / f"step_{MID_EPOCH_STEP}"),
    )  # fmt: skip
    relaunched = start_workers(
        "resume_worker.py",
        root / "relaunched",
        "--save-dir", str(root / "sigterm_states"),
        "--resume-from", str(root / "sigterm_states"),
    )  # fmt: skip
    return {**done, "resumed": resumed.wait(), "relaunched": relaunched.wait()}


def test_every_run_has_two_processes_whose_final_weights_agree(runs: dict[str, WorkerRun]) -> None:
    for name, run in runs.items():
        assert [r["num_processes"] for r in run.results] == [2, 2], name
        assert [r["world_size"] for r in run.results] == [2, 2], name
        assert run.results[0]["weights"] == run.results[1]["weights"], name
    assert runs["uninterrupted"].results[0]["progress"]["global_step"] == TOTAL_STEPS


def test_state_at_step_12_was_saved_mid_epoch_by_two_processes(runs: dict[str, WorkerRun]) -> None:
    states = runs["uninterrupted"].out_dir.parent / "states"
    manifest = json.loads((states / f"step_{MID_EPOCH_STEP}" / "manifest.json").read_text())
    assert (manifest["num_processes"], manifest["epoch"], manifest["batch_index"]) == (2, 1, 6)


@pytest.mark.parametrize("name", ["resumed", "relaunched"])
def test_run_resumed_mid_epoch_on_two_processes_ends_with_the_uninterrupted_weights(
    runs: dict[str, WorkerRun], name: str
) -> None:
    expected, resumed = runs["uninterrupted"].results[0], runs[name].results[0]
    assert resumed["signal_received"] is None
    assert resumed["weights"] == expected["weights"]
    assert resumed["progress"] == expected["progress"]
    assert resumed["metrics"]["eval_loss_epoch"] == expected["metrics"]["eval_loss_epoch"]


@pytest.mark.parametrize("name", ["resumed", "relaunched"])
def test_run_resumed_mid_epoch_on_two_processes_records_the_uninterrupted_training_losses(
    runs: dict[str, WorkerRun], name: str
) -> None:
    expected, resumed = runs["uninterrupted"].results[0], runs[name].results[0]
    assert resumed["metrics"]["train_loss_epoch"] == expected["metrics"]["train_loss_epoch"]


def test_sigterm_to_both_processes_saves_one_state_at_the_same_step_and_both_exit_0(
    runs: dict[str, WorkerRun],
) -> None:
    run = runs["sigterm"]
    assert run.returncode == 0, run.describe()
    assert [r["signal_received"] for r in run.results] == [signal.SIGTERM, signal.SIGTERM]
    assert [r["progress"]["global_step"] for r in run.results] == [STOP_STEP, STOP_STEP]
    saved = run.saved  # type: ignore[attr-defined]
    assert sorted(saved) == ["epoch_1", "step_4", "step_8"]  # stopped at the end of epoch 1 (step 9)
    manifest = saved["epoch_1"]
    assert manifest["global_step"] == STOP_STEP and manifest["num_processes"] == 2
    assert (manifest["epoch"], manifest["batch_index"]) == (
        1,
        0,
    )  # saved at the epoch end: resumes at epoch 2
    assert {"rng_state_0.pt", "rng_state_1.pt"} <= set(manifest["files"])
