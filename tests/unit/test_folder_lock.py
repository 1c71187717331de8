"""One run per folder, in one process: the lock (taken, refused naming its holder, taken over when
its holder is gone, released on every exit path), the run id (new per run, continued by a resume
and by a ``train()`` call that keeps the history), and a folder resume of a folder that holds the
states of several runs. Concurrent runs and kills: tests/integration/test_one_run_per_folder.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytorch_accelerated.callbacks import STATE_SAVES_ORDER, SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints import folder_lock
from pytorch_accelerated.checkpoints.directories import read_manifest
from pytorch_accelerated.checkpoints.discovery import candidate_states
from pytorch_accelerated.checkpoints.folder_lock import LOCK_NAME, FolderInUseError
from tests.helpers import make_regression_data, make_trainer

GONE_PID = 2**22 + 7  # above Linux's largest process id: no such process


def write_lock(folder: Path, **record: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / LOCK_NAME
    lock.write_text(json.dumps({"run_id": "old-run", "since": "then", "token": "theirs", **record}))
    return lock


def train(trainer: Any, **kwargs: Any) -> None:
    trainer.train(
        make_regression_data(8), num_epochs=kwargs.pop("num_epochs", 1), per_device_batch_size=2, **kwargs
    )


def test_a_folder_held_by_a_live_run_is_refused_before_training_naming_the_holder_and_the_fix(
    tmp_path: Path,
) -> None:
    held = folder_lock.acquire(tmp_path / "states", "run-a")
    started: list[int] = []

    class Steps(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            started.append(1)

    trainer = make_trainer((SaveTrainingStateCallback(tmp_path / "states"), Steps()))
    with pytest.raises(FolderInUseError) as raised:
        train(trainer)
    assert started == []
    assert str(raised.value).startswith(
        f"{tmp_path / 'states'} is in use by another run that writes training states there: run run-a, "
        f"process {os.getpid()} on host {socket.gethostname()}, since {held['since']} (lock file "
    )
    assert "Save this run's states into another folder" in str(raised.value)
    assert "or wait for that run to end or stop it" in str(raised.value)
    assert json.loads((tmp_path / "states" / LOCK_NAME).read_text())["token"] == held["token"]  # untouched


def test_the_lock_is_held_during_the_run_and_released_at_its_end_and_after_an_exception(
    tmp_path: Path,
) -> None:
    seen: list[str] = []

    class Look(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            seen.append(json.loads((tmp_path / LOCK_NAME).read_text())["run_id"])
            if fail:
                raise KeyboardInterrupt

    for fail in (False, True):
        trainer = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=1), Look()))
        with pytest.raises(KeyboardInterrupt) if fail else warnings.catch_warnings():
            train(trainer)
        assert seen[-1] == trainer.run_identity.run_id
        assert not (tmp_path / LOCK_NAME).exists()


def test_a_run_stopped_by_sigterm_releases_the_folder(tmp_path: Path) -> None:
    class Terminate(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            assert (tmp_path / LOCK_NAME).exists()
            os.kill(os.getpid(), signal.SIGTERM)  # handled by SaveTrainingStateCallback: a clean stop

    trainer = make_trainer((SaveTrainingStateCallback(tmp_path), Terminate()))
    train(trainer, num_epochs=3)
    # The saver runs after the other callbacks (its event_order): it sees the signal at the same update.
    assert trainer.progress.global_step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1"]


def test_a_folder_held_by_this_very_run_says_so_and_why_it_can_happen(tmp_path: Path) -> None:
    # What another machine of a run meets when the folder looked unshared at the run's start
    # (see TrainingStateStore.hold) but is shared after all.
    held = folder_lock.acquire(tmp_path, "run-a")
    with pytest.raises(FolderInUseError) as raised:
        folder_lock.acquire(tmp_path, "run-a")
    assert str(raised.value).startswith(
        f"{tmp_path} is held by this very run (run run-a, process {os.getpid()} on host "
        f"{socket.gethostname()}, since {held['since']}; lock file {tmp_path / LOCK_NAME}): either the "
        f"machines share this folder although one of them did not see it when the run started"
    )
    assert str(raised.value).endswith(
        "Launch again once it has ended (the check runs again), or make the file system show new files at once."
    )


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path: Path) -> None:
    write_lock(
        tmp_path, host=socket.gethostname(), pid=GONE_PID, pid_namespace=os.readlink("/proc/self/ns/pid")
    )
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path),))
    train(trainer)
    assert read_manifest(tmp_path / "final")["run_id"] == trainer.run_identity.run_id
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_of_another_pid_namespace_on_this_host_is_not_taken_over_while_fresh(tmp_path: Path) -> None:
    write_lock(
        tmp_path, host=socket.gethostname(), pid=GONE_PID, pid_namespace="pid:[1]"
    )  # another container
    with pytest.raises(FolderInUseError, match=f"process {GONE_PID} on host"):
        folder_lock.acquire(tmp_path, "mine")


def test_a_lock_of_another_host_is_taken_over_only_once_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(folder_lock.EXPIRY_ENV, "60")
    lock = write_lock(tmp_path, host="elsewhere", pid=1)
    with pytest.raises(
        FolderInUseError, match=r"run old-run, process 1 on host elsewhere, since then .*60 s old"
    ):
        folder_lock.acquire(tmp_path, "mine")
    old = time.time() - 61
    os.utime(lock, (old, old))
    record = folder_lock.acquire(tmp_path, "mine")
    assert json.loads(lock.read_text()) == record
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]  # no private or stale copies left


def test_a_run_whose_lock_was_taken_over_saves_nothing_more(tmp_path: Path) -> None:
    class TakeOver(TrainerCallback):  # another host's run takes the folder after the first save
        event_order = STATE_SAVES_ORDER + 1  # after the saver's turn

        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            if trainer.progress.global_step == 1:
                write_lock(tmp_path, host="elsewhere", pid=1, run_id="new-run")

    trainer = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=1), TakeOver()))
    with pytest.raises(
        FolderInUseError, match="lock on .* was taken over by another run \\(run new-run, process 1"
    ):
        train(trainer)
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, "step_1"]
    assert json.loads((tmp_path / LOCK_NAME).read_text())["run_id"] == "new-run"  # not removed


def test_a_lock_removed_by_hand_during_the_run_is_taken_again_at_the_next_save(tmp_path: Path) -> None:
    class Remove(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            seen.append(json.loads((tmp_path / LOCK_NAME).read_text())["run_id"])
            (tmp_path / LOCK_NAME).unlink()

    seen: list[str] = []
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=1), Remove()))
    train(trainer)
    assert seen == [trainer.run_identity.run_id] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "step_1", "step_2", "step_3", "step_4"]


def test_save_training_state_outside_a_run_holds_the_folder_only_while_it_saves(tmp_path: Path) -> None:
    trainer = make_trainer()
    held = folder_lock.acquire(tmp_path, "run-a")
    with pytest.raises(FolderInUseError, match="run run-a"):
        trainer.save_training_state(tmp_path / "state")
    assert not (tmp_path / "state").exists()
    folder_lock.release(tmp_path, held)
    trainer.save_training_state(tmp_path / "state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_the_run_id_is_new_per_run_and_continued_by_a_resume_and_a_call_that_keeps_the_history(
    tmp_path: Path,
) -> None:
    first = make_trainer((SaveTrainingStateCallback(tmp_path / "a"),))
    train(first)
    run_id = first.run_identity.run_id
    assert read_manifest(tmp_path / "a" / "final")["run_id"] == run_id
    train(first, num_epochs=2, reset_run_history=False)
    assert first.run_identity.run_id == run_id
    train(first, num_epochs=1)  # the history reset: a new run
    assert first.run_identity.run_id != run_id
    resumed = make_trainer((SaveTrainingStateCallback(tmp_path / "a"),))
    train(resumed, num_epochs=4, resume_from=tmp_path / "a")
    assert resumed.run_identity.run_id == first.run_identity.run_id
    # A new run from an old state: load it, then train without resume_from.
    new = make_trainer((SaveTrainingStateCallback(tmp_path / "b"),))
    new.load_training_state(tmp_path / "a" / "final")
    train(new)
    assert new.run_identity.run_id not in {run_id, first.run_identity.run_id}
    assert read_manifest(tmp_path / "b" / "final")["run_step"] == 4


def test_a_folder_resume_continues_the_run_that_wrote_last_and_says_so(tmp_path: Path) -> None:
    older = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=2),))
    train(older, num_epochs=3)  # states at 2, 4, 6, 8, 10, 12 and final (12)
    newer = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=2),))
    train(newer)  # its step_2, step_4 and final replace the older run's
    with pytest.warns(UserWarning) as caught:
        candidates, explicit = candidate_states(tmp_path)
    assert (candidates, explicit) == ([tmp_path / "final", tmp_path / "step_4", tmp_path / "step_2"], False)
    assert str(caught[0].message) == (
        f"{tmp_path} holds the training states of 2 runs: continuing run {newer.run_identity.run_id}, which wrote "
        f"its newest state (final); the other runs' states (step_6, step_8, step_10, step_12) are not "
        f"considered. To resume one of those, name it: resume_from={str(tmp_path / 'step_12')!r}."
    )
