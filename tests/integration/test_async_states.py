"""Training states written in the background: ``save_training_state(..., asynchronous=True)``
and ``SaveTrainingStateCallback(asynchronous=True)``.

The state written in the background equals, file by file, the state saved synchronously at the
same step; the save returns before the state is published; faults are real and happen in a
subprocess (tests/distributed/workers/async_states.py): a SIGKILL while the background thread
writes, and a file-size limit that makes the background write fail. 2 processes:
tests/distributed/test_async_states_two_processes.py.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.directories import MANIFEST, read_manifest
from pytorch_accelerated.checkpoints.discovery import candidate_states
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from pytorch_accelerated.schedulers import CosineLrScheduler
from tests import forked
from tests.helpers import assert_equal_nested, make_regression_data, subprocess_env
from tests.launch import WORKERS_DIR

WORKER = WORKERS_DIR / "async_states.py"


class SaveBothWays(TrainerCallback):
    """After update 3: a synchronous save, then an asynchronous one of the very same state."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.published_on_return: bool | None = None
        self.sync_s = self.async_s = 0.0

    def on_train_step_end(self, trainer: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if not is_update_step or trainer.progress.global_step != 3:
            return
        start = time.perf_counter()
        trainer.save_training_state(self.folder / "sync", checkpoint_kwargs={"note": "same"})
        self.sync_s = time.perf_counter() - start
        start = time.perf_counter()
        trainer.save_training_state(
            self.folder / "async", checkpoint_kwargs={"note": "same"}, asynchronous=True
        )
        self.async_s = time.perf_counter() - start
        self.published_on_return = (self.folder / "async").exists()


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SaveBothWays]:
    folder = tmp_path_factory.mktemp("async_equality")
    torch.manual_seed(0)
    # About 2M parameters (24 MB with Adam's state): a write that takes a while; dropout uses the RNG.
    model = nn.Sequential(
        nn.Linear(3, 1400), nn.ReLU(), nn.Dropout(0.2), nn.Linear(1400, 1400), nn.Linear(1400, 1)
    )
    both = SaveBothWays(folder)
    # The callback's own states (also written in the background) give it a state to compare.
    saver = SaveTrainingStateCallback(
        str(folder / "periodic"), save_every_n_steps=1, save_at_end=False, asynchronous=True
    )
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-3), callbacks=(saver, both)
    )
    trainer.train(
        make_regression_data(24), num_epochs=1, per_device_batch_size=4,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(),
    )  # fmt: skip
    return folder, both


def test_async_state_equals_the_sync_state_at_the_same_step_file_by_file(
    both_ways: tuple[Path, SaveBothWays],
) -> None:
    folder, _ = both_ways
    sync, background = folder / "sync", folder / "async"
    names = sorted(path.name for path in sync.iterdir())
    assert names == sorted(path.name for path in background.iterdir())
    assert {
        "model.pt",
        "optimizer.pt",
        "scheduler.pt",
        "trainer_state.pt",
        "rng_state_0.pt",
        MANIFEST,
    } <= set(names)
    for name in names:
        if name == MANIFEST:
            assert read_manifest(sync) == read_manifest(background)
        else:
            assert_equal_nested(safe_torch_load(sync / name), safe_torch_load(background / name), name)
    trainer_state = safe_torch_load(background / "trainer_state.pt")
    assert trainer_state["callbacks"]  # the callback state was compared too
    assert trainer_state["progress"]["global_step"] == 3 and trainer_state["checkpoint_kwargs"] == {
        "note": "same"
    }


def test_async_save_returns_before_the_state_is_published(both_ways: tuple[Path, SaveBothWays]) -> None:
    folder, both = both_ways
    assert both.published_on_return is False
    assert read_manifest(folder / "async") is not None  # published later, by the end of the run
    # Every periodic state was published, the last one by the end of the run, and nothing is left hidden.
    assert sorted(path.name for path in (folder / "periodic").iterdir()) == [f"step_{n}" for n in range(1, 7)]
    assert [path.name for path in folder.rglob(".*")] == []


def test_asynchronous_must_be_a_bool() -> None:
    with pytest.raises(
        TypeError, match="SaveTrainingStateCallback: asynchronous must be True or False, got 'yes'"
    ):
        SaveTrainingStateCallback(asynchronous="yes")  # type: ignore[arg-type]


def run_worker(tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tmp").mkdir()
    args = ["--out", str(tmp_path), "--mode", mode]
    return forked.run(WORKER, args, cwd=tmp_path, env=subprocess_env(tmp_path / "tmp"), timeout=120)


def test_sigkill_during_the_background_write_leaves_the_previous_state_and_no_published_partial_one(
    tmp_path: Path,
) -> None:
    finished = run_worker(tmp_path, "kill")
    assert finished.returncode == -9, finished.stdout + finished.stderr
    states = tmp_path / "states"
    assert not (states / "step_2").exists()
    hidden = states / ".step_2.incomplete"
    assert hidden.is_dir() and read_manifest(hidden) is None  # killed while being written, never published
    assert candidate_states(states) == ([states / "step_1"], False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 1200), nn.Linear(1200, 1200), nn.Linear(1200, 2))
    trainer = Trainer(model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-3), callbacks=())
    assert trainer.load_training_state(states)["current_epoch"] == 1
    assert trainer.progress.global_step == 1


def test_failing_background_write_raises_at_the_next_save_and_at_the_end_of_the_run(tmp_path: Path) -> None:
    finished = run_worker(tmp_path, "fsize")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    states = tmp_path / "states"
    for key, name, step in (("at_next_save", "step_2", 2), ("at_end", "step_4", 4)):
        error = result[key]
        assert error["type"] == "CheckpointWriteError" and error["errno"] == 27, error
        assert error["message"].startswith(
            f"Could not save the training state to {states / name}: File too large (errno 27)"
        )
        assert "Nothing was written; the previous states are intact." in error["message"]
        assert f"(It was being written in the background, after update step {step};" in error["message"]
    # The failed states left nothing; the save at step 3 did not run (the error came first).
    assert sorted(path.name for path in states.iterdir()) == ["step_1"]
    assert read_manifest(states / "step_1")["global_step"] == 1


def test_a_folder_that_turns_unwritable_during_a_background_save_is_named_with_what_was_left(
    tmp_path: Path,
) -> None:
    finished = run_worker(tmp_path, "readonly")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    if result["writable"]:
        pytest.skip("neither chattr +i nor chmod made the folder unwritable here")
    states = tmp_path / "states"
    message = result["error"]["message"]
    assert result["error"]["type"] == "CheckpointWriteError", result["error"]
    assert message.startswith(f"Could not save the training state to {states / 'step_1'}: ")
    # Its clean-up could not remove the hidden directory from the unwritable folder: said, not denied.
    # The run's folder lock could not be removed either: a warning says so, and the error that
    # ended the run is the one the user sees (not the lock's).
    assert result["left"] == [".run.lock", ".step_1.incomplete"]
    assert f"Could not remove this run's lock {states / '.run.lock'}" in finished.stderr
    assert "Nothing was written" not in message
    assert (
        f"Nothing was published, but the hidden directory {states / '.step_1.incomplete'} could not be removed "
        f"(is {states} read-only?): remove it once the folder is writable again (it is never taken for a state); "
        "the previous states are intact."
    ) in message
