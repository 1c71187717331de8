"""``train(..., resume_from="auto")``: one script for the first launch and every relaunch.

Real runs of one process: fresh, resumed, a damaged newest state, no or several save folders, a
finished run, another run's states, and a process SIGKILLed and relaunched (a real subprocess,
``tests/distributed/workers/auto_resume.py``). The 2-process decisions are in
tests/distributed/test_auto_resume.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

import pytorch_accelerated
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, StopTrainingError, TrainerCallback
from pytorch_accelerated.checkpoints.auto_resume import AutoResume, decide
from pytorch_accelerated.checkpoints.directories import read_manifest
from pytorch_accelerated.checkpoints.folder_lock import LOCK_NAME, FolderInUseError
from tests import forked
from tests.helpers import make_regression_data, make_trainer, subprocess_env, weights
from tests.launch import WORKERS_DIR

DATA = make_regression_data(32)  # 4 updates per epoch in batches of 8
TIMEOUT_S = 120


class FailAt(TrainerCallback):
    def __init__(self, update: int) -> None:
        self.update = update

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == self.update:
            raise RuntimeError(f"injected failure at update {self.update}")


def run(
    folder: Path, num_epochs: int = 3, *extra: Any, save: Any = SaveTrainingStateCallback, **kwargs: Any
) -> Any:
    trainer = make_trainer([save(folder, save_every_n_steps=2), *extra], momentum=0.9)
    trainer.train(DATA, num_epochs=num_epochs, per_device_batch_size=8, resume_from="auto", **kwargs)
    return trainer


def uninterrupted(num_epochs: int = 3) -> dict[str, torch.Tensor]:
    trainer = make_trainer([], momentum=0.9)
    trainer.train(DATA, num_epochs=num_epochs, per_device_batch_size=8)
    return weights(trainer.get_model())


def test_auto_without_states_starts_a_new_run_saying_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    trainer = run(folder)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f'resume_from="auto": no training state in {folder}, starting a new run']
    assert trainer.progress.global_step == 12
    assert torch.equal(weights(trainer.get_model())["weight"], uninterrupted()["weight"])
    assert (folder / "final").is_dir() and not (folder / LOCK_NAME).exists()


def test_auto_after_a_failure_resumes_the_newest_state_naming_the_run_and_ends_bitwise_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError, match="injected failure at update 7"):
        run(folder, 3, FailAt(7))
    run_id = read_manifest(folder / "step_6")["run_id"]  # type: ignore[index]
    capsys.readouterr()
    trainer = run(folder)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f'resume_from="auto": resuming run {run_id} from {folder / "step_6"}, the newest usable state in '
        f"{folder} (epoch 2, update 6; skipping 2 batches already trained this epoch)"
    ]
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())


def test_auto_lists_the_folder_of_states_once_to_choose_the_state_and_resume_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError):
        run(folder, 3, FailAt(7))
    listings: list[Path] = []
    iterdir = Path.iterdir

    def listing(path: Path) -> Any:
        if path == folder:
            listings.append(path)
        return iterdir(path)

    class AtStart(TrainerCallback):
        def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
            self.listed = len(listings)

    monkeypatch.setattr(Path, "iterdir", listing)
    at_start = AtStart()
    trainer = run(folder, 3, at_start)
    assert at_start.listed == 1  # the plan: chosen once, then loaded and its accumulation decided
    assert trainer.resumed_from == folder / "step_6" and trainer.progress.global_step == 12


def test_auto_skips_a_damaged_newest_state_with_a_warning(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError):
        run(folder, 3, FailAt(7))
    model = folder / "step_6" / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    with pytest.warns(UserWarning, match=re.escape(f"Skipped the training state {folder / 'step_6'}: ")):
        trainer = run(folder)
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())


def test_auto_without_a_save_callback_is_refused_before_anything_runs(tmp_path: Path) -> None:
    trainer = make_trainer([])
    before = weights(trainer.get_model())
    with pytest.raises(ValueError) as error:
        trainer.train(DATA, num_epochs=1, resume_from="auto")
    assert str(error.value) == (
        'resume_from="auto" resumes from the folder of the run\'s SaveTrainingStateCallback, but this Trainer '
        "has none (its callbacks: none). Add one, e.g. callbacks=(*DEFAULT_CALLBACKS, "
        'SaveTrainingStateCallback(save_dir="checkpoints", save_every_n_steps=100)), or pass resume_from a '
        "folder of states, or None."
    )
    assert trainer.progress.global_step == 0
    assert all(torch.equal(value, before[name]) for name, value in weights(trainer.get_model()).items())


def test_auto_with_two_save_folders_is_refused_naming_both(tmp_path: Path) -> None:
    first, second = SaveTrainingStateCallback(tmp_path / "a"), SaveTrainingStateCallback(tmp_path / "b")
    with pytest.raises(ValueError) as error:
        make_trainer([first, second]).train(DATA, num_epochs=1, resume_from="auto")
    assert str(error.value) == (
        f'resume_from="auto" needs one folder of training states, but the Trainer\'s '
        f"SaveTrainingStateCallbacks save into 2: {tmp_path / 'a'}, {tmp_path / 'b'}. Save into one folder, "
        f"or pass resume_from the folder to resume from."
    )
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_auto_takes_a_subclass_of_the_save_callback(tmp_path: Path) -> None:
    class MySave(SaveTrainingStateCallback):
        pass

    with pytest.raises(RuntimeError):
        run(tmp_path / "states", 3, FailAt(3), save=MySave)
    assert run(tmp_path / "states", save=MySave).progress.global_step == 12


def test_auto_on_a_finished_run_trains_nothing_touches_no_state_and_says_how_to_start_anew(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    finished = run(folder)
    written = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    capsys.readouterr()
    again = run(folder)
    out = capsys.readouterr().out  # the line's text: tests/unit/test_resume_messages.py
    assert out.count("Nothing to train") == 1 and "to start a new run, save into another" in out
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == written
    assert again.progress.global_step == finished.progress.global_step == 12


def test_auto_on_another_runs_states_names_that_run_and_refuses_another_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    with pytest.raises(RuntimeError):
        run(folder, 3, FailAt(3))
    other_run = read_manifest(folder / "step_2")["run_id"]  # type: ignore[index]
    capsys.readouterr()
    run(folder)  # the same model: continued, and the line names the run it continues
    assert f"resuming run {other_run} from {folder / 'step_2'}" in capsys.readouterr().out
    wider = make_trainer([SaveTrainingStateCallback(folder)], model=torch.nn.Linear(3, 2))
    with pytest.raises(
        ValueError, match=r"holds no usable training state .*does not fit this model \(Linear\)"
    ):
        wider.train(DATA, num_epochs=4, per_device_batch_size=8, resume_from="auto")
    assert wider.progress.global_step == 0


def test_auto_refuses_a_folder_of_only_original_states(tmp_path: Path) -> None:
    original = tmp_path / "old" / "epoch_1"
    original.mkdir(parents=True)
    torch.save({"current_epoch": 1}, original / "trainer_metadata.pt")
    torch.save({}, original / "model.bin")
    with pytest.raises(ValueError, match=r'resume_from="auto" cannot choose a training state in .*0\.1\.x'):
        run(tmp_path / "old")


def node(rank: int, *states: str) -> dict[str, Any]:
    return {"rank": rank, "states": list(states), "problem": None}


def test_machines_that_see_different_states_resume_the_newest_they_all_have() -> None:
    folder = Path("checkpoints")
    assert decide(folder, [node(0, "step_6", "step_4"), node(2, "step_6", "step_4")]) == folder
    assert decide(folder, [node(0), node(2)]) is None
    assert decide(folder, [node(0, "step_6", "step_4"), node(2, "step_4", "step_2")]) == folder / "step_4"
    with pytest.raises(ValueError) as error:
        decide(folder, [node(0, "step_6", "step_4"), node(2)])
    assert str(error.value) == (
        'resume_from="auto" found training states in checkpoints on some machines but none that every '
        "machine has (process 0's machine: step_6, step_4; process 2's machine: none). The machines would "
        "continue from different positions, so the run cannot go on as it is. Copy the newest state into "
        "the folder of the machines that lack it, or start a new run into an empty folder on every machine."
    )


def test_a_process_killed_by_sigkill_is_relaunched_by_the_same_command_past_its_lock(tmp_path: Path) -> None:
    folder, script = tmp_path / "states", WORKERS_DIR / "auto_resume.py"
    results: list[Any] = []
    for name, args in (
        ("uninterrupted", ["--save-dir", str(tmp_path / "plain")]),
        ("killed", ["--save-dir", str(folder), "--kill-at-update", "5"]),
        ("relaunched", ["--save-dir", str(folder)]),
    ):
        out = tmp_path / name
        out.mkdir()
        done = forked.run(
            script, ["--out", str(out), *args], env=subprocess_env(out), cwd=out, timeout=TIMEOUT_S
        )
        results.append((done, json.loads((out / "rank0.json").read_text()) if name != "killed" else None))
    (_, plain), (killed, _), (relaunched, resumed) = results
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert relaunched.returncode == 0, relaunched.stdout + relaunched.stderr
    assert (
        f"from {folder / 'step_4'}, the newest usable state in {folder} (epoch 1, update 4;"
        in relaunched.stdout
    )
    assert resumed["weights"] == plain["weights"] and resumed["global_step"] == 36
    assert not (folder / LOCK_NAME).exists()
    shutil.rmtree(tmp_path / "plain")


# ---------------------------------------------------------------------------- no endless restart loop


class CountUpdates(TrainerCallback):
    def __init__(self) -> None:
        self.updates = 0

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self.updates += 1


@pytest.fixture
def entry_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A script file standing for the entry script of the runs in this process (``__main__``)."""
    script = tmp_path / "train.py"
    script.write_text("# the training script\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    return script


def test_the_same_failure_again_is_noted_and_the_next_auto_launch_ends_before_training(
    tmp_path: Path, entry_script: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    records, record = folder / ".failures", folder / ".failures" / "rank0.json"
    with pytest.raises(RuntimeError) as first:
        run(folder, 3, FailAt(7))
    assert not any("same failure" in note for note in getattr(first.value, "__notes__", []))
    assert json.loads(record.read_text())["count"] == 1
    with pytest.raises(RuntimeError) as second:
        run(folder, 3, FailAt(7))
    run_id = read_manifest(folder / "step_6")["run_id"]  # type: ignore[index]
    assert (
        f'resume_from="auto": the same failure as before, 2 times at update 7, this time after resuming from '
        f"update 6 of run {run_id}, with the same script and code (recorded in {records}): the next launch of "
        f'this code with resume_from="auto" that would start there again ends before training.'
        in second.value.__notes__
    )
    recorded = json.loads(record.read_text())
    digest = hashlib.sha256(entry_script.read_bytes()).hexdigest()
    assert {key: value for key, value in recorded.items() if key != "when"} == {
        "exception": "RuntimeError",
        "message": "injected failure at update 7",
        "raised_at": f"{Path(__file__).resolve()}:{FailAt.on_train_step_end.__code__.co_firstlineno + 2}",
        "update": 7,
        "epoch": 2,
        "batch": 3,
        "resumed_from": {"run_id": run_id, "update": 6, "stage": 1},
        "rank": 0,
        "script": str(entry_script),
        "script_sha256": digest,
        "version": pytorch_accelerated.__version__,
        "count": 2,
        "repeated": True,
    }
    counter = CountUpdates()
    capsys.readouterr()
    with pytest.raises(RuntimeError) as third:
        run(folder, 3, FailAt(7), counter)
    assert type(third.value).__name__ == "RepeatedFailureError" and counter.updates == 0
    assert str(third.value) == (
        f"resume_from=\"auto\": the same failure as before. RuntimeError: 'injected failure at update 7' at "
        f"update 7 (epoch 2, batch 3), raised at {recorded['raised_at']}, 2 times, the last after resuming "
        f"from update 6 of run {run_id}, on process 0, each time with the script {entry_script} (SHA-256 "
        f"{digest[:12]}...) with pytorch-accelerated {pytorch_accelerated.__version__} (recorded in {records}: "
        f"rank0.json). This launch ends here instead of training up to it again. Once the cause is fixed in "
        f"the script, launch again: a changed script is not held back. If the fix is elsewhere (a module it "
        f"imports, the data, the environment), clear the records of every process first: rm -r {records} (a "
        f"newer state in {folder} clears them too); or pass resume_from an earlier state of {folder} to try "
        f"from there."
    )
    assert "resum" not in capsys.readouterr().out  # refused before the line of a resume
    shutil.rmtree(records)  # the cause fixed elsewhere: the same command finishes the run
    trainer = run(folder)
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())
    assert not records.exists()


def test_a_changed_script_is_not_held_back_by_the_failures_of_the_old_one(
    tmp_path: Path, entry_script: Path
) -> None:
    folder = tmp_path / "checkpoints"
    for _ in range(2):
        with pytest.raises(RuntimeError):
            run(folder, 3, FailAt(7))
    with pytest.raises(RuntimeError, match="the same failure as before"):
        run(folder, 3, FailAt(7))  # the same script: held back
    entry_script.write_text("# the training script, fixed\n")
    trainer = run(folder)  # the fix: the first relaunch of the changed script trains to the end
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())
    assert not (folder / ".failures").exists()


class FailAtRunStart(TrainerCallback):
    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        raise RuntimeError("the tracker is unreachable")


def test_a_run_refused_or_failing_before_training_records_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "checkpoints"
    run(folder, 1)  # states to resume
    for _ in range(3):
        with pytest.raises(RuntimeError, match="the tracker is unreachable"):
            run(folder, 3, FailAtRunStart())
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        start = int(Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        (folder / LOCK_NAME).write_text(
            json.dumps(
                {"host": socket.gethostname(), "pid": holder.pid, "process_start": start, "run_id": "other",
                 "pid_namespace": os.readlink("/proc/self/ns/pid"), "since": "now", "token": "theirs"}
            )
        )  # fmt: skip
        capsys.readouterr()
        for _ in range(3):  # a concurrent second run, refused by the lock
            with pytest.raises(FolderInUseError):
                run(folder, 3, FailAt(7))
        assert 'resume_from="auto"' not in capsys.readouterr().out  # no resume line before the refusal
    finally:
        holder.kill()
        holder.wait()
    assert not (folder / ".failures").exists()
    trainer = run(folder)  # the holder gone, its relaunch takes the folder and resumes as usual
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())


def test_a_newer_state_clears_a_repeated_failure(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    for _ in range(2):
        with pytest.raises(RuntimeError):
            run(folder, 3, FailAt(7))
    # Progress made another way (an explicit resume past update 7): a newer state in the folder.
    make_trainer(
        [SaveTrainingStateCallback(folder, save_every_n_steps=2, save_at_end=False)], momentum=0.9
    ).train(DATA, num_epochs=3, per_device_batch_size=8, max_num_train_steps=9, resume_from=folder)
    trainer = run(folder)  # resumed from step_8
    assert trainer.progress.global_step == 12
    expected = uninterrupted()
    assert all(torch.equal(value, expected[name]) for name, value in weights(trainer.get_model()).items())
    assert not (folder / ".failures").exists()


def test_a_stop_is_not_a_failure_and_records_nothing(tmp_path: Path) -> None:
    class Stop(TrainerCallback):
        def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
            if trainer.progress.global_step == 3:
                raise StopTrainingError("enough")

    run(tmp_path / "checkpoints", 3, Stop())
    assert not (tmp_path / "checkpoints" / ".failures").exists()
    # A stop past a failure recorded before ends the run on purpose: it clears that record too.
    with pytest.raises(RuntimeError):
        run(tmp_path / "again", 3, FailAt(2))
    assert (tmp_path / "again" / ".failures" / "rank0.json").is_file()
    run(tmp_path / "again", 3, Stop())
    assert not (tmp_path / "again" / ".failures").exists()


def raised(message: str, own: bool = False) -> RuntimeError:
    try:
        if own:
            raise RuntimeError(message)  # another line than a lost peer's
        raise RuntimeError(message)
    except RuntimeError as error:
        return error


def test_a_lost_peer_never_counts_as_the_same_failure_but_a_failure_of_its_own_does(tmp_path: Path) -> None:
    relaunch = AutoResume(make_trainer().accelerator, tmp_path)
    relaunch.check_not_repeating({"run_id": "r", "update": 4})
    for _ in range(2):  # what a process sees when its peer was SIGKILLed in a collective
        lost = raised("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        relaunch.record_failure(lost, {"update": 5, "epoch": 1, "batch": 5})
    record = json.loads((tmp_path / ".failures" / "rank0.json").read_text())
    assert (record["count"], record["repeated"]) == (1, False) and not hasattr(lost, "__notes__")
    for _ in range(2):
        own = raised("CUDA error: an illegal memory access was encountered", own=True)
        relaunch.record_failure(own, {"update": 5, "epoch": 1, "batch": 5})
    record = json.loads((tmp_path / ".failures" / "rank0.json").read_text())
    assert (record["count"], record["repeated"], record["resumed_from"]) == (
        2,
        True,
        {"run_id": "r", "update": 4},
    )
