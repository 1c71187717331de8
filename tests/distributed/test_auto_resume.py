"""``resume_from="auto"`` on 2 real processes (torchrun, gloo on CPU): the same script is the first
launch (a new run, said once) and the relaunch after both processes were SIGKILLed (every process
resumes from the same state, said once per attempt, and the run ends bitwise equal to the
uninterrupted one).

Under ``torchrun --max-restarts 3``: an exception raised once in a callback is restarted past and the
run ends bitwise equal to the uninterrupted one (the relaunch above meets it: one launch serves
both cases); one raised at the same update on every attempt is recognised as the same failure, and
the restarts run out without training up to it again. After such a failure, the first launch of
the fixed script (its bytes changed) trains to the end on both processes. A relaunch of the
finished run trains nothing and says so once.

The runs are ``workers/auto_resume.py`` (6 updates per epoch on 2 processes, 3 epochs, a state
every 2 updates).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import forked
from tests.helpers import free_port, subprocess_env
from tests.launch import WORKERS_DIR, WorkerRun, launcher, start_workers

TOTAL_UPDATES = 18
KILL_AT_UPDATE = 5  # after the state of update 4
FAIL_ONCE_AT_UPDATE = 9  # in the relaunch (from step_4), after the state of update 8
MAX_RESTARTS = 3


def restarts() -> tuple[str, ...]:
    """torchrun's options for restarts: the c10d rendezvous, on the store torchrun's agent shares
    with the processes (no ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``): every attempt forms its group
    in a namespace of its own there."""
    rendezvous = ("--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    return (*rendezvous, "--max-restarts", str(MAX_RESTARTS))


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
    with pytest.MonkeyPatch.context() as env:  # the relaunch, under torchrun --max-restarts 3
        env.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)
        relaunched = start_workers(
            "auto_resume.py",
            root / "relaunched",
            "--save-dir", str(root / "states"),
            "--fail-at-update", str(FAIL_ONCE_AT_UPDATE),
            "--fail-once", str(root / "failed"),
            torchrun_args=restarts(),
        )  # fmt: skip
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
    # said once per attempt: the relaunch, then torchrun's restart after the exception raised once
    assert run.output.count('resume_from="auto"') == 2, run.describe()
    assert f"from {folder / 'step_4'}, the newest usable state in {folder} (epoch 1, update 4;" in run.output
    for rank in (0, 1):  # every process resumed from the same state: its first update is update 5
        assert logged(run.out_dir, "updates", rank)[0] == ["0", str(KILL_AT_UPDATE)]
    plain = runs["plain"].results[0]
    assert [result["weights"] for result in run.results] == [plain["weights"], plain["weights"]]
    assert [result["global_step"] for result in run.results] == [TOTAL_UPDATES, TOTAL_UPDATES]


def test_a_relaunch_of_the_finished_run_says_nothing_to_train_once_and_trains_nothing(
    runs: dict[str, WorkerRun], tmp_path: Path
) -> None:
    folder = runs["plain"].out_dir.parent / "plain_states"
    again = start_workers("auto_resume.py", tmp_path / "again", "--save-dir", str(folder)).wait()
    # Before: a resume line ("training continues with epoch 4"), a warning on each process and a line.
    assert again.output.count("Nothing to train") == 1, again.describe()
    assert "training continues" not in again.output and "resuming run" not in again.output
    assert f"the state resumed from {folder / 'final'} (the newest usable state in {folder})" in again.output
    plain = runs["plain"].results[0]
    assert [result["weights"] for result in again.results] == [plain["weights"], plain["weights"]]
    assert [result["global_step"] for result in again.results] == [TOTAL_UPDATES, TOTAL_UPDATES]


REPEATED_AT_UPDATE = 15  # after the state of update 14
UPDATE_SLEEP_S = 0.5


def with_restarts(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the worker under ``torchrun --max-restarts 3`` on 2 processes; return it and its seconds."""
    out.mkdir(parents=True)
    started = time.monotonic()
    done = subprocess.run(
        [*launcher(2), *restarts(), str(WORKERS_DIR / "auto_resume.py"), "--out", str(out), *args],
        env={
            name: value
            for name, value in subprocess_env(out).items()
            if name != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
        },
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, time.monotonic() - started


def logged(out: Path, name: str, rank: int) -> list[list[str]]:
    path = out / f"{name}_rank{rank}.log"
    return [line.split(" ", 2) for line in path.read_text().splitlines()] if path.exists() else []


def test_an_exception_raised_once_is_restarted_past_to_the_uninterrupted_weights(
    runs: dict[str, WorkerRun],
) -> None:
    run = runs["relaunched"]  # from step_4; raises once at update 9, after the state of update 8
    assert run.returncode == 0, run.describe()
    folder = run.out_dir.parent / "states"
    assert f"from {folder / 'step_8'}, the newest usable state in {folder} (epoch 2, update 8;" in run.output
    for rank in (0, 1):
        assert [line[2] for line in logged(run.out_dir, "attempts", rank)] == ["RuntimeError", "finished"]
        updates = [(int(attempt), int(update)) for attempt, update in logged(run.out_dir, "updates", rank)]
        assert updates == [(0, u) for u in range(KILL_AT_UPDATE, FAIL_ONCE_AT_UPDATE + 1)] + [
            (1, u) for u in range(FAIL_ONCE_AT_UPDATE, TOTAL_UPDATES + 1)
        ]
    plain = runs["plain"].results[0]["weights"]
    assert [json.loads((run.out_dir / f"rank{r}.json").read_text())["weights"] for r in (0, 1)] == [
        plain,
        plain,
    ]


def test_the_same_exception_on_every_attempt_ends_the_restarts_without_training_up_to_it_again(
    tmp_path: Path,
) -> None:
    out, folder = tmp_path / "repeating", tmp_path / "states"
    done, elapsed = with_restarts(
        out,
        "--save-dir", str(folder),
        "--fail-at-update", str(REPEATED_AT_UPDATE),
        "--update-sleep", str(UPDATE_SLEEP_S),
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    for rank in (0, 1):
        attempts = logged(out, "attempts", rank)
        assert [line[2] for line in attempts] == ["RuntimeError", "RuntimeError"] + [
            "RepeatedFailureError"
        ] * 2
        updates = [(int(attempt), int(update)) for attempt, update in logged(out, "updates", rank)]
        # The first attempt trains up to the failure, the second from the state before it; then none.
        assert updates == [(0, u) for u in range(1, REPEATED_AT_UPDATE + 1)] + [(1, REPEATED_AT_UPDATE)]
        first = float(attempts[0][1])  # at least 15 updates of 0.5 s
        assert all(float(line[1]) < first / 2 for line in attempts[2:]), attempts
    records = folder / ".failures"
    assert output.count('resume_from="auto": the same failure as before, 2 times at update 15') == 2, output
    assert (
        output.count(f"on process 0, 1, each time with the script {WORKERS_DIR / 'auto_resume.py'} (SHA-256 ")
        >= 2
    ), output
    assert output.count(f"(recorded in {records}: rank0.json, rank1.json)") >= 2, output
    assert output.count(f"clear the records of every process first: rm -r {records} ") >= 2, output
    seconds = [float(line[1]) for line in logged(out, "attempts", 0)]
    print(  # the figures (pytest -s): the restarts ran out without training up to the failure again
        f"{MAX_RESTARTS + 1} attempts in {elapsed:.1f} s; seconds in train() per attempt (rank 0): "
        f"{', '.join(f'{value:.1f}' for value in seconds)}; updates trained per attempt: {REPEATED_AT_UPDATE}, 1, 0, 0 "
        f"(without the record: {REPEATED_AT_UPDATE}, 1, 1, 1, and as many restarts as torchrun allows)"
    )


def launch_copy(script: Path, out: Path, *args: str) -> tuple[int, str]:
    """The worker ``script`` (a copy of workers/auto_resume.py) on 2 forked processes: exit code, output."""
    out.mkdir(parents=True)
    launch = forked.start(
        script, ["--out", str(out), *args], nproc=2, env=subprocess_env(out), cwd=out, log=out / "output.log"
    )
    try:
        code = launch.wait(timeout=120)
    except subprocess.TimeoutExpired:
        launch.kill_and_wait()
        raise
    return code, launch.output()


def test_after_a_repeated_failure_on_2_processes_one_launch_of_the_fixed_script_finishes_the_run(
    tmp_path: Path, runs: dict[str, WorkerRun]
) -> None:
    """The failure of both processes, twice at the same update, then a launch held back on both,
    naming both records and the one command that clears them; the script fixed (its bytes changed):
    its first launch trains to the end."""
    script, folder = tmp_path / "job" / "auto_resume.py", tmp_path / "states"
    script.parent.mkdir()
    for name in ("auto_resume.py", "common.py"):
        shutil.copy(WORKERS_DIR / name, script.parent / name)
    failing = ("--save-dir", str(folder), "--fail-at-update", "9")
    outcomes = [launch_copy(script, tmp_path / f"attempt{n}", *failing) for n in range(3)]
    assert [code for code, _ in outcomes] == [1, 1, 1], outcomes[-1][1]
    held_back = outcomes[2][1]
    records = folder / ".failures"
    assert held_back.count("RepeatedFailureError") >= 2, held_back  # on both processes
    assert f"on process 0, 1, each time with the script {script} (SHA-256 " in held_back
    assert f"(recorded in {records}: rank0.json, rank1.json)" in held_back
    assert f"clear the records of every process first: rm -r {records} " in held_back
    assert sorted(p.name for p in records.iterdir()) == ["rank0.json", "rank1.json"]
    script.write_text(script.read_text() + "# fixed\n")  # the fix: the script changed
    code, output = launch_copy(script, tmp_path / "fixed", "--save-dir", str(folder))
    assert code == 0, output
    plain = runs["plain"].results[0]["weights"]
    fixed = [json.loads((tmp_path / "fixed" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [result["weights"] for result in fixed] == [plain, plain]
    assert not records.exists()  # each process cleared its record when its run finished
