"""States whose ``manifest.json`` was lost (deleted, or the state copied without it).

A save publishes a state only once its manifest is written, so a state's directory without one has
lost it: its files cannot be checked. A folder resume (by path or ``resume_from="auto"``) names each
such state in a warning and resumes from the newest complete one; when no state of the folder has
its manifest, both refuse, naming them and what to do, and ``"auto"`` writes nothing over them. The
folder's hidden entries (``.failures/``, the lock, a killed save's leftovers) are never states.
Real runs of one process (4 updates per epoch, a state every 2 updates).
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.checkpoints.auto_resume import FAILURES
from tests.helpers import as_version_1, make_regression_data, make_trainer, weights

DATA = make_regression_data(32)  # 4 updates per epoch in batches of 8


def run(folder: Path, num_epochs: int, resume_from: Any = "auto") -> Any:
    trainer = make_trainer([SaveTrainingStateCallback(folder, save_every_n_steps=2)], momentum=0.9)
    trainer.train(DATA, num_epochs=num_epochs, per_device_batch_size=8, resume_from=resume_from)
    return trainer


def uninterrupted(num_epochs: int) -> dict[str, torch.Tensor]:
    trainer = make_trainer([], momentum=0.9)
    trainer.train(DATA, num_epochs=num_epochs, per_device_batch_size=8)
    return weights(trainer.get_model())


def folder_of_states(folder: Path) -> Path:
    """A 2-epoch run's states: step_2 ... step_8 and final (update 8)."""
    run(folder, 2, resume_from=None)
    return folder


def contents(folder: Path) -> dict[str, int]:
    """Every path under ``folder`` with the time it was last written: what a run must not change."""
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def lost_manifest_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(warning.message) for warning in caught if "manifest.json" in str(warning.message)]


@pytest.mark.parametrize("resume_from", ["auto", "folder"])
def test_a_state_that_lost_its_manifest_is_named_in_a_warning_and_the_newest_complete_one_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], resume_from: str
) -> None:
    folder = folder_of_states(tmp_path / "states")
    for name in ("final", "step_8"):
        (folder / name / "manifest.json").unlink()
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run(folder, 3, resume_from="auto" if resume_from == "auto" else folder)
    assert lost_manifest_warnings(caught) == [
        f"{folder}: manifest.json is missing from final, step_8 (deleted, or the state copied without it: a "
        f"save publishes a state only with its manifest), so these states are never resumed from (its files "
        f"cannot be checked); a save of the same name replaces such a state. To resume from one, put its "
        f"manifest.json back first."
    ]
    assert f"from {folder / 'step_6'}, the newest usable state in {folder}" in capsys.readouterr().out
    assert trainer.progress.global_step == 12
    found, expected = weights(trainer.get_model()), uninterrupted(3)
    assert found.keys() == expected.keys() and all(
        torch.equal(found[name], expected[name]) for name in expected
    )


def test_a_folder_whose_every_state_lost_its_manifest_is_refused_by_a_folder_resume_naming_them(
    tmp_path: Path,
) -> None:
    folder = folder_of_states(tmp_path / "states")
    for manifest in folder.glob("*/manifest.json"):
        manifest.unlink()
    before = contents(folder)
    with pytest.raises(ValueError) as raised:
        run(folder, 3, resume_from=folder)
    assert str(raised.value) == (
        f"{folder} holds no training state that can be read: final, step_2, step_4, step_6, step_8 hold the "
        f"files of a training state but have lost their manifest.json (deleted, or copied without it), so "
        f"their files cannot be checked. Put their manifest.json back (from a backup, say) to resume from "
        f'them, or move them out of {folder} to start a new run there: resume_from="auto" never starts a '
        f"new run over states it cannot read."
    )
    assert contents(folder) == before


def test_auto_never_starts_a_new_run_over_states_whose_manifests_are_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = folder_of_states(tmp_path / "states")
    for manifest in folder.glob("*/manifest.json"):
        manifest.unlink()
    before = contents(folder)
    capsys.readouterr()
    with pytest.raises(ValueError) as raised:
        run(folder, 3)
    assert str(raised.value).startswith(
        f'resume_from="auto" cannot choose a training state in {folder} (seen by process 0): {folder} holds '
        f"no training state that can be read: final, step_2, step_4, step_6, step_8 hold the files of a "
        f"training state but have lost their manifest.json"
    )
    assert str(raised.value).endswith('resume_from="auto" never starts a new run over states it cannot read.')
    assert "starting a new run" not in capsys.readouterr().out
    assert contents(folder) == before  # nothing written over them, no lock, no failure record


def test_auto_takes_the_hidden_failure_records_and_a_killed_saves_leftover_for_what_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    states = folder_of_states(tmp_path / "states")
    folder = tmp_path / "fresh"
    (folder / FAILURES).mkdir(parents=True)
    (folder / FAILURES / "rank0.json").write_text("{}")  # an unreadable record: ignored
    shutil.copytree(states / "step_4", folder / ".step_4.incomplete")  # a killed save's leftover
    (folder / ".step_4.incomplete" / "manifest.json").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = run(folder, 2)
    assert lost_manifest_warnings(caught) == []
    out = capsys.readouterr().out
    assert f'resume_from="auto": no training state in {folder}, starting a new run' in out
    assert re.search(r"Removed the half-written states? of killed saves in .*: \.step_4\.incomplete", out)
    assert trainer.progress.global_step == 8 and (folder / "final" / "manifest.json").is_file()


def test_a_state_named_whose_manifest_does_not_say_complete_is_refused_saying_so(tmp_path: Path) -> None:
    folder = folder_of_states(tmp_path / "states")
    manifest = json.loads((folder / "step_4" / "manifest.json").read_text())
    # (a version-1 manifest: no checksum of its own to keep)
    (folder / "step_4" / "manifest.json").write_text(
        json.dumps({**as_version_1(manifest), "complete": False})
    )
    with pytest.raises(ValueError) as raised:
        run(folder, 3, resume_from=folder / "step_4")
    assert str(raised.value) == (
        f"resume_from={str(folder / 'step_4')!r} is not a complete training state: its manifest.json does not "
        f"say complete (it was not written by this library). Resume from another state, or from the parent "
        f"folder to pick its newest complete one."
    )
