"""Folders of training states that hold symbolic links and leftovers: saves replace a linked state
without touching what the link points to, leftovers of killed saves are removed whatever they are,
and the line that says so names only what was removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.checkpoints.directories import read_manifest
from tests.helpers import make_regression_data, make_trainer


def trained(*callbacks: Any) -> Any:
    trainer = make_trainer(callbacks)
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    return trainer


def linked_state(tmp_path: Path, name: str) -> tuple[Any, Path, Path]:
    """A trainer, and ``tmp_path/states/name``: a symbolic link to a complete state kept elsewhere."""
    trainer = trained()
    target = tmp_path / "elsewhere" / name
    trainer.save_training_state(target)
    (tmp_path / "states").mkdir()
    link = tmp_path / "states" / name
    link.symlink_to(target, target_is_directory=True)
    return trainer, link, target


def test_saving_over_a_state_name_that_is_a_symbolic_link_replaces_the_link_and_leaves_its_target(
    tmp_path: Path,
) -> None:
    trainer, link, target = linked_state(tmp_path, "final")
    manifest_before = (target / "manifest.json").read_bytes()
    for _ in range(2):  # and the next save of that name, which the leftover link used to break
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.save_training_state(link)
        assert not link.is_symlink() and read_manifest(link) is not None
    assert sorted(path.name for path in link.parent.iterdir()) == ["final"]  # no .final.replaced
    assert (target / "manifest.json").read_bytes() == manifest_before  # the linked state is intact
    assert read_manifest(target) is not None
    [message] = [str(w.message) for w in caught if "symbolic link" in str(w.message)] or [None]
    assert message is None  # said once, when the link was replaced (the second save replaced a directory)


def test_replacing_a_linked_state_says_the_link_was_replaced_and_where_the_old_state_still_is(
    tmp_path: Path,
) -> None:
    trainer, link, target = linked_state(tmp_path, "final")
    with pytest.warns(UserWarning) as caught:
        trainer.save_training_state(link)
    [message] = [str(w.message) for w in caught if "symbolic link" in str(w.message)]
    assert message == (
        f"{link} was a symbolic link to {target}: the new training state replaces the link, and the state "
        f"it pointed to is left as it was, at {target}."
    )


def test_a_leftover_replaced_link_does_not_stop_a_save(tmp_path: Path) -> None:
    """What a save killed between its renames leaves when the state it replaced was a link."""
    trainer, link, target = linked_state(tmp_path, "final")
    link.rename(link.parent / ".final.replaced")
    trainer.save_training_state(link)
    assert read_manifest(link) is not None and not link.is_symlink()
    assert sorted(path.name for path in link.parent.iterdir()) == ["final"]
    assert read_manifest(target) is not None


def test_rotation_removes_a_linked_state_s_link_and_never_what_it_points_to(tmp_path: Path) -> None:
    trainer, link, target = linked_state(tmp_path, "step_0")
    saver = SaveTrainingStateCallback(tmp_path / "states", save_every_n_steps=1, max_checkpoints=1)
    trainer.callback_handler.add_callback(saver)
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    assert sorted(path.name for path in (tmp_path / "states").iterdir()) == ["final"]
    assert read_manifest(target) is not None


def leftover_link(folder: Path, name: str, tmp_path: Path) -> Path:
    """``folder/name``, a symbolic link to a directory of junk kept elsewhere (returned)."""
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "keep.txt").write_text("not ours")
    folder.mkdir(exist_ok=True)
    (folder / name).symlink_to(junk, target_is_directory=True)
    return junk


@pytest.mark.parametrize("kind", ["link", "dangling link", "file"])
def test_a_hidden_incomplete_entry_that_is_not_a_directory_is_removed_and_said_so_and_the_save_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    folder = tmp_path / "states"
    if kind == "file":
        folder.mkdir()
        (folder / ".step_1.incomplete").write_text("junk")
    else:
        junk = leftover_link(folder, ".step_1.incomplete", tmp_path)
        if kind == "dangling link":
            shutil.rmtree(junk)
    trained(SaveTrainingStateCallback(folder, save_every_n_steps=1))
    assert f"Removed the half-written states of killed saves in {folder}: .step_1.incomplete\n" in (
        capsys.readouterr().out
    )
    assert sorted(path.name for path in folder.iterdir()) == ["final", "step_1", "step_2"]
    if kind == "link":
        assert (tmp_path / "junk" / "keep.txt").read_text() == "not ours"  # only the link was removed


def immutable(path: Path) -> bool:
    """Make ``path`` immutable (``chattr +i``: not even root may remove it); False where that is not possible."""
    if shutil.which("chattr") is None:
        return False
    return subprocess.run(["chattr", "+i", str(path)], capture_output=True, timeout=30).returncode == 0


def test_a_leftover_that_cannot_be_removed_gets_a_warning_naming_it_and_is_never_said_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "states"
    stuck = folder / ".step_5.incomplete"
    stuck.mkdir(parents=True)
    (folder / ".step_1.incomplete").mkdir()
    (stuck / "model.pt").write_text("half")
    if not immutable(stuck / "model.pt"):
        pytest.skip("chattr +i is not available here (it needs root and a file system that supports it)")
    try:
        with pytest.warns(UserWarning) as caught:
            trained(SaveTrainingStateCallback(folder, save_every_n_steps=1))
        out = capsys.readouterr().out
    finally:
        subprocess.run(["chattr", "-i", str(stuck / "model.pt")], check=True, timeout=30)
    assert f"Removed the half-written states of killed saves in {folder}: .step_1.incomplete\n" in out
    [message] = [str(w.message) for w in caught if str(w.message).startswith("Could not remove")]
    assert message == (
        f"Could not remove {stuck}, the half-written state of a killed save: Operation not permitted "
        f"(errno 1). Remove it by hand; it is never taken for a state."
    )
    assert sorted(path.name for path in folder.iterdir()) == [
        ".step_5.incomplete",
        "final",
        "step_1",
        "step_2",
    ]
    assert os.path.isdir(stuck)


def test_a_save_over_a_regular_file_of_the_state_s_name_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    trainer = trained()
    (tmp_path / "final").write_text("a file of mine")
    with pytest.raises(OSError) as raised:
        trainer.save_training_state(tmp_path / "final")
    assert str(raised.value) == (
        f"Could not save the training state to {tmp_path / 'final'}: {tmp_path / 'final'} is a file, not a "
        f"training state, and publishing the state there would replace it; move it away, or save the state "
        f"under another name. Nothing was written; the previous states are intact. Check the path and the "
        f"file system."
    )
    assert (tmp_path / "final").read_text() == "a file of mine"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["final"]


def test_a_replaced_state_that_cannot_be_removed_leaves_the_new_state_published_and_names_the_leftover(
    tmp_path: Path,
) -> None:
    trainer = trained()
    trainer.save_training_state(tmp_path / "final")
    if not immutable(tmp_path / "final" / "model.pt"):
        pytest.skip("chattr +i is not available here (it needs root and a file system that supports it)")
    aside = tmp_path / ".final.replaced"
    try:
        with pytest.warns(UserWarning) as caught:
            trainer.save_training_state(tmp_path / "final")
        published = read_manifest(tmp_path / "final")
        with pytest.raises(OSError) as raised:
            trainer.save_training_state(tmp_path / "final")
    finally:
        subprocess.run(["chattr", "-i", str(aside / "model.pt")], check=True, timeout=30)
    assert published is not None  # the new state is in place
    [message] = [str(w.message) for w in caught if str(w.message).startswith("Published")]
    assert message == (
        f"Published {tmp_path / 'final'}, but the state it replaced, moved aside to {aside}, could not be "
        f"removed: Operation not permitted (errno 1). Remove it by hand (it is never taken for a state while "
        f"{tmp_path / 'final'} exists); the next save of that name fails until then."
    )
    assert str(raised.value) == (
        f"Could not save the training state to {tmp_path / 'final'}: Operation not permitted (errno 1) while "
        f"removing {aside}, an earlier state of that name that an earlier save moved aside; remove it by hand. "
        f"Nothing was written; the previous states are intact. Make the folder writable or choose another one."
    )
    assert read_manifest(tmp_path / "final") == published
