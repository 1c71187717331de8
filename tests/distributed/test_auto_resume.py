"""``resume_from="auto"`` on 2 real processes (torchrun, gloo on CPU): the same script is the first
launch (a new run, said once) and the relaunch after both processes were SIGKILLed (every process
resumes from the same state, said once, and the run ends bitwise equal to the uninterrupted one).

The runs are ``workers/auto_resume.py`` (6 updates per epoch on 2 processes, 3 epochs, a state
every 2 updates).
"""

from __future__ import annotations

import pytest

from tests.launch import WorkerRun, start_workers

TOTAL_UPDATES = 18
KILL_AT_UPDATE = 5  # after the state of update 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    root = tmp_path_factory.mktemp("auto_resume")
    plain = start_workers("auto_resume.py", root / "plain", "--save-dir", str(root / "plain_states"))
    killed = start_workers(
        "auto_resume.py",
        root / "killed",
        "--save-dir", str(root / "states"),
        "--kill-at-update", str(KILL_AT_UPDATE),
        expect_success=False,
    )  # fmt: skip
    done = {"plain": plain.wait(), "killed": killed.wait()}
    relaunched = start_workers("auto_resume.py", root / "relaunched", "--save-dir", str(root / "states"))
    return {**done, "relaunched": relaunched.wait()}


def test_first_launch_says_once_that_it_starts_a_new_run(runs: dict[str, WorkerRun]) -> None:
    run, folder = runs["plain"], runs["plain"].out_dir.parent / "plain_states"
    assert run.output.count('resume_from="auto"') == 1, run.describe()
    assert f'resume_from="auto": no training state in {folder}, starting a new run' in run.output
    assert [result["num_processes"] for result in run.results] == [2, 2]
    assert [result["global_step"] for result in run.results] == [TOTAL_UPDATES, TOTAL_UPDATES]


def test_relaunch_after_sigkill_resumes_on_every_process_from_the_same_state_to_the_same_weights(
    runs: dict[str, WorkerRun],
) -> None:
    killed, run = runs["killed"], runs["relaunched"]
    assert killed.returncode != 0 and killed.results == [None, None], killed.describe()
    folder = run.out_dir.parent / "states"
    assert run.output.count('resume_from="auto"') == 1, run.describe()
    assert f"from {folder / 'step_4'}, the newest usable state in {folder} (epoch 1, update 4;" in run.output
    plain = runs["plain"].results[0]
    assert [result["weights"] for result in run.results] == [plain["weights"], plain["weights"]]
    assert [result["global_step"] for result in run.results] == [TOTAL_UPDATES, TOTAL_UPDATES]
