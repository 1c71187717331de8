"""End-to-end runs of examples/tune_digits.py: a search in a real SQLite file (on one process and on
a 2-process group), a worker SIGKILLed mid-trial and launched again, and two workers sharing one
study in a real PostgreSQL server that the test starts (tests/postgres.py).

Every worker is the example's script in a process of its own (:mod:`tests.forked`); the studies are
read back with Optuna from their databases.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests import forked
from tests.helpers import REPO_ROOT, subprocess_env

optuna = pytest.importorskip("optuna")

EXAMPLE = REPO_ROOT / "examples" / "tune_digits.py"
TIMEOUT_S = 180
#: A small search: 3 trials of 4 epochs, trial 0 never pruned, epoch 0 never pruned.
SEARCH = ("--trials", "3", "--epochs", "4", "--startup-trials", "1", "--warmup-epochs", "1")


def arguments(folder: Path, storage: str, *extra: str) -> list[str]:
    return [*SEARCH, "--storage", storage, "--states-dir", str(folder / "states"), *extra]


def run_worker(folder: Path, storage: str, *extra: str, nproc: int = 1) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    result = forked.run(
        EXAMPLE,
        arguments(folder, storage, *extra),
        nproc=nproc,
        env=subprocess_env(folder),
        cwd=folder,
        timeout=TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def trials_of(storage: str) -> list[tuple[Any, ...]]:
    """Each trial of the study: number, state, values, intermediate values (the record a search leaves)."""
    study = optuna.load_study(study_name="digits-search", storage=storage)
    return [(t.number, t.state.name, t.params, t.value, t.intermediate_values) for t in study.trials]


def started(output: str) -> list[int]:
    return [int(number) for number in re.findall(r"^TRIAL (\d+) STARTED", output, flags=re.MULTILINE)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    folder = tmp_path_factory.mktemp("uninterrupted")
    storage = f"sqlite:///{folder / 'study.db'}"
    return run_worker(folder, storage), storage, folder


def test_a_search_in_sqlite_runs_every_trial_once_and_cleans_up_its_states(
    uninterrupted: tuple[str, str, Path],
) -> None:
    output, storage, folder = uninterrupted
    trials = trials_of(storage)
    assert [number for number, *_ in trials] == [0, 1, 2] and started(output) == [0, 1, 2]
    assert {state for _, state, *_ in trials} <= {"COMPLETE", "PRUNED"}
    for _, state, _, value, reported in trials:  # a complete trial reported all 4 epochs
        assert value == reported[max(reported)] and (state == "PRUNED" or list(reported) == [0, 1, 2, 3])
    assert re.search(r"^STUDY 3 of 3 trials finished: \d complete, \d pruned$", output, flags=re.MULTILINE)
    assert list((folder / "states").iterdir()) == []  # each told trial's states are removed


def test_a_worker_killed_mid_trial_resumes_it_and_the_study_ends_as_an_uninterrupted_one(
    uninterrupted: tuple[str, str, Path], tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    launch = forked.start(EXAMPLE, arguments(tmp_path, storage), env=subprocess_env(tmp_path), cwd=tmp_path)
    saved = tmp_path / "states" / "trial_1" / "epoch_2"  # trial 1 has finished its second epoch
    deadline = time.monotonic() + TIMEOUT_S
    while not saved.exists() and launch.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    launch.kill()
    launch.wait(30)
    first = launch.output()
    assert saved.exists() and "STUDY " not in first, first  # killed during trial 1
    assert [state for _, state, *_ in trials_of(storage)][1] == "RUNNING"

    second = run_worker(tmp_path, storage)
    assert re.search(r"^TRIAL 1 RESUMED on ", second, flags=re.MULTILINE), second
    assert re.search(r"resume_from=\"auto\": resuming run \S+ from \S+/trial_1/epoch_", second), second
    assert started(first) == [0, 1] and started(second) == [2]
    assert trials_of(storage) == trials_of(uninterrupted[1])


def test_a_search_under_two_processes_suggests_what_one_process_does(
    uninterrupted: tuple[str, str, Path], tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    output = run_worker(tmp_path, storage, "--trials", "2", "--epochs", "2", nproc=2)
    assert (
        len(re.findall(r"^STUDY 2 of 2 trials finished", output, flags=re.MULTILINE)) == 1
    )  # the main process
    two = trials_of(storage)
    assert [params for _, _, params, *_ in two] == [
        params for _, _, params, *_ in trials_of(uninterrupted[1])[:2]
    ]
    assert all(state in ("COMPLETE", "PRUNED") for _, state, *_ in two)


pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def test_two_workers_share_one_postgresql_study_and_run_each_trial_once(tmp_path: Path) -> None:
    """worker-a starts trial 0 and is then stopped (SIGSTOP: a slow or descheduled worker) while
    worker-b runs: worker-b must leave trial 0 alone and run the others, and worker-a, let go on once
    worker-b is done, finish trial 0 and start no more. Started together instead, whichever worker
    imports torch first could take every trial before the other asks (CI saw it), which proves
    nothing about sharing."""
    from tests.postgres import postgres_server

    def launch(name: str) -> forked.ForkedLaunch:
        return forked.start(
            EXAMPLE,
            arguments(tmp_path / name, storage, "--trials", "4", "--epochs", "2", "--worker-id", name),
            env=subprocess_env(tmp_path),
            cwd=tmp_path,
            log=tmp_path / f"{name}.log",
        )

    with postgres_server() as storage:
        worker_a = launch("worker-a")
        deadline = time.monotonic() + TIMEOUT_S
        while not started(worker_a.output()) and worker_a.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started(worker_a.output()), worker_a.output()
        worker_a.send_signal(signal.SIGSTOP)
        try:
            worker_b = launch("worker-b")
            code_b = worker_b.wait(TIMEOUT_S)
        finally:
            worker_a.send_signal(signal.SIGCONT)
        codes = [worker_a.wait(TIMEOUT_S), code_b]
        outputs = [worker_a.output(), worker_b.output()]
        assert codes == [0, 0], outputs
        study = optuna.load_study(study_name="digits-search", storage=storage)
        trials = study.trials
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert sorted(t.number for t in finished) == list(range(4)), outputs
    assert [t for t in trials if t not in finished and not t.user_attrs.get("surplus")] == []
    runs = started(outputs[0]) + started(outputs[1])
    assert sorted(runs) == list(range(4))  # every trial started once, by one worker
    assert 0 in started(outputs[0]) and started(outputs[1]), outputs  # each worker ran a trial
    assert {t.user_attrs["worker"] for t in finished} == {"worker-a", "worker-b"}
    assert all(
        t.user_attrs["worker"] == ("worker-a" if t.number in started(outputs[0]) else "worker-b")
        for t in finished
    )


def test_the_main_job_trains_with_the_range_test_s_suggestion(tmp_path: Path) -> None:
    script = REPO_ROOT / "examples" / "train_digits.py"
    result = forked.run(
        script,
        ["--find-lr", "--epochs", "1", "--output-dir", str(tmp_path / "out")],
        env=subprocess_env(tmp_path),
        cwd=tmp_path,
        timeout=TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    found = re.findall(r"^RANGE_TEST suggestion=([0-9.e-]+) ", output, flags=re.MULTILINE)
    assert len(found) == 1 and 1e-4 < float(found[0]) < 1.0, output
    assert (tmp_path / "out" / "lr_finder.png").stat().st_size > 0
    assert re.search(r"^FINAL test_accuracy=0\.[89]\d+$", output, flags=re.MULTILINE), output
