"""Checkpoint and training-state faults: failed saves clean up, loads are all or nothing, a damaged
newest state is skipped. (Bad checkpoint files given to load: tests/unit/test_checkpoints.py.)

Faults are real: files truncated, emptied or replaced on disk; saves that fail under a
file-size limit (``RLIMIT_FSIZE``), with a real SIGINT, or under a parent that is a file (we
run as root, so permissions would prove nothing), in a subprocess where they would harm the
test runner. The same worker runs on 2 processes in tests/distributed/test_save_faults.py.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.checkpoints.directories import MANIFEST, read_manifest
from pytorch_accelerated.checkpoints.torch_files import (
    CheckpointFileError,
    CheckpointWriteError,
    safe_torch_load,
)
from tests import forked
from tests.helpers import (
    assert_equal_nested,
    make_linear_model,
    make_regression_data,
    reseal_state,
    snapshot,
    subprocess_env,
)
from tests.helpers import make_trainer as make_any_trainer
from tests.launch import WORKERS_DIR

SAVE_FAULTS_WORKER = WORKERS_DIR / "save_faults.py"


make_trainer = functools.partial(make_any_trainer, optimizer_class=torch.optim.Adam, lr=0.1)


def train(trainer: Trainer, **kwargs: Any) -> Trainer:
    trainer.train(
        make_regression_data(8), num_epochs=kwargs.pop("num_epochs", 1), per_device_batch_size=4, **kwargs
    )
    return trainer


# ---------------------------------------------------------------------------- failed saves


@pytest.fixture(scope="module")
def save_faults(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One process: a first state saved, then each case of workers/save_faults.py."""
    out = tmp_path_factory.mktemp("save_faults")
    (out / "tmp").mkdir()
    args = ["--out", str(out), "--cases", "fsize,parent_is_file,interrupt,checkpoint_fsize"]
    finished = forked.run(SAVE_FAULTS_WORKER, args, cwd=out, env=subprocess_env(out / "tmp"), timeout=120)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    return out, json.loads((out / "rank0.json").read_text())


def hidden_litter(folder: Path) -> list[str]:
    """Hidden files and folders (``.<name>.incomplete``, ``.<name>.<random>.tmp``) outside tmp/."""
    found = (path.relative_to(folder) for path in folder.rglob(".*"))
    return sorted(str(path) for path in found if path.parts[0] != "tmp")


def test_save_over_a_file_size_limit_names_the_state_the_file_and_the_os_error(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, results = save_faults
    result = results["fsize"]
    assert result["type"] == "CheckpointWriteError" and result["errno"] == 27
    state = out / "states" / "fsize-step-2"
    assert result["message"].startswith(
        f"Could not save the training state to {state}: File too large (errno 27) while writing "
    )
    assert f"{out / 'states' / '.fsize-step-2.incomplete'}/" in result["message"]
    assert "Nothing was written; the previous states are intact." in result["message"]
    assert not state.exists()


def test_failed_saves_leave_no_incomplete_directory_or_temporary_file(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = save_faults
    assert hidden_litter(out) == []


def test_previous_state_still_loads_and_resumes_after_each_failed_save(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, results = save_faults
    assert {case: result["resumed_global_step"] for case, result in results.items()} == dict.fromkeys(
        results, 8
    )
    assert read_manifest(out / "states" / "step-1")["global_step"] == 4


def test_save_under_a_parent_that_is_a_file_names_the_path_and_the_file(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, results = save_faults
    result = results["parent_is_file"]
    assert result["type"] == "CheckpointWriteError" and result["errno"] == 20
    assert result["message"].startswith(
        f"Could not save the training state to {out / 'blocker' / 'states' / 'step-2'}: Not a directory"
    )
    assert result["message"].endswith(f"{out / 'blocker'} is a file, not a folder: choose another path.")


def test_sigint_during_a_failing_write_raises_keyboard_interrupt_not_torchs_error(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, results = save_faults
    assert results["interrupt"]["type"] == "KeyboardInterrupt"
    assert not (out / "states" / "interrupt-step-2").exists()


def test_failed_save_checkpoint_keeps_the_previous_file_and_names_it(
    save_faults: tuple[Path, dict[str, Any]],
) -> None:
    out, results = save_faults
    result = results["checkpoint_fsize"]
    path = out / "model.pt"
    assert result["type"] == "CheckpointWriteError" and result["errno"] == 27
    assert result["message"].startswith(
        f"Could not save the checkpoint to {path}: File too large (errno 27) while writing "
    )
    assert f"Nothing was written; {path} is unchanged." in result["message"]
    assert safe_torch_load(path)["version"] == 1


@pytest.mark.parametrize("method", ["save_checkpoint", "save_training_state"])
def test_save_under_a_parent_that_is_a_file_in_process_leaves_nothing(tmp_path: Path, method: str) -> None:
    (tmp_path / "blocker").write_text("a file")
    with pytest.raises(
        CheckpointWriteError, match=f"Could not save the .* to {tmp_path / 'blocker' / 'x'}"
    ) as error:
        getattr(train(make_trainer()), method)(tmp_path / "blocker" / "x")
    assert str(error.value).endswith(f"{tmp_path / 'blocker'} is a file, not a folder: choose another path.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocker"]


# ---------------------------------------------------------------------------- all-or-nothing loads


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with two good states: after 2 updates (step-2) and after 4 (step-4)."""
    folder = tmp_path_factory.mktemp("states")
    trainer = train(make_trainer())
    trainer.save_training_state(folder / "step-2")
    resumed = train(make_trainer(), num_epochs=2, resume_from=folder / "step-2")
    resumed.save_training_state(folder / "step-4")
    return folder


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGES = [
    pytest.param(
        "optimizer.pt",
        truncate,
        CheckpointFileError,
        "optimizer.pt is damaged: its bytes changed after it was saved",
        id="truncated-optimizer",
    ),
    pytest.param(
        "optimizer.pt", Path.unlink, FileNotFoundError, "is missing optimizer.pt", id="missing-optimizer"
    ),
    pytest.param(
        "trainer_state.pt",
        truncate,
        CheckpointFileError,
        "trainer_state.pt is damaged: its bytes changed after it was saved",
        id="truncated-trainer-state",
    ),
    pytest.param(
        "rng_state_0.pt",
        truncate,
        CheckpointFileError,
        "rng_state_0.pt is damaged: its bytes changed after it was saved",
        id="truncated-rng",
    ),
    pytest.param(
        "rng_state_0.pt", Path.unlink, FileNotFoundError, "is missing rng_state_0.pt", id="missing-rng"
    ),
]


@pytest.mark.parametrize("name, damage, error_type, message", DAMAGES)
@pytest.mark.parametrize("how", ["load_training_state", "resume_from"])
def test_damaged_state_raises_naming_the_file_and_changes_nothing(
    tmp_path: Path, states: Path, name: str, damage: Any, error_type: type, message: str, how: str
) -> None:
    state = shutil.copytree(states / "step-4", tmp_path / "step-4")
    damage(state / name)
    trainer = train(make_trainer(seed=1))
    before = snapshot(trainer)
    with pytest.raises(error_type, match=message):
        if how == "load_training_state":
            trainer.load_training_state(state)
        else:
            train(trainer, num_epochs=3, resume_from=state)
    assert_equal_nested(snapshot(trainer), before)


def test_optimizer_state_of_another_optimizer_is_refused_before_the_model_is_loaded(tmp_path: Path) -> None:
    train(make_trainer()).save_checkpoint(tmp_path / "ckpt.pt")
    model = make_linear_model(seed=1)
    groups = [{"params": [model.weight]}, {"params": [model.bias], "lr": 0.01}]
    trainer = Trainer(model, nn.MSELoss(), torch.optim.Adam(groups, lr=0.1), callbacks=())
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(
        RuntimeError,
        match=r"ckpt.pt \(optimizer_state_dict\) does not fit this optimizer: it holds 1 parameter group\(s\) of \[2\]",
    ):
        trainer.load_checkpoint(tmp_path / "ckpt.pt")
    assert_equal_nested(model.state_dict(), before)


# ---------------------------------------------------------------------------- fallback


def test_manifest_records_that_the_state_is_finite(states: Path) -> None:
    assert read_manifest(states / "step-4")["finite"] is True


def nan_weights(state: Path) -> None:
    model = safe_torch_load(state / "model.pt")
    model["weight"][0, 0] = float("nan")
    torch.save(model, state / "model.pt")
    reseal_state(state)


def manifest_not_finite(state: Path) -> None:
    manifest = json.loads((state / MANIFEST).read_text())
    (state / MANIFEST).write_text(json.dumps({**manifest, "finite": False}))
    reseal_state(state)


FALLBACKS = [
    pytest.param(
        lambda state: truncate(state / "optimizer.pt"),
        "optimizer.pt is damaged: its bytes changed after it was saved",
        id="truncated-optimizer",
    ),
    pytest.param(nan_weights, "model.pt holds NaN or infinite weights", id="nan-weights"),
    pytest.param(
        manifest_not_finite,
        "holds NaN or infinite weights (so its manifest records)",
        id="manifest-not-finite",
    ),
]


@pytest.mark.parametrize("damage, why", FALLBACKS)
def test_resume_from_a_folder_skips_a_bad_newest_state_with_a_warning(
    tmp_path: Path, states: Path, damage: Any, why: str
) -> None:
    folder = shutil.copytree(states, tmp_path / "states")
    damage(folder / "step-4")
    with pytest.warns(
        UserWarning,
        match=f"Skipped the training state {folder / 'step-4'}: .*{re.escape(why)}.* Resuming from {folder / 'step-2'} instead",
    ):
        trainer = train(make_trainer(seed=1), num_epochs=2, resume_from=folder)
    assert trainer.progress.global_step == 4  # 2 restored, then 1 more epoch of 2


def test_folder_without_a_good_state_lists_every_candidate_and_its_problem(
    tmp_path: Path, states: Path
) -> None:
    folder = shutil.copytree(states, tmp_path / "states")
    truncate(folder / "step-4" / "trainer_state.pt")
    nan_weights(folder / "step-2")
    trainer = train(make_trainer(seed=1))
    before = snapshot(trainer)
    with pytest.raises(ValueError, match="holds no usable training state") as error:
        trainer.load_training_state(folder)
    message = str(error.value)
    assert message.index("step-4: ") < message.index("step-2: ")
    assert (
        "trainer_state.pt is damaged: its bytes changed after it was saved" in message
        and "model.pt holds NaN or infinite weights" in message
    )
    assert_equal_nested(snapshot(trainer), before)


def test_explicit_state_with_nan_weights_is_an_error_not_a_fallback(tmp_path: Path, states: Path) -> None:
    folder = shutil.copytree(states, tmp_path / "states")
    nan_weights(folder / "step-4")
    with pytest.raises(ValueError, match="step-4/model.pt holds NaN or infinite weights"):
        make_trainer().load_training_state(folder / "step-4")
