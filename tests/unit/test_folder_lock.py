"""One run per folder, in one process: the lock (taken; refused naming its holder, how it was
judged alive, how to check and how to clear it; taken over when its holder is gone: by its process
on this host and pid namespace, by its heartbeat elsewhere, by its age for an older version's
lock; released on every exit path), the run id (new per run, continued by a resume and by a
``train()`` call that keeps the history), and a folder resume of a folder that holds the states
of several runs. Concurrent runs, kills and a container restart in a new pid namespace:
tests/integration/test_one_run_per_folder.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
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


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host that is not this one (a stand-in for another run)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


def this_host(pid: int, **record: Any) -> dict[str, Any]:
    """A lock record of process ``pid`` of this host and pid namespace, with its start time."""
    start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return {"host": socket.gethostname(), "pid": pid, "pid_namespace": os.readlink("/proc/self/ns/pid"),
            "process_start": start, **record}  # fmt: skip


def test_a_folder_held_by_a_live_run_is_refused_before_training_naming_the_holder_how_to_check_and_clear(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    folder, pid = tmp_path / "states", other_process.pid
    lock = write_lock(folder, **this_host(pid, run_id="run-a", since="2026-12-06 10:00:00 UTC"))
    started: list[int] = []

    class Steps(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            started.append(1)

    trainer = make_trainer((SaveTrainingStateCallback(folder), Steps()))
    with pytest.raises(FolderInUseError) as raised:
        train(trainer)
    assert started == []
    assert str(raised.value) == (
        f"{folder} is in use by another run that saves training states there: run run-a, process {pid} on "
        f"host {socket.gethostname()}, since 2026-12-06 10:00:00 UTC; its process {pid} runs on this host, so "
        f"it is taken to be alive. Two runs saving into one folder would mix their states. Save this run's "
        f"states into another folder (SaveTrainingStateCallback(save_dir=...)), or wait for that run to end. "
        f"To check: ps -o pid,lstart,args -p {pid}; if that is not a run saving into {folder}, clear the "
        f"lock: rm {lock}"
    )
    assert json.loads(lock.read_text())["token"] == "theirs"  # untouched


def test_a_live_unrelated_process_named_by_a_lock_without_its_start_time_is_refused_with_how_to_check(
    tmp_path: Path, other_process: subprocess.Popen[bytes]
) -> None:
    # A lock of an older version names only the process id, which another program now has: it
    # cannot be told apart from its holder, so the message says how to check and how to clear.
    record = this_host(other_process.pid)
    del record["process_start"]
    lock = write_lock(tmp_path, **record)
    with pytest.raises(FolderInUseError) as raised:
        folder_lock.acquire(tmp_path, "mine")
    assert (
        f"To check: ps -o pid,lstart,args -p {other_process.pid}; if that is not a run saving into "
        in str(raised.value)
    )
    assert str(raised.value).endswith(f"clear the lock: rm {lock}")
    lock.unlink()  # what the message says to do: then the folder is taken
    folder_lock.release(tmp_path, folder_lock.acquire(tmp_path, "mine"))


def test_a_lock_whose_process_id_was_reused_by_another_process_is_taken_over_at_once(
    tmp_path: Path, other_process: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    record = this_host(other_process.pid)
    lock = write_lock(tmp_path, **{**record, "process_start": record["process_start"] - 1})
    started = time.monotonic()
    held = folder_lock.acquire(tmp_path, "mine")
    assert time.monotonic() - started < 2
    assert capsys.readouterr().out == (
        f"Took over the lock of {tmp_path} from run old-run, process {other_process.pid} on host "
        f"{socket.gethostname()}, since then: process {other_process.pid} on this host started after the "
        f"lock was taken (its id was reused).\n"
    )
    assert json.loads(lock.read_text())["token"] == held["token"]
    folder_lock.release(tmp_path, held)


def test_a_lock_of_this_very_process_is_not_another_run(tmp_path: Path) -> None:
    held = folder_lock.acquire(tmp_path / "states", "run-a")
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path / "states"),))
    with pytest.raises(FolderInUseError) as raised:
        train(trainer)
    lock = tmp_path / "states" / LOCK_NAME
    assert str(raised.value) == (
        f"{tmp_path / 'states'} is held by this process itself (process {os.getpid()}): by run run-a, since "
        f"{held['since']}, which has not released it: another Trainer saving into the same folder, or a "
        f"train() call still running. Two runs saving into one folder would mix their states. Give each "
        f"Trainer a folder of its own (SaveTrainingStateCallback(save_dir=...)), or let the first run end "
        f"first (a run releases the folder when its train() returns). To check: {lock} names run run-a; "
        f"only if no run of this process uses the folder, clear it: rm {lock}"
    )
    folder_lock.release(tmp_path / "states", held)


@pytest.mark.parametrize(
    ("content", "what"),
    [(b"", "it is empty"), (b"\x00\x17garbage{", "it holds b'\\x00\\x17garbage{', not a lock record")],
    ids=["empty", "garbage"],
)
def test_a_lock_file_that_cannot_be_read_refuses_the_run_saying_how_to_check_and_clear_it(
    tmp_path: Path, content: bytes, what: str
) -> None:
    lock = tmp_path / LOCK_NAME
    lock.write_bytes(content)
    with pytest.raises(FolderInUseError) as raised:
        folder_lock.acquire(tmp_path, "mine")
    assert str(raised.value) == (
        f"The lock file {lock} cannot be read ({what}), so no run can be judged to hold {tmp_path} or not; "
        f"nothing was written there. To check that no run uses the folder: on every machine that sees it, "
        f"lsof +D {tmp_path} (or look for a training job saving there). If none does, clear the lock: rm "
        f"{lock} and launch again; if one does, save this run's states into another folder "
        f"(SaveTrainingStateCallback(save_dir=...))."
    )
    assert lock.read_bytes() == content


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


def test_a_lock_whose_process_is_gone_is_taken_over(tmp_path: Path) -> None:
    write_lock(
        tmp_path, host=socket.gethostname(), pid=GONE_PID, pid_namespace=os.readlink("/proc/self/ns/pid")
    )
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path),))
    train(trainer)
    assert read_manifest(tmp_path / "final")["run_id"] == trainer.run_identity.run_id
    assert not (tmp_path / LOCK_NAME).exists()


def beating(lock: Path, interval_s: float = 0.2) -> threading.Event:
    """Touch ``lock`` every ``interval_s`` seconds until the returned event is set: a live holder."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            os.utime(lock)

    threading.Thread(target=beat, daemon=True).start()
    return stop


@pytest.mark.parametrize("where", ["another pid namespace of this host", "another host"])
def test_a_lock_of_another_pid_namespace_or_host_is_alive_while_its_heartbeat_advances(
    tmp_path: Path, where: str
) -> None:
    host = socket.gethostname() if where.startswith("another pid") else "elsewhere"
    lock = write_lock(tmp_path, host=host, pid=1, pid_namespace="pid:[1]", heartbeat_s=2.0)
    stop = beating(lock)
    try:
        with pytest.raises(FolderInUseError) as raised:
            folder_lock.acquire(tmp_path, "mine")
    finally:
        stop.set()
    assert re.search(
        rf"; it runs in {where}: its heartbeat advanced within \d\.\d s, so it is taken", str(raised.value)
    )
    check = "ps -o pid,lstart,args -p 1" + (
        " in that process's container" if host != "elsewhere" else " on host elsewhere"
    )
    assert (
        f"To check: {check}; if that is not a run saving into {tmp_path}, clear the lock: rm {lock}"
        in str(raised.value)
    )


def test_a_lock_whose_heartbeat_stands_still_is_taken_over_after_the_heartbeat_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same host, another pid namespace, process 1: a container restarted (its new run is
    # process 1 too). The real restart, in a new namespace: tests/integration/test_one_run_per_folder.py.
    monkeypatch.setattr(folder_lock, "HEARTBEAT_TIMEOUT_S", 1.0)
    write_lock(tmp_path, host=socket.gethostname(), pid=1, pid_namespace="pid:[1]", heartbeat_s=2.0)
    started = time.monotonic()
    held = folder_lock.acquire(tmp_path, "mine")
    assert 1.0 <= time.monotonic() - started < 5
    assert capsys.readouterr().out == (
        f"Took over the lock of {tmp_path} from run old-run, process 1 on host {socket.gethostname()}, since "
        f"then: it ran in another pid namespace of this host, and its heartbeat stood still for 1 s.\n"
    )
    folder_lock.release(tmp_path, held)


def test_a_held_lock_beats_until_it_is_released(tmp_path: Path) -> None:
    held = folder_lock.acquire(tmp_path, "mine")
    lock = tmp_path / LOCK_NAME
    before = lock.stat().st_mtime_ns
    time.sleep(folder_lock.HEARTBEAT_INTERVAL_S * 1.5)
    assert lock.stat().st_mtime_ns > before
    folder_lock.release(tmp_path, held)
    assert not lock.exists() and not held["_heartbeat"]._thread.is_alive()


def test_a_lock_of_an_older_version_from_another_host_is_taken_over_only_once_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(folder_lock.EXPIRY_ENV, "60")
    lock = write_lock(tmp_path, host="elsewhere", pid=1)  # no heartbeat_s: written before heartbeats
    with pytest.raises(FolderInUseError) as raised:
        folder_lock.acquire(tmp_path, "mine")
    assert re.search(
        r"run old-run, process 1 on host elsewhere, since then; its lock, written by a version without a "
        r"heartbeat, was refreshed \d+ s ago, less than PT_ACC_LOCK_EXPIRY=60 s, so it is taken to be alive",
        str(raised.value),
    )
    assert (
        f"To check: ps -o pid,lstart,args -p 1 on host elsewhere; if that is not a run saving into {tmp_path}, clear the lock: rm {lock}"
        in str(raised.value)
    )
    old = time.time() - 61
    os.utime(lock, (old, old))
    record = folder_lock.acquire(tmp_path, "mine")
    assert (
        "its lock, without a heartbeat, was not refreshed for 61 s (PT_ACC_LOCK_EXPIRY)"
        in capsys.readouterr().out
    )
    assert json.loads(lock.read_text()) == {k: v for k, v in record.items() if k != "_heartbeat"}
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]  # no private or stale copies left
    folder_lock.release(tmp_path, record)


def test_a_run_whose_lock_was_taken_over_saves_nothing_more(tmp_path: Path) -> None:
    class TakeOver(TrainerCallback):  # another host's run takes the folder after the first save
        event_order = STATE_SAVES_ORDER + 1  # after the saver's turn

        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            if trainer.progress.global_step == 1:
                write_lock(tmp_path, host="elsewhere", pid=1, run_id="new-run")

    trainer = make_trainer((SaveTrainingStateCallback(tmp_path, save_every_n_steps=1), TakeOver()))
    with pytest.raises(FolderInUseError) as raised:
        train(trainer)
    assert str(raised.value) == (
        f"This run's lock on {tmp_path} was taken over by another run (run new-run, process 1 on host "
        f"elsewhere, since then): it judged this run gone (no heartbeat for 20 s, or its process ended). "
        f"Nothing more is saved there, so the two runs' states do not mix; save into another folder. To "
        f"check which run holds the folder now: cat {tmp_path / LOCK_NAME}."
    )
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
    with pytest.raises(FolderInUseError, match="held by this process itself .*: by run run-a"):
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
