"""NaN on one rank only, on 2 processes: both ranks refuse the same save and stop at the same
step, every kept training state is finite, and the job exits 0 (one launch, several onsets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from tests.launch import WorkerRun, launch_workers

ONSETS = tuple(range(1, 13))  # workers/nan_safety.py: every update of an epoch
CHECK_EVERY = 10  # TerminateOnNaNCallback's default


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    return launch_workers("nan_safety.py", tmp_path_factory.mktemp("nan_safety"), nproc=2)


def test_both_ranks_exit_0_and_stop_at_the_same_step_soon_after_the_nan(run: WorkerRun) -> None:
    assert run.returncode == 0, run.describe()
    for onset in ONSETS:
        ranks = [result[str(onset)] for result in run.results]
        assert [r["num_processes"] for r in ranks] == [2, 2]
        steps = [r["global_step"] for r in ranks]
        assert steps[0] == steps[1], (onset, steps)
        assert onset <= steps[0] < onset + CHECK_EVERY, (onset, steps)


@pytest.mark.parametrize("onset", ONSETS)
def test_every_kept_state_is_finite_and_the_newest_is_the_last_before_the_nan(
    run: WorkerRun, onset: int
) -> None:
    save_dir = run.out_dir / f"states-{onset}"
    steps = {}
    for directory in save_dir.iterdir() if save_dir.exists() else ():  # none before a NaN at update 1 or 2
        assert not directory.name.startswith("."), f"left behind: {directory}"
        weights = safe_torch_load(directory / "model.pt")
        assert all(bool(torch.isfinite(value).all()) for value in weights.values()), directory
        steps[json.loads((directory / "manifest.json").read_text())["global_step"]] = directory
    last_finite_save = 2 * ((onset - 1) // 2)
    assert sorted(steps) == [step for step in (last_finite_save - 2, last_finite_save) if step > 0]


def test_the_refusal_names_the_state_the_step_and_the_process_that_saw_the_nan(run: WorkerRun) -> None:
    refused = Path(run.out_dir / "states-8" / "step_8")
    assert (
        f"Training stopped: Not saving the training state {str(refused)!r} at step 8: the weights hold NaN or "
        f"infinity (on process 0, 1) and the training loss of this epoch was NaN or infinite (on process 1)"
    ) in run.output
