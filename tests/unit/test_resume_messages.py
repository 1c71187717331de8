"""The messages of a resume (issue 30, finding 10), each pinned by its text on real one-process runs:
a ``resume_from`` that names nothing says how to start a new run or let ``"auto"`` choose; a resume
that skips one batch says "1 batch"; a relaunch of a finished run says "Nothing to train" once,
with no line claiming that training continues; and the epochs it says a state completed are the
epochs that state trained."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.directories import read_manifest
from tests.helpers import make_regression_data, make_trainer, weights

DATA = make_regression_data(32)  # 4 batches (and updates) per epoch in batches of 8


class FailAfter(TrainerCallback):
    """Fails the run at ``event`` once ``update`` updates are done: the start of the next batch, or
    the end of the epoch (both after that update's save)."""

    def __init__(self, update: int, event: str = "on_train_step_start") -> None:
        self.update, self.event = update, event

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        self.fail(trainer, "on_train_step_start")

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.fail(trainer, "on_train_epoch_end")

    def fail(self, trainer: Any, event: str) -> None:
        if event == self.event and trainer.progress.global_step == self.update:
            raise RuntimeError(f"killed after update {self.update}")


def saved_at(folder: Path, update: int, event: str = "on_train_step_start", every: int | None = None) -> Path:
    """The state ``step_<update>`` of a 5-epoch run that saved it and failed right after ``event``."""
    saver = SaveTrainingStateCallback(folder, save_every_n_steps=every or update)
    with pytest.raises(RuntimeError, match="killed after update"):
        make_trainer([saver, FailAfter(update, event)]).train(DATA, num_epochs=5, per_device_batch_size=8)
    return folder / f"step_{update}"


def nothing_to_train_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(warning.message) for warning in caught if "Nothing to train" in str(warning.message)]


# ---------------------------------------------------------------------------- a path that names nothing


def test_resume_from_a_missing_path_says_where_it_looked_and_how_to_start_anew_or_let_auto_choose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer()
    before = weights(trainer.get_model())
    with pytest.raises(FileNotFoundError) as error:
        trainer.train(DATA, num_epochs=1, per_device_batch_size=8, resume_from="runs/step_12")
    assert str(error.value) == (
        f"resume_from='runs/step_12': no such directory ({tmp_path / 'runs' / 'step_12'}; a relative path "
        f"is read from the working directory, {tmp_path}). Pass the path of a training state (a directory "
        f"written by save_training_state or SaveTrainingStateCallback) or of a folder of them. To start a "
        f"new run, pass resume_from=None; to resume from the newest state in the folder your "
        f"SaveTrainingStateCallback saves into, or start a new run when it holds none (one script for "
        f'the first launch and every relaunch), pass resume_from="auto".'
    )
    assert trainer.progress.global_step == 0
    assert all(torch.equal(weights(trainer.get_model())[k], v) for k, v in before.items())


def test_resume_from_a_missing_state_names_the_states_its_folder_holds(tmp_path: Path) -> None:
    folder = tmp_path / "states"
    saved_at(folder, 6, every=3)  # step_3 and step_6
    (folder / "notes").mkdir()  # not a state: not named
    with pytest.raises(FileNotFoundError) as error:
        make_trainer().train(DATA, num_epochs=2, per_device_batch_size=8, resume_from=folder / "step_9")
    message = str(error.value)
    assert message.startswith(
        f"resume_from='{folder / 'step_9'}': no such directory. {folder} holds the training states step_3, step_6. Pass the path"
    )
    assert "pass resume_from=None" in message and 'pass resume_from="auto"' in message


# ---------------------------------------------------------------------------- the resume's line


def test_a_resume_that_skips_one_batch_says_1_batch_and_several_say_batches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "states"
    saved_at(folder, 6, every=5)  # step_5: epoch 2, one of its 4 batches trained
    capsys.readouterr()
    make_trainer().train(DATA, num_epochs=2, per_device_batch_size=8, resume_from=folder / "step_5")
    assert capsys.readouterr().out.splitlines() == [
        f"Resumed from {folder / 'step_5'} (epoch 2, update 5; skipping 1 batch already trained this epoch)"
    ]
    saved_at(tmp_path / "more", 6, every=6)
    make_trainer().train(
        DATA, num_epochs=2, per_device_batch_size=8, resume_from=tmp_path / "more" / "step_6"
    )
    assert "(epoch 2, update 6; skipping 2 batches already trained this epoch)" in capsys.readouterr().out


# ---------------------------------------------------------------------------- a finished run relaunched


def test_relaunching_a_finished_auto_run_says_nothing_to_train_once_and_no_resume_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    finished = make_trainer([SaveTrainingStateCallback(folder)])
    finished.train(DATA, num_epochs=5, per_device_batch_size=8, resume_from="auto")
    run_id = read_manifest(folder / "final")["run_id"]  # type: ignore[index]
    written = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    capsys.readouterr()
    again = make_trainer([SaveTrainingStateCallback(folder)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.train(DATA, num_epochs=5, per_device_batch_size=8, resume_from="auto")
    assert nothing_to_train_warnings(caught) == []
    assert capsys.readouterr().out.splitlines() == [
        f"Training stopped before it started: Nothing to train: the state resumed from {folder / 'final'} "
        f"(the newest usable state in {folder}) already completed 5 epochs (num_epochs=5). Pass a larger "
        f'num_epochs to continue. resume_from="auto" continues run {run_id}, whose states are in {folder}; '
        f"to start a new run, save into another (or an empty) folder."
    ]
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == written
    assert again.progress.global_step == finished.progress.global_step == 20
    assert all(
        torch.equal(weights(again.get_model())[k], v) for k, v in weights(finished.get_model()).items()
    )


def test_resuming_a_finished_state_by_its_path_says_nothing_to_train_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = make_trainer()
    trainer.train(DATA, num_epochs=3, per_device_batch_size=8)
    trainer.save_training_state(tmp_path / "done")
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer().train(DATA, num_epochs=3, per_device_batch_size=8, resume_from=tmp_path / "done")
    assert nothing_to_train_warnings(caught) == []
    assert capsys.readouterr().out.splitlines() == [
        f"Training stopped before it started: Nothing to train: the state resumed from {tmp_path / 'done'} "
        f"already completed 3 epochs (num_epochs=3). Pass a larger num_epochs to continue."
    ]


# ---------------------------------------------------------------------------- the epochs a state completed


@pytest.mark.parametrize(
    ("update", "event", "completed"),
    [
        (12, "on_train_epoch_end", "3 epochs"),  # after the last batch of epoch 3, before its end
        (10, "on_train_step_start", "2 epochs and 2 of the 4 batches of epoch 3"),
    ],
)
def test_nothing_to_train_counts_the_epochs_the_state_trained(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], update: int, event: str, completed: str
) -> None:
    state = saved_at(tmp_path / "states", update, event)
    capsys.readouterr()
    trainer = make_trainer()
    trainer.train(DATA, num_epochs=2, per_device_batch_size=8, resume_from=state)
    assert capsys.readouterr().out.splitlines() == [
        f"Training stopped before it started: Nothing to train: the state resumed from {state} already "
        f"completed {completed} (num_epochs=2). Pass a larger num_epochs to continue."
    ]
    assert trainer.progress.global_step == update
