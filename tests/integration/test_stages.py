"""Several ``train()`` calls in one script under ``resume_from="auto"``: each call is a stage of the
run, and each resumes only its own states (issue 30, item 9).

The script is ``tests/integration/workers/stages_worker.py``: stage 1 trains the head of a small
network with the backbone frozen (2 epochs, 8 updates); the script then unfreezes the backbone and
adds it to the optimizer as a second param group, and stage 2 trains both (3 epochs, 12 updates)
with ``reset_run_history=False``, a state saved every 2 updates. Each test runs it in forked
processes (:mod:`tests.forked`): uninterrupted into an empty folder, SIGKILLed in stage 1, between
the stages and in stage 2 and then relaunched, relaunched once it has finished, and resumed from
states that record no stage (as versions before stages wrote them). Each ends bitwise equal to the
script run uninterrupted with ``resume_from=None``. Before stages, every call resumed the folder's
newest state, whoever saved it: stage 2 resumed stage 1's ``final`` and failed (its optimizer has 2
param groups, the state 1); with the backbone in the optimizer from the start, it took stage 1's
epochs for its own, froze the backbone again and trained 4 of its 12 updates.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.checkpoints.directories import SEAL, read_manifest, write_manifest
from tests import forked
from tests.helpers import subprocess_env
from tests.integration.workers import stages_worker

WORKER = Path(stages_worker.__file__).resolve()
TIMEOUT_S = 120
AUTO = 'resume_from="auto": '


def launch(out: Path, states: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """The script run once into the folder of states ``states`` (its own files under ``out``): the
    finished process and what it wrote at its end (empty when it did not get there)."""
    out.mkdir(parents=True)
    done = forked.run(
        WORKER,
        ["--out", str(out), "--save-dir", str(states), *args],
        env=subprocess_env(out),
        cwd=out,
        timeout=TIMEOUT_S,
    )
    result = out / "result.pt"
    return done, torch.load(result, weights_only=True) if result.exists() else {}


def finished(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout + done.stderr


def killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def auto_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines ``resume_from="auto"`` printed, one per call that chose."""
    return [line for line in done.stdout.splitlines() if line.startswith(AUTO)]


def is_stage_start(line: str, stage: int) -> bool:
    return line.startswith(f"{AUTO}stage {stage}") and "starts" in line


def is_stage_finished(line: str, stage: int) -> bool:
    return line.startswith(AUTO) and f"stage {stage}" in line and "finished" in line


def states_of(folder: Path) -> dict[str, dict[str, Any]]:
    """Each training state of ``folder`` by name: its manifest."""
    manifests = {path.name: read_manifest(path) for path in folder.iterdir() if not path.name.startswith(".")}
    assert None not in manifests.values(), manifests
    return manifests  # type: ignore[return-value]


def saved_updates(folder: Path) -> dict[str, int]:
    """Each state of ``folder`` by name: the update of the run it was saved at."""
    return {name: manifest["run_step"] for name, manifest in states_of(folder).items()}


def saved_stages(folder: Path, unrecorded: int | None = None) -> dict[str, int | None]:
    """Each state of ``folder`` by name: the stage that saved it (``unrecorded`` when not recorded)."""
    return {name: manifest.get("stage", unrecorded) for name, manifest in states_of(folder).items()}


def files_of(folder: Path) -> dict[str, int]:
    """Every file and directory under ``folder``: its modification time."""
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


def assert_equals_oracle(result: dict[str, Any], oracle: dict[str, Any]) -> None:
    found, expected = result["weights"], oracle["weights"]
    assert found.keys() == expected.keys()
    differences = {
        name: float((found[name] - expected[name]).abs().max())
        for name in expected
        if not torch.equal(found[name], expected[name])
    }
    assert differences == {}, f"the weights differ from the uninterrupted run's by up to {differences}"


def relaunch_copy(
    folder: Path, tmp_path: Path
) -> tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]]:
    """The script relaunched into a copy of the folder of states ``folder`` (a module fixture's)."""
    states = tmp_path / "states"
    shutil.copytree(folder, states, symlinks=True)
    return states, *launch(tmp_path / "relaunched", states)


#: The states the script saves, by name: the update of the run each is saved at, and its stage.
UPDATES = {**{f"step_{update}": update for update in range(2, 21, 2)}, "final": 20}
STAGES = {**{f"step_{update}": 1 if update <= 8 else 2 for update in range(2, 21, 2)}, "final": 2}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stages")


@pytest.fixture(scope="module")
def oracle(root: Path) -> dict[str, Any]:
    """The script run uninterrupted with ``resume_from=None``: its result, and ``states``: its folder."""
    states = root / "oracle" / "states"
    done, result = launch(root / "oracle", states, "--resume", "none")
    finished(done)
    assert auto_lines(done) == []
    assert [call["updates"] for call in result["calls"]] == [8, 12]
    assert saved_updates(states) == UPDATES
    return {**result, "states": states}


@pytest.fixture(scope="module")
def uninterrupted(root: Path) -> tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]]:
    """The script run once with ``resume_from="auto"`` into an empty folder."""
    states = root / "uninterrupted" / "states"
    return states, *launch(root / "uninterrupted", states)


def killed_at(root: Path, name: str, kill_at: str) -> Path:
    """The folder of states of the script SIGKILLed at ``kill_at`` (``stage:update``)."""
    states = root / name / "states"
    done, _ = launch(root / name, states, "--kill-at", kill_at)
    killed(done)
    return states


@pytest.fixture(scope="module")
def killed_in_stage_1(root: Path) -> Path:
    """Killed after update 3 of stage 1: its newest state is ``step_2``."""
    states = killed_at(root, "killed_in_stage_1", "1:3")
    assert saved_updates(states) == {"step_2": 2}
    return states


@pytest.fixture(scope="module")
def killed_between_the_stages(root: Path) -> Path:
    """Killed when stage 2's first update starts: its newest state is stage 1's ``final``."""
    states = killed_at(root, "killed_between_the_stages", "2:0")
    assert saved_updates(states) == {"step_2": 2, "step_4": 4, "step_6": 6, "step_8": 8, "final": 8}
    return states


def test_an_uninterrupted_run_trains_each_stage_in_full_and_its_states_record_their_stage(
    uninterrupted: tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]], oracle: dict[str, Any]
) -> None:
    states, done, result = uninterrupted
    finished(done)  # before: stage 2 resumed stage 1's final state and failed (2 param groups, 1 saved)
    first, second = auto_lines(done)
    assert first == f"{AUTO}no training state in {states}, starting a new run"
    assert is_stage_start(second, 2), second
    assert [call["updates"] for call in result["calls"]] == [8, 12]
    assert_equals_oracle(result, oracle)
    # One run: stage 2 continues stage 1's id, update count and state names.
    assert result["calls"][0]["run_id"] == result["calls"][1]["run_id"]
    assert result["calls"][1]["steps_before"] == 8
    assert {manifest["run_id"] for manifest in states_of(states).values()} == {result["calls"][0]["run_id"]}
    assert saved_updates(states) == UPDATES
    assert saved_stages(states) == STAGES
    assert saved_stages(oracle["states"]) == STAGES  # resume_from=None records the stages alike


def test_a_relaunch_after_the_script_finished_trains_nothing_in_either_call_and_changes_no_state(
    uninterrupted: tuple[Path, subprocess.CompletedProcess[str], dict[str, Any]],
    oracle: dict[str, Any],
    tmp_path: Path,
) -> None:
    states, first_launch, _ = uninterrupted
    finished(first_launch)
    written = files_of(states)
    done, result = launch(tmp_path / "relaunched", states)
    finished(done)
    (line,) = auto_lines(done)  # stage 2 resumes its final state: the line of a finished run instead
    assert is_stage_finished(line, 1), line
    assert done.stdout.count("Nothing to train") == 2, done.stdout  # one per call
    assert result["calls"][0]["events"] == []  # stage 1 loaded nothing and fired no event
    assert [call["updates"] for call in result["calls"]] == [0, 0]
    assert_equals_oracle(result, oracle)  # stage 2 loaded its final state
    assert files_of(states) == written


def test_a_run_killed_in_stage_1_is_finished_by_the_same_script(
    killed_in_stage_1: Path, oracle: dict[str, Any], tmp_path: Path
) -> None:
    states, done, result = relaunch_copy(killed_in_stage_1, tmp_path)
    finished(done)
    resumed, started = auto_lines(done)
    assert resumed.startswith(f"{AUTO}resuming run ") and f"from {states / 'step_2'}, " in resumed, resumed
    assert is_stage_start(started, 2), started
    assert [call["updates"] for call in result["calls"]] == [6, 12]
    assert_equals_oracle(result, oracle)
    assert (saved_updates(states), saved_stages(states)) == (UPDATES, STAGES)


def test_a_run_killed_between_the_stages_starts_stage_2_from_stage_1s_final_state(
    killed_between_the_stages: Path, oracle: dict[str, Any], tmp_path: Path
) -> None:
    states, done, result = relaunch_copy(killed_between_the_stages, tmp_path)
    finished(done)
    (started,) = auto_lines(done)  # stage 1 loads its final state: the line of a finished run instead
    assert is_stage_start(started, 2), started
    assert done.stdout.count("Nothing to train") == 1, done.stdout
    assert [call["updates"] for call in result["calls"]] == [0, 12]
    assert result["calls"][1]["steps_before"] == 8  # the run goes on from stage 1's 8 updates
    assert_equals_oracle(result, oracle)
    assert (saved_updates(states), saved_stages(states)) == (UPDATES, STAGES)
    assert len({manifest["run_id"] for manifest in states_of(states).values()}) == 1


def test_a_run_killed_in_stage_2_skips_stage_1_and_resumes_stage_2s_own_state(
    root: Path, oracle: dict[str, Any], tmp_path: Path
) -> None:
    states = killed_at(root, "killed_in_stage_2", "2:7")  # after run update 15
    assert max(saved_updates(states).values()) == 14  # the newest state: step_14
    done, result = launch(tmp_path / "relaunched", states)
    finished(done)
    skipped, resumed = auto_lines(done)
    assert is_stage_finished(skipped, 1), skipped
    assert resumed.startswith(f"{AUTO}resuming run ") and f"from {states / 'step_14'}, " in resumed, resumed
    assert result["calls"][0]["events"] == []  # stage 1 loaded nothing and fired no event
    assert [call["updates"] for call in result["calls"]] == [0, 6]
    assert_equals_oracle(result, oracle)
    assert (saved_updates(states), saved_stages(states)) == (UPDATES, STAGES)


@pytest.mark.parametrize("when", ["killed_in_stage_1", "killed_between_the_stages"])
def test_states_that_record_no_stage_are_of_stage_1(
    when: str, request: pytest.FixtureRequest, oracle: dict[str, Any], tmp_path: Path
) -> None:
    states = tmp_path / "states"
    shutil.copytree(request.getfixturevalue(when), states, symlinks=True)
    for state in states.iterdir():  # as versions before stages wrote them
        if not state.name.startswith("."):
            manifest, written = read_manifest(state), (state / "manifest.json").stat()
            assert manifest is not None
            write_manifest(
                state, {key: value for key, value in manifest.items() if key not in ("stage", SEAL)}
            )
            # Kept as written: of two states at one update, the newest is the one written last.
            os.utime(state / "manifest.json", ns=(written.st_atime_ns, written.st_mtime_ns))
    assert set(saved_stages(states).values()) == {None}
    done, result = launch(tmp_path / "relaunched", states)
    finished(done)
    *resumed, started = auto_lines(done)
    if when == "killed_in_stage_1":  # stage 1 resumes step_2 as its own
        (line,) = resumed
        assert line.startswith(f"{AUTO}resuming run ") and f"from {states / 'step_2'}, " in line, line
    else:  # stage 1 loads its final state, which has nothing left to train
        assert resumed == [] and done.stdout.count("Nothing to train") == 1, done.stdout
    assert is_stage_start(started, 2), started  # and stage 2 starts after them
    assert_equals_oracle(result, oracle)
    assert saved_updates(states) == UPDATES


def test_a_range_test_before_the_stages_is_no_stage(oracle: dict[str, Any], tmp_path: Path) -> None:
    states = tmp_path / "states"
    done, result = launch(tmp_path / "first", states, "--range-test")
    finished(done)
    assert_equals_oracle(result, oracle)  # the range test put everything back
    # Before: the range test's train() counted as stage 1, so the script's calls saved stages 2 and
    # 3, and a relaunch without the range test took its first call for a finished stage.
    assert saved_stages(states) == STAGES
    done, result = launch(tmp_path / "relaunched", states)  # without the range test
    finished(done)
    assert [call["updates"] for call in result["calls"]] == [0, 0]
    assert_equals_oracle(result, oracle)


def test_a_stage_stopped_by_a_signal_does_not_start_the_next_and_the_relaunch_finishes_the_run(
    oracle: dict[str, Any], tmp_path: Path
) -> None:
    states = tmp_path / "states"
    done, result = launch(tmp_path / "stopped", states, "--signal", "1:3")
    finished(done)  # no torchrun: the stopped run returns, and the script goes on
    # Before: stage 2 started from stage 1's 3 updates, and every relaunch took stage 1 as finished.
    (started, not_started) = auto_lines(done)
    assert not_started.startswith(f"{AUTO}stage 2 does not start: stage 1 was stopped by a signal"), (
        not_started
    )
    stopped_at = result["calls"][0]["updates"]  # the stop comes at the next signal check
    assert 3 <= stopped_at < 8 and result["calls"][1]["updates"] == 0
    assert max(saved_updates(states).values()) == stopped_at and set(saved_stages(states).values()) == {1}
    done, result = launch(tmp_path / "relaunched", states)
    finished(done)
    assert [call["updates"] for call in result["calls"]] == [8 - stopped_at, 12]
    assert_equals_oracle(result, oracle)
    stop_state = f"step_{stopped_at}"
    assert saved_updates(states) == {**UPDATES, stop_state: stopped_at}
    assert saved_stages(states) == {**STAGES, stop_state: 1}
