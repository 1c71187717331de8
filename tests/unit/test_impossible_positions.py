"""Positions and settings that no run reaches are refused before anything is loaded.

A training state records its position twice (``trainer_state.pt``'s ``progress`` and the manifest) and
the settings it was saved on (the manifest). Checksums find damage, not a file rewritten with its
checksum; such a state (or one of a version without checksums) could hold a negative epoch, step or
batch, a manifest whose step disagrees with ``trainer_state.pt``, a batch beyond the epoch or no
processes. Before, they trained the wrong number of updates or crashed deep in a loader
(``ValueError: __len__() should return >= 0``, ``ZeroDivisionError``); each is now refused, naming the
file and the value, with the model, the position and the events untouched.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.checkpoints.file_checks import UnusableStateError
from tests.helpers import EventRecorder, make_regression_data, make_trainer, reseal_state, weights

DATA = make_regression_data(64)  # 8 updates per epoch in batches of 8
FIX = (
    "The state was changed after it was saved, or was not written by this library. Resume from another "
    "state: name it (train(resume_from=<its directory>) or load_training_state(<its directory>)), or pass "
    "the folder of states to resume_from, which skips a damaged one with a warning."
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``step_12``: epoch 2 (``epoch`` 1 from 0), batch 4, update 12 of a run of 8 updates per epoch."""
    folder = tmp_path_factory.mktemp("positions") / "states"
    trainer = make_trainer([SaveTrainingStateCallback(folder, save_every_n_steps=4, save_at_end=False)])
    trainer.train(DATA, num_epochs=2, per_device_batch_size=8)
    return folder / "step_12"


def changed(saved: Path, folder: Path, progress: dict[str, Any], manifest: dict[str, Any]) -> Path:
    """A copy of ``saved`` with ``progress`` written into its trainer_state.pt and ``manifest`` into its
    manifest, every checksum rewritten to match (as a deliberate edit would)."""
    state = shutil.copytree(saved, folder / saved.name)
    trainer_state = torch.load(state / "trainer_state.pt", weights_only=True)
    trainer_state["progress"].update(progress)
    torch.save(trainer_state, state / "trainer_state.pt")
    recorded = json.loads((state / "manifest.json").read_text())
    (state / "manifest.json").write_text(json.dumps({**recorded, **manifest}))
    reseal_state(state)
    return state


def both(**position: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The same ``position`` in trainer_state.pt and the manifest."""
    return position, position


CASES: dict[str, tuple[tuple[dict[str, Any], dict[str, Any]], Callable[[Path], str]]] = {
    "negative epoch": (
        both(epoch=-1),
        lambda s: (
            f"{s / 'trainer_state.pt'} records epoch=-1, which cannot be right: positions count from 0."
        ),
    ),
    "negative step": (
        both(global_step=-3),
        lambda s: (
            f"{s / 'trainer_state.pt'} records global_step=-3, which cannot be right: positions count from 0."
        ),
    ),
    "negative batch": (
        both(batch_index=-2),
        lambda s: (
            f"{s / 'trainer_state.pt'} records batch_index=-2, which cannot be right: positions count from 0."
        ),
    ),
    "a step the manifest does not record": (
        ({"global_step": 4}, {}),
        lambda s: (
            f"{s / 'trainer_state.pt'} records global_step=4, which cannot be right: its manifest.json "
            f"records global_step=12, and the two were saved together."
        ),
    ),
    "a run step that does not follow": (
        ({}, {"run_step": 20}),
        lambda s: (
            f"{s / 'manifest.json'} records run_step=20, which cannot be right: its trainer_state.pt records "
            f"0 updates of earlier train() calls and global_step=12."
        ),
    ),
    "more updates in the epoch than in the run": (
        both(epoch_step=13),
        lambda s: (
            f"{s / 'trainer_state.pt'} records epoch_step=13, which cannot be right: it is more than "
            f"global_step=12."
        ),
    ),
    "a batch beyond the epoch": (
        both(batch_index=20),
        lambda s: (
            f"{s / 'trainer_state.pt'} records batch_index=20, which cannot be right: its manifest.json "
            f"records 8 batches per epoch."
        ),
    ),
    "no processes": (
        ({}, {"num_processes": 0}),
        lambda s: (
            f"{s / 'manifest.json'} records num_processes=0, which cannot be right: a setting of the run, "
            f"1 or more."
        ),
    ),
    "no batch": (
        ({}, {"per_device_batch_size": 0}),
        lambda s: (
            f"{s / 'manifest.json'} records per_device_batch_size=0, which cannot be right: a setting of the "
            f"run, 1 or more."
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_position_or_setting_that_cannot_be_right_is_refused_before_anything_is_loaded(
    saved: Path, tmp_path: Path, case: str
) -> None:
    (progress, manifest), message = CASES[case]
    state = changed(saved, tmp_path, progress, manifest)
    events: list[str] = []
    trainer = make_trainer([EventRecorder(events)])
    before = weights(trainer.get_model())
    events.clear()
    with pytest.raises(UnusableStateError) as raised:
        trainer.train(DATA, num_epochs=3, per_device_batch_size=8, resume_from=state)
    assert str(raised.value) == f"{message(state)} {FIX}"
    assert events == [] and trainer.progress.global_step == 0
    after = weights(trainer.get_model())
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_load_training_state_by_hand_refuses_it_too(saved: Path, tmp_path: Path) -> None:
    state = changed(saved, tmp_path, {"epoch": -1}, {"epoch": -1})
    with pytest.raises(UnusableStateError, match=r"records epoch=-1, which cannot be right"):
        make_trainer().load_training_state(state)


def test_a_folder_resume_skips_such_a_state_with_a_warning_and_resumes_the_one_before(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "states"
    shutil.copytree(saved.parent / "step_8", folder / "step_8")
    changed(saved, folder, {"batch_index": 20}, {"batch_index": 20})
    trainer = make_trainer()
    with pytest.warns(UserWarning, match=r"Skipped the training state .*step_12: .*batch_index=20"):
        trainer.train(DATA, num_epochs=3, per_device_batch_size=8, resume_from=folder)
    assert f"Resumed from {folder / 'step_8'}" in capsys.readouterr().out
    assert trainer.progress.global_step == 24
