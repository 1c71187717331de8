"""Several ``train()`` calls under ``resume_from="auto"`` on 2 real processes (a forked gloo group):
each call is a stage that resumes only its own states, decided alike on both processes (issue 30,
item 9; the 1-process cases, kills at each point among them, are tests/integration/test_stages.py).

The script is ``tests/integration/workers/stages_worker.py`` (32 samples in batches of 8 per
process: 2 updates per epoch; stage 1 the head for 2 epochs, 4 updates; stage 2 the whole network
for 3 epochs, 6 updates; a state every 2 updates). Its run with ``resume_from=None`` is the oracle.
Uninterrupted under ``"auto"``, and relaunched from the states a run stopped after update 8 (stage
2's update 4) leaves, it ends bitwise equal to the oracle on both processes.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.checkpoints.directories import read_manifest
from tests import forked
from tests.helpers import subprocess_env
from tests.integration.workers import stages_worker
from tests.launch import WorkerRun, launch_workers

pytestmark = pytest.mark.distributed

WORKER = str(Path(stages_worker.__file__).resolve())


def launch(out: Path, states: Path, *args: str) -> WorkerRun:
    return launch_workers(WORKER, out, "--save-dir", str(states), *args)


def same_on_both(run: WorkerRun) -> dict[str, Any]:
    first, second = run.results
    assert first["num_processes"] == 2
    assert first == second, "the processes ended differently"
    return first


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("stages_two_processes")
    oracle = same_on_both(launch(root / "oracle", root / "oracle_states", "--resume", "none"))
    # One process with the global batch of two (16): the same updates, the loss of the same samples.
    (root / "one").mkdir()
    one = forked.run(
        WORKER,
        [
            "--out",
            str(root / "one"),
            "--save-dir",
            str(root / "one_states"),
            "--resume",
            "none",
            "--batch",
            "16",
        ],
        env=subprocess_env(root / "one"),
        cwd=root / "one",
        timeout=120,
    )
    assert one.returncode == 0, one.stdout + one.stderr
    one_process = torch.load(root / "one" / "result.pt", weights_only=True)
    states = root / "states"
    uninterrupted = launch(root / "uninterrupted", states)
    # What a run stopped after update 8 leaves: the states up to step_8 (stage 2's step_6 and step_8).
    stopped = root / "stopped_states"
    shutil.copytree(states, stopped, ignore=shutil.ignore_patterns("step_10", "final"))
    relaunched = launch(root / "relaunched", stopped)
    return {
        "oracle": oracle,
        "one_process": one_process,
        "states": states,
        "uninterrupted": uninterrupted,
        "stopped": stopped,
        "relaunched": relaunched,
    }


def test_the_staged_run_on_2_processes_is_the_1_process_run_at_the_same_global_batch(
    runs: dict[str, Any],
) -> None:
    # Before the model was wrapped again when the backbone was unfrozen, DDP all-reduced the head's
    # gradients only: each process trained the backbone on its own half of the batch, and the
    # processes' backbones drifted apart (by up to 0.58 after 6 updates) while the run said nothing.
    oracle, one = runs["oracle"], runs["one_process"]
    assert [call["updates"] for call in one["calls"]] == oracle["updates"] == [4, 6]
    for name, value in one["weights"].items():
        torch.testing.assert_close(torch.tensor(oracle["weights"][name]), value, rtol=1e-5, atol=1e-6)


def test_an_uninterrupted_staged_run_on_2_processes_trains_each_stage_in_full(runs: dict[str, Any]) -> None:
    run = runs["uninterrupted"]
    result = same_on_both(run)
    assert result["updates"] == [4, 6] == runs["oracle"]["updates"]
    assert result["weights"] == runs["oracle"]["weights"]  # bitwise: the floats of both, exactly
    assert run.output.count('resume_from="auto": stage 2 (train() call 2 of the script) starts here') == 1
    stages = {path.name: read_manifest(path)["stage"] for path in runs["states"].iterdir() if path.is_dir()}
    stages.pop(".failures", None)
    assert stages == {"step_2": 1, "step_4": 1, "step_6": 2, "step_8": 2, "step_10": 2, "final": 2}


def test_a_staged_run_relaunched_in_stage_2_on_2_processes_skips_stage_1_and_resumes_its_own_state(
    runs: dict[str, Any],
) -> None:
    run = runs["relaunched"]
    result = same_on_both(run)
    assert result["updates"] == [0, 2]  # stage 1 trains nothing; stage 2 the 2 updates left
    assert result["weights"] == runs["oracle"]["weights"]
    assert run.output.count("stage 1 (train() call 1 of the script) finished in an earlier launch") == 1
    assert run.output.count(f"from {runs['stopped'] / 'step_8'}") == 1
