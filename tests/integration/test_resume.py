"""Exact resume: training states, ``train(resume_from=...)`` and ``SaveTrainingStateCallback``.

The run under test is ``tests/integration/workers/resume_worker.py`` (dropout, AdamW, a cosine schedule with
warm-up, gradient accumulation 2 with a partial last window, an evaluation set, a stateful
callback; 3 epochs of 9 optimizer steps, a state saved every 4 steps and after every epoch).
Where a process has to die, the worker runs as a real subprocess and is killed with SIGKILL
(or stopped with SIGTERM) at an exact point; the resume then runs here, in a fresh Trainer,
and must end bitwise equal to the uninterrupted run, with the same history.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.checkpoints.directories import read_manifest
from pytorch_accelerated.checkpoints.discovery import list_complete_states, resolve_state_dir
from tests.followed_runs import FollowedRun
from tests.helpers import (
    EventRecorder,
    as_version_1,
    reseal_state,
)
from tests.integration.workers import resume_worker as rw

WORKER = Path(rw.__file__).resolve()
TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------- helpers


def weights_of(trainer: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.get_model().state_dict().items()}


def assert_bitwise_equal(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert found.keys() == expected.keys()
    differing = [name for name in expected if not torch.equal(found[name], expected[name])]
    assert not differing, f"weights differ from the uninterrupted run in {differing}"


def state(states_dir: Path, step: int) -> Path:
    """The newest complete state of ``states_dir`` saved after ``step`` updates (``step_{N}``,
    or ``epoch_{E}`` / ``final`` at an epoch end), or the path ``step_{step}`` when there is none."""
    saved = [path for found, path in list_complete_states(states_dir) if found == step]
    if not saved:
        return states_dir / f"step_{step}"
    return max(saved, key=lambda path: (path / "manifest.json").stat().st_mtime_ns)


class Worker(FollowedRun):
    """``tests/integration/workers/resume_worker.py``, followed line by line (see :mod:`tests.followed_runs`)."""

    def __init__(self, out: Path, *args: str, nproc: int = 1) -> None:
        super().__init__(WORKER, out, *args, nproc=nproc, timeout_s=TIMEOUT_S)


# ---------------------------------------------------------------------------- the uninterrupted runs


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    """The uninterrupted run, in this process, with 0 and with 2 data-loader workers.

    Both save states like the worker does (into ``states``, which tests only read).
    """
    runs = {}
    for num_workers in (0, 2):
        states = tmp_path_factory.mktemp(f"reference_workers{num_workers}") / "states"
        trainer = rw.make_trainer(states)
        rw.train(trainer, num_workers=num_workers)
        runs[num_workers] = {
            "weights": weights_of(trainer),
            "history": rw.history_of(trainer),
            "states": states,
        }
    return runs


def test_saving_training_states_does_not_change_the_run(reference: dict[int, dict[str, Any]]) -> None:
    trainer = rw.make_trainer(save_dir=None)
    rw.train(trainer)
    assert_bitwise_equal(weights_of(trainer), reference[0]["weights"])
    assert rw.history_of(trainer) == reference[0]["history"]
    # The worker's own arithmetic: 3 epochs of 9 steps, states every 4 steps and each epoch.
    assert reference[0]["history"]["progress"]["global_step"] == rw.TOTAL_STEPS
    # Both the state saved after epoch 3 and the one saved at the end are at step 27.
    assert [(step, path.name) for step, path in list_complete_states(reference[0]["states"])] == [
        (4, "step_4"),
        (8, "step_8"),
        (9, "epoch_1"),
        (12, "step_12"),
        (16, "step_16"),
        (18, "epoch_2"),
        (20, "step_20"),
        (24, "step_24"),
        (27, "epoch_3"),
        (27, "final"),
    ]


def test_data_loader_workers_do_not_change_the_run(reference: dict[int, dict[str, Any]]) -> None:
    assert_bitwise_equal(reference[2]["weights"], reference[0]["weights"])
    assert reference[2]["history"] == reference[0]["history"]


# ---------------------------------------------------------------------------- killed and stopped processes

# name: (worker arguments, line to wait for, newest complete state then: (step, epoch, batch_index))
KILL_POINTS = {
    "mid_epoch": (("--pause-at-step", "6"), "PAUSED", (4, 0, 8)),
    "right_after_a_save": (("--pause-at-step", "12"), "PAUSED", (12, 1, 6)),
    "at_an_epoch_boundary": (("--pause-at-epoch", "1"), "PAUSED", (9, 1, 0)),
}
KILLED = [(name, workers) for name in KILL_POINTS for workers in (0, 2)]
SLOW_SAVE = 4  # the 4th save (step 12, after those at steps 4, 8 and 9) is killed half-way
SIGTERM_AT_STEP = 6


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Worker]:
    """Every interrupted run, started together to share their start-up time, then killed or stopped."""
    root = tmp_path_factory.mktemp("interrupted")
    workers = {
        f"{name}-{n}": Worker(root / f"{name}-{n}", *KILL_POINTS[name][0], "--num-workers", str(n))
        for name, n in KILLED
    }
    workers["during_save"] = Worker(root / "during_save", "--slow-save", str(SLOW_SAVE))
    workers["sigterm"] = Worker(root / "sigterm", "--pause-at-step", str(SIGTERM_AT_STEP))
    try:
        for name, n in KILLED:
            workers[f"{name}-{n}"].wait_for_line(KILL_POINTS[name][1])
            workers[f"{name}-{n}"].kill()
        workers["during_save"].wait_for_line("SAVING")
        workers["during_save"].kill()
        workers["sigterm"].wait_for_line("PAUSED")
        workers["sigterm"].process.send_signal(signal.SIGTERM)
        workers["sigterm"].wait()
    finally:
        for worker in workers.values():
            worker.kill()
    return workers


@pytest.mark.parametrize("name, num_workers", KILLED)
def test_run_killed_with_sigkill_resumes_from_its_newest_state_to_bitwise_equal_weights_and_history(
    interrupted: dict[str, Worker], reference: dict[int, dict[str, Any]], name: str, num_workers: int
) -> None:
    worker = interrupted[f"{name}-{num_workers}"]
    assert worker.process.returncode == -signal.SIGKILL, worker.describe()
    assert not (worker.out / "weights.pt").exists(), "the run was meant to be killed before its end"
    states = worker.out / "states"
    step, epoch, batch_index = KILL_POINTS[name][2]
    newest = resolve_state_dir(states)
    assert newest == state(states, step)
    manifest = read_manifest(newest)
    assert (manifest["global_step"], manifest["epoch"], manifest["batch_index"]) == (step, epoch, batch_index)

    trainer = rw.make_trainer()
    rw.train(trainer, resume_from=states, num_workers=num_workers)

    assert_bitwise_equal(weights_of(trainer), reference[num_workers]["weights"])
    assert rw.history_of(trainer) == reference[num_workers]["history"]


def test_kill_during_a_save_leaves_only_a_hidden_directory_without_manifest(
    interrupted: dict[str, Worker],
) -> None:
    worker = interrupted["during_save"]
    assert worker.process.returncode == -signal.SIGKILL, worker.describe()
    states = worker.out / "states"
    half_written = states / ".step_12.incomplete"
    assert half_written.is_dir()
    assert (half_written / "model.pt").is_file() and not (half_written / "manifest.json").exists()
    assert not state(states, 12).exists()
    assert [step for step, _ in list_complete_states(states)] == [4, 8, 9]
    assert resolve_state_dir(states) == state(states, 9)


def test_state_before_a_killed_save_is_intact_and_loadable(
    interrupted: dict[str, Worker], reference: dict[int, dict[str, Any]]
) -> None:
    previous = state(interrupted["during_save"].out / "states", 9)
    trainer = rw.make_trainer()
    rw.train(trainer, num_epochs=2)  # a finished run whose every piece the load must overwrite
    trainer.load_training_state(previous)
    expected = rw.make_trainer()
    expected.load_training_state(state(reference[0]["states"], 9))
    assert_bitwise_equal(weights_of(trainer), weights_of(expected))
    assert trainer.progress.state_dict() == {"epoch": 1, "global_step": 9, "batch_index": 0, "epoch_step": 0}
    assert trainer.run_history.state_dict() == expected.run_history.state_dict()


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs, no handler sees it."""


def test_kill_while_replacing_a_state_of_the_same_name_leaves_one_that_resume_from_finds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = small_run(None, scheduler=None)
    trainer.save_training_state(tmp_path / "latest")
    real_replace = os.replace

    def replace_then_killed(source: Any, destination: Any) -> None:
        if Path(source).name == ".latest.incomplete":  # the old state has just been moved aside
            raise Killed
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", replace_then_killed)
    with pytest.raises(Killed):
        trainer.save_training_state(tmp_path / "latest")
    monkeypatch.undo()

    assert read_manifest(resolve_state_dir(tmp_path / "latest")) is not None


def test_relaunch_after_a_kill_during_a_save_resumes_from_the_parent_folder_to_bitwise_equal_weights(
    interrupted: dict[str, Worker], reference: dict[int, dict[str, Any]]
) -> None:
    out = interrupted["during_save"].out
    relaunch = Worker(out / "relaunch", "--resume-from", str(out / "states"))
    assert relaunch.wait() == 0, relaunch.describe()
    assert_bitwise_equal(torch.load(relaunch.out / "weights.pt", weights_only=True), reference[0]["weights"])
    assert (
        json.loads((relaunch.out / "history.json").read_text())["run_history"]
        == reference[0]["history"]["run_history"]
    )
    # The relaunch started at step 9, after the epoch boundary.
    assert "STEP 9" not in relaunch.output.splitlines() and "STEP 10" in relaunch.output.splitlines()


def test_sigterm_finishes_the_step_saves_and_exits_0_then_resume_ends_bitwise_equal(
    interrupted: dict[str, Worker], reference: dict[int, dict[str, Any]]
) -> None:
    worker = interrupted["sigterm"]
    assert worker.process.returncode == 0, worker.describe()
    # One process checks for the signal after every step: the run stops after the next one.
    stopped_at = SIGTERM_AT_STEP + 1
    result = json.loads((worker.out / "history.json").read_text())
    assert result["progress"]["global_step"] == stopped_at < rw.TOTAL_STEPS
    assert f"STEP {stopped_at + 1}" not in worker.output.splitlines()
    states = worker.out / "states"
    assert resolve_state_dir(states) == state(states, stopped_at)

    trainer = rw.make_trainer()
    rw.train(trainer, resume_from=states)

    assert_bitwise_equal(weights_of(trainer), reference[0]["weights"])
    assert rw.history_of(trainer) == reference[0]["history"]


# ---------------------------------------------------------------------------- states saved in this process


def small_run(save_dir: Path | None, scheduler: Any = "cosine", **trainer_kwargs: Any) -> Any:
    trainer = rw.make_trainer(save_dir, **trainer_kwargs)
    rw.train(trainer, create_scheduler_fn=scheduler, num_epochs=2)
    return trainer


SCHEDULERS = {
    "cosine": "cosine",
    "torch_step_lr": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5),
    "none": None,
}


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_state_saved_after_every_step_resumes_to_bitwise_equal_weights_and_history(
    tmp_path: Path, scheduler: str
) -> None:
    uninterrupted = small_run(tmp_path, SCHEDULERS[scheduler], save_every_n_steps=1, save_every_n_epochs=None)
    saved = list_complete_states(tmp_path)
    # step_1 ... step_18, and final (also at step 18: saved at the end of the run).
    assert sorted(path.name for _, path in saved) == sorted(
        [*(f"step_{step}" for step in range(1, 2 * rw.STEPS_PER_EPOCH + 1)), "final"]
    )
    assert [step for step, _ in saved] == sorted(
        [*range(1, 2 * rw.STEPS_PER_EPOCH + 1), 2 * rw.STEPS_PER_EPOCH]
    )
    for step, directory in saved:
        trainer = rw.make_trainer()
        rw.train(trainer, resume_from=directory, create_scheduler_fn=SCHEDULERS[scheduler], num_epochs=2)
        assert_bitwise_equal(weights_of(trainer), weights_of(uninterrupted))
        assert (
            trainer.run_history.state_dict()["metrics"] == uninterrupted.run_history.state_dict()["metrics"]
        ), step
        assert trainer.progress.global_step == uninterrupted.progress.global_step
        if step < 2 * rw.STEPS_PER_EPOCH:  # the last state is the end of the run: nothing left to do
            assert rw.history_of(trainer) == rw.history_of(uninterrupted), step


def test_states_saved_by_a_resumed_run_resume_to_bitwise_equal_weights(tmp_path: Path) -> None:
    uninterrupted = small_run(None)
    first = small_run(tmp_path / "first", save_every_n_steps=3, save_every_n_epochs=None)
    resumed = rw.make_trainer(tmp_path / "second", save_every_n_steps=2, save_every_n_epochs=None)
    rw.train(resumed, resume_from=state(tmp_path / "first", 3), num_epochs=2)
    again = rw.make_trainer()
    rw.train(again, resume_from=state(tmp_path / "second", 8), num_epochs=2)
    for trainer in (first, resumed, again):
        assert_bitwise_equal(weights_of(trainer), weights_of(uninterrupted))
        assert rw.history_of(trainer) == rw.history_of(uninterrupted)


def test_state_saved_at_the_end_of_a_run_records_the_history_epoch_unchanged(tmp_path: Path) -> None:
    trainer = small_run(tmp_path, save_every_n_steps=None, save_every_n_epochs=None)  # save_at_end only
    loaded = rw.make_trainer()
    loaded.load_training_state(tmp_path)
    assert loaded.run_history.current_epoch == trainer.run_history.current_epoch == 3


def test_saving_repeatedly_into_the_same_directory_leaves_one_loadable_state(tmp_path: Path) -> None:
    trainer = small_run(None, scheduler=None)
    for value in range(3):
        trainer.save_training_state(tmp_path / "state", checkpoint_kwargs={"attempt": value})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]
    loaded = rw.make_trainer()
    assert loaded.load_training_state(tmp_path / "state") == {"current_epoch": 2, "attempt": 2}
    assert_bitwise_equal(weights_of(loaded), weights_of(trainer))


class Counting(TrainerCallback):
    """Records how many samples and batches were loaded during each training epoch."""

    def __init__(self, dataset: rw.RegressionData, collated: list[int]) -> None:
        self.dataset, self.collated = dataset, collated
        self.per_epoch: list[tuple[int, int]] = []

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        self.dataset.num_loaded, self.collated[0] = 0, 0

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.per_epoch.append((self.dataset.num_loaded, self.collated[0]))


def test_resume_mid_epoch_never_loads_or_collates_the_skipped_batches(
    reference: dict[int, dict[str, Any]],
) -> None:
    train_set, eval_set = rw.make_datasets()
    collated = [0]

    def collate(samples: list[Any]) -> Any:
        collated[0] += 1
        return torch.utils.data.default_collate(samples)

    counting = Counting(train_set, collated)
    trainer = rw.make_trainer(extra_callbacks=(counting,))
    trainer.train(
        train_set,
        num_epochs=rw.NUM_EPOCHS,
        eval_dataset=eval_set,
        per_device_batch_size=rw.PER_DEVICE_BATCH_SIZE,
        gradient_accumulation_steps=rw.GRADIENT_ACCUMULATION_STEPS,
        create_scheduler_fn=rw.make_scheduler_fn(),
        collate_fn=collate,
        resume_from=state(reference[0]["states"], 4),  # batch 8 of epoch 0: 32 samples done
        seed=7,
    )
    batches = -(-rw.NUM_TRAIN_SAMPLES // rw.PER_DEVICE_BATCH_SIZE)
    assert counting.per_epoch == [
        (rw.NUM_TRAIN_SAMPLES - 32, batches - 8),
        *[(rw.NUM_TRAIN_SAMPLES, batches)] * 2,
    ]
    assert_bitwise_equal(weights_of(trainer), reference[0]["weights"])


def test_max_checkpoints_keeps_only_the_newest_states(tmp_path: Path) -> None:
    small_run(tmp_path, save_every_n_steps=1, save_every_n_epochs=None, max_checkpoints=3)
    # Deleted in the order they were saved: final (at step 18 too) was saved last.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final", "step_17", "step_18"]


def test_resume_from_parent_takes_the_newest_complete_state_and_ignores_newer_incomplete_ones(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    states = tmp_path / "states"
    for step in (8, 12):
        shutil.copytree(state(reference[0]["states"], step), state(states, step))
    # Newer, but incomplete: no manifest; a manifest that does not say complete; a hidden temporary.
    shutil.copytree(state(states, 12), state(states, 16))
    (state(states, 16) / "manifest.json").unlink()
    shutil.copytree(state(states, 12), state(states, 20))
    manifest = json.loads((state(states, 20) / "manifest.json").read_text())
    (state(states, 20) / "manifest.json").write_text(
        json.dumps(as_version_1({**manifest, "global_step": 20, "complete": False}))
    )
    shutil.copytree(state(states, 12), states / ".step_24.incomplete")

    assert resolve_state_dir(states) == state(states, 12)
    trainer = rw.make_trainer()
    rw.train(trainer, resume_from=states)
    assert_bitwise_equal(weights_of(trainer), reference[0]["weights"])


# ---------------------------------------------------------------------------- files that are not what they claim


class RunsCodeWhenUnpickled:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("file_name", ["model.pt", "trainer_state.pt", "optimizer.pt", "rng_state_0.pt"])
def test_crafted_pickle_in_a_state_is_refused_without_running_it(
    tmp_path: Path, reference: dict[int, dict[str, Any]], file_name: str
) -> None:
    crafted = tmp_path / "state"
    shutil.copytree(state(reference[0]["states"], 4), crafted)
    marker = tmp_path / "code_ran"
    torch.save({"payload": RunsCodeWhenUnpickled(marker)}, crafted / file_name)
    reseal_state(crafted)  # as whoever crafted it could: a checksum is no signature
    with pytest.raises(pickle.UnpicklingError, match=f"Refused to load .*{file_name}.*weights_only=True"):
        rw.make_trainer().load_training_state(crafted)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        rw.train(rw.make_trainer(), resume_from=crafted)
    assert not marker.exists()


NUMPY_SCALARS = [
    pytest.param(np.float32(0.25), 0.25, id="float32"),
    pytest.param(np.float64(0.25), 0.25, id="float64"),
    pytest.param(np.float16(0.5), 0.5, id="float16"),
    pytest.param(np.int64(7), 7, id="int64"),
    pytest.param(np.uint8(255), 255, id="uint8"),
    pytest.param(np.bool_(True), True, id="bool_"),
    pytest.param(np.str_("best"), "best", id="str_"),
]


@pytest.fixture(scope="module")
def finished_trainer() -> Any:
    return small_run(None, scheduler=None)


@pytest.mark.parametrize("value, expected", NUMPY_SCALARS)
def test_numpy_scalar_in_checkpoint_kwargs_round_trips_as_a_python_value(
    tmp_path: Path, finished_trainer: Any, value: Any, expected: Any
) -> None:
    finished_trainer.save_training_state(
        tmp_path / "state", checkpoint_kwargs={"value": value, "in_list": [value]}
    )
    loaded = rw.make_trainer().load_training_state(tmp_path / "state")
    assert loaded == {"current_epoch": 2, "value": expected, "in_list": [expected]}
    assert type(loaded["value"]) is type(expected)


def test_paths_in_checkpoint_kwargs_round_trip_as_strings(tmp_path: Path, finished_trainer: Any) -> None:
    checkpoint_kwargs = {"data_dir": Path("/data/train"), "nested": {"where": (Path("a") / "b", 1.5)}}
    finished_trainer.save_training_state(tmp_path / "state", checkpoint_kwargs=checkpoint_kwargs)

    loaded = rw.make_trainer().load_training_state(tmp_path / "state")

    assert loaded == {
        "current_epoch": 2,
        "data_dir": "/data/train",
        "nested": {"where": (str(Path("a") / "b"), 1.5)},
    }
    assert Path(loaded["data_dir"]) == checkpoint_kwargs["data_dir"]


# ---------------------------------------------------------------------------- bad input, refused before training


def make_recording_trainer(**kwargs: Any) -> tuple[Any, list[str], dict[str, torch.Tensor]]:
    log: list[str] = []
    trainer = rw.make_trainer(extra_callbacks=(EventRecorder(log),), **kwargs)
    return trainer, log, weights_of(trainer)


def assert_nothing_trained(trainer: Any, log: list[str], weights_before: dict[str, torch.Tensor]) -> None:
    assert log == ["on_init_end"], "an event fired: training had started"
    assert_bitwise_equal(weights_of(trainer), weights_before)
    assert trainer.progress.global_step == 0


def test_resume_from_a_missing_directory_fails_before_training(tmp_path: Path) -> None:
    trainer, log, before = make_recording_trainer()
    with pytest.raises(FileNotFoundError, match=r"resume_from='.*nowhere': no such directory"):
        rw.train(trainer, resume_from=tmp_path / "nowhere")
    assert_nothing_trained(trainer, log, before)


def test_resume_from_an_empty_directory_fails_before_training(tmp_path: Path) -> None:
    trainer, log, before = make_recording_trainer()
    with pytest.raises(ValueError, match=r"holds no complete training state \(found: nothing\)"):
        rw.train(trainer, resume_from=tmp_path)
    assert_nothing_trained(trainer, log, before)


def test_resume_from_a_state_without_manifest_says_it_lost_it_before_training(
    tmp_path: Path, reference: dict[int, dict[str, Any]]
) -> None:
    incomplete = shutil.copytree(state(reference[0]["states"], 8), tmp_path / "step_8")
    (incomplete / "manifest.json").unlink()
    trainer, log, before = make_recording_trainer()
    with pytest.raises(ValueError) as raised:
        rw.train(trainer, resume_from=incomplete)
    assert str(raised.value) == (
        f"resume_from={str(incomplete)!r} holds the files of a training state but has lost its manifest.json "
        f"(deleted, or the state copied without it: a save publishes a state only with its manifest), so its "
        f"files cannot be checked. Put its manifest.json back first, or resume from another state, or from the "
        f"parent folder to pick its newest complete one."
    )
    assert_nothing_trained(trainer, log, before)


def test_resume_from_a_state_of_a_different_model_names_the_mismatched_keys_and_shapes_before_training(
    reference: dict[int, dict[str, Any]],
) -> None:
    trainer, log, before = make_recording_trainer(hidden=8)
    with pytest.raises(RuntimeError, match="does not fit this model") as error:
        rw.train(trainer, resume_from=state(reference[0]["states"], 8))
    message = str(error.value)
    assert "0.weight: (16, 5) in the file, (8, 5) in the model" in message
    assert "3.weight: (1, 16) in the file, (1, 8) in the model" in message
    assert_nothing_trained(trainer, log, before)


@pytest.mark.parametrize(
    "changed, now, batch_index",
    [({"per_device_batch_size": 2}, "1 x 2 x 2", 16), ({"gradient_accumulation_steps": 1}, "1 x 4 x 1", 8)],
    ids=["per_device_batch_size", "gradient_accumulation_steps"],
)
def test_mid_epoch_resume_with_other_batch_settings_warns_naming_both_and_continues_after_the_same_samples(
    reference: dict[int, dict[str, Any]], changed: dict[str, int], now: str, batch_index: int
) -> None:
    # The state after step 4 (batch 8 of 4 samples: 32 of the epoch's 66 seen); on the new
    # settings the position is batch 32 / (batch size) and the rest of the epoch is the other 34.
    positions: list[dict[str, int]] = []

    class RecordStart(TrainerCallback):
        def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
            positions.append(trainer.progress.state_dict())

    trainer = rw.make_trainer(extra_callbacks=(RecordStart(),))
    with pytest.warns(UserWarning, match="mid-epoch: it was saved with") as warned:
        rw.train(trainer, resume_from=state(reference[0]["states"], 4), **changed)
    assert any(
        f"saved with 1 process(es) x per_device_batch_size 4 x gradient_accumulation_steps 2, resumed with {now}. "
        "32 samples of epoch 1's order were seen" in str(w.message)
        for w in warned
    )
    assert positions == [{"epoch": 0, "global_step": 4, "batch_index": batch_index, "epoch_step": 4}]
    # The rest of epoch 1 (34 samples: 9 updates either way), then 2 epochs of 17 updates.
    assert trainer.progress.global_step == 4 + 9 + 2 * 17


def test_mid_epoch_resume_with_a_different_training_set_is_refused_before_training(
    reference: dict[int, dict[str, Any]],
) -> None:
    trainer, log, before = make_recording_trainer()
    datasets = (rw.RegressionData(70, seed=1), rw.RegressionData(rw.NUM_EVAL_SAMPLES, seed=2))
    with pytest.raises(
        ValueError, match="saved mid-epoch over a training set of 66 samples, but this run's has 70"
    ):
        rw.train(trainer, resume_from=state(reference[0]["states"], 4), datasets=datasets)
    assert_nothing_trained(trainer, log, before)


def test_epoch_boundary_resume_with_another_batch_size_warns_what_changed_and_continues(
    reference: dict[int, dict[str, Any]],
) -> None:
    trainer = rw.make_trainer()
    with pytest.warns(UserWarning, match="saved at an epoch boundary") as warned:
        rw.train(trainer, resume_from=state(reference[0]["states"], 9), per_device_batch_size=8)
    assert any(
        "per_device_batch_size 4 x gradient_accumulation_steps 2, resumed with 1 x 8 x 2" in str(w.message)
        for w in warned
    )
    # Two more epochs of ceil(ceil(66 / 8) / 2) = 5 steps after the first epoch's 9.
    assert trainer.progress.global_step == 9 + 2 * 5
    assert trainer.run_history.get_metric_values("batches_seen") == [17, 17 + 9, 17 + 18]


class SaveAfterFirstBatch(TrainerCallback):
    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.batch_index == 1:
            trainer.save_training_state(self.output_dir)


def test_saving_inside_an_accumulation_window_raises_and_writes_nothing(tmp_path: Path) -> None:
    trainer = rw.make_trainer(extra_callbacks=(SaveAfterFirstBatch(tmp_path / "state"),))
    with pytest.raises(RuntimeError, match="in the middle of a gradient accumulation window"):
        rw.train(trainer)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- another number of processes


@pytest.fixture(scope="module")
def two_process_states(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """States saved by the worker run on 2 processes x per-device batch 2 (4 samples per batch)."""
    worker = Worker(tmp_path_factory.mktemp("two_processes"), "--per-device-batch-size", "2", nproc=2)
    assert worker.wait() == 0, worker.describe()
    assert json.loads((worker.out / "history.json").read_text())["num_processes"] == 2
    return worker.out / "states"


@pytest.mark.distributed
def test_mid_epoch_state_of_2_processes_resumes_on_1_with_the_same_samples_per_batch_with_a_warning(
    two_process_states: Path,
) -> None:
    trainer = rw.make_trainer()
    with pytest.warns(
        UserWarning, match="saved with 2 process\\(es\\) x per_device_batch_size 2 .* resumed with 1 x 4 x 2"
    ):
        rw.train(trainer, resume_from=state(two_process_states, 4))
    assert trainer.run_config.num_processes == 1
    assert trainer.progress.global_step == rw.TOTAL_STEPS
    # The 8 batches done before the save are not run again: 17 per epoch in all.
    assert trainer.run_history.get_metric_values("batches_seen") == [17, 34, 51]


@pytest.mark.distributed
def test_mid_epoch_state_of_2_processes_resumes_on_1_with_fewer_samples_per_batch_after_the_same_samples(
    two_process_states: Path,
) -> None:
    trainer = rw.make_trainer()
    with pytest.warns(
        UserWarning,
        match="saved with 2 process\\(es\\) x per_device_batch_size 2 .* resumed with 1 x 2 x 2. 32 samples",
    ):
        rw.train(trainer, resume_from=state(two_process_states, 4), per_device_batch_size=2)
    # 32 of 66 samples seen (8 batches of 2 x 2): the other 34 are 17 batches (9 updates), then
    # 2 epochs of 33 batches (17 updates each).
    assert trainer.progress.global_step == 4 + 9 + 2 * 17
    assert trainer.run_history.get_metric_values("batches_seen") == [8 + 17, 8 + 17 + 33, 8 + 17 + 66]
