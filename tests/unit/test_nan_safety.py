"""NaN never reaches a kept checkpoint: every writer of weights refuses, the run stops, rotation
keeps the newest finite state, and a resumed run starts from it.

The NaN is real: from the ``nan_from``-th optimizer update on, the training loss is multiplied
by NaN, so that update and every later one write NaN into the weights.
"""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    STATE_SAVES_ORDER,
    ModelEmaCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TerminateOnNaNCallback,
    TrainerCallback,
    get_default_callbacks,
)
from pytorch_accelerated.callbacks.wsd_checkpoints import WSDCheckpointCallback
from pytorch_accelerated.checkpoints.files import safe_torch_load
from pytorch_accelerated.checkpoints.finite import NonFiniteStateError, non_finite_flag, state_is_finite
from pytorch_accelerated.schedulers import WSDLrScheduler
from tests.helpers import as_version_1, make_regression_data
from tests.helpers import make_trainer as make_any_trainer

STEPS_PER_EPOCH = 12  # 24 samples, 2 per batch
CHECK_EVERY = 10  # TerminateOnNaNCallback's default


class NaNFromUpdate(Trainer):
    """The loss of the ``nan_from``-th optimizer update (counted from 1) and of every later one is NaN."""

    def __init__(self, *args: Any, nan_from: int | None, **kwargs: Any) -> None:
        self.nan_from = nan_from
        super().__init__(*args, **kwargs)

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if self.nan_from is not None and self.progress.global_step + 1 >= self.nan_from:
            output["loss"] = output["loss"] * float("nan")
        return output


class RecordRunEnd(TrainerCallback):
    """Placed last: proves the end hooks after a refused save still ran."""

    def __init__(self) -> None:
        self.run_end_step: int | None = None

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.run_end_step = trainer.progress.global_step


class RecordEpochNumber(TrainerCallback):
    """Records a metric that improves every epoch, so that savers of the best want to save."""

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("epoch_number", trainer.progress.epoch + 1)


make_trainer = functools.partial(make_any_trainer, trainer_class=NaNFromUpdate)


def kept_states(save_dir: Path) -> dict[int, dict[str, torch.Tensor]]:
    """Every complete state's weights, by global step."""
    states: dict[int, dict[str, torch.Tensor]] = {}
    for directory in sorted(save_dir.iterdir()) if save_dir.exists() else ():
        manifest = json.loads((directory / "manifest.json").read_text())
        states[manifest["global_step"]] = safe_torch_load(directory / "model.pt")
    return states


def is_finite(state: dict[str, torch.Tensor]) -> bool:
    return all(bool(value.isfinite().all()) for value in state.values())


# ---------------------------------------------------------------- the issue's reproduction


@pytest.mark.parametrize("nan_from", [*range(1, STEPS_PER_EPOCH + 1), 13, 19])
def test_a_nan_at_any_step_never_reaches_a_kept_training_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], nan_from: int
) -> None:
    save_dir = tmp_path / "states"
    saver, end = SaveTrainingStateCallback(save_dir, save_every_n_steps=2, max_checkpoints=2), RecordRunEnd()
    trainer = make_trainer((*get_default_callbacks(progress_bar=False), saver, end), nan_from=nan_from)
    trainer.train(
        make_regression_data(2 * STEPS_PER_EPOCH), num_epochs=2, per_device_batch_size=2
    )  # returns normally

    stopped_at = trainer.progress.global_step
    assert nan_from <= stopped_at < nan_from + CHECK_EVERY
    assert end.run_end_step == stopped_at  # the end hooks after the refused save_at_end ran
    states = kept_states(save_dir)
    assert all(is_finite(weights) for weights in states.values()), sorted(states)
    last_finite_save = 2 * ((nan_from - 1) // 2)  # the last even step before the NaN update
    assert sorted(states) == [step for step in (last_finite_save - 2, last_finite_save) if step > 0]
    out = capsys.readouterr().out
    # The save at the end of the run (save_dir/final) is refused too, and says so.
    assert f"Not saving the training state {str(save_dir / 'final')!r} at step {stopped_at}" in out


def test_the_issues_run_stops_at_the_first_save_after_the_nan_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_dir = tmp_path / "states"
    saver = SaveTrainingStateCallback(save_dir, save_every_n_steps=2, max_checkpoints=2)
    trainer = make_trainer((*get_default_callbacks(progress_bar=False), saver), nan_from=7)
    trainer.train(make_regression_data(40), num_epochs=2, per_device_batch_size=2)
    refused = str(save_dir / "step_8")
    out = capsys.readouterr().out
    assert (
        f"Training stopped: Not saving the training state {refused!r} at step 8: the weights hold NaN or "
        f"infinity and the training loss of this epoch was NaN or infinite; nothing was written, and what "
        f"was saved before is kept."
    ) in out
    # save_at_end refuses too, and says so.
    assert out.count(f"Not saving the training state {refused!r} at step 8") == 1
    assert out.count(f"Not saving the training state {str(save_dir / 'final')!r} at step 8") == 1
    assert sorted(p.name for p in save_dir.iterdir()) == ["step_4", "step_6"]

    # A resumed run starts from the newest finite state, the one before the NaN.
    starts: list[tuple[int, bool]] = []

    class RecordStart(TrainerCallback):
        def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
            starts.append(
                (
                    trainer.progress.global_step,
                    all(bool(p.isfinite().all()) for p in trainer.model.parameters()),
                )
            )

    resumed = make_trainer(
        (RecordStart(), SaveTrainingStateCallback(save_dir, save_at_end=False)), nan_from=None
    )
    resumed.train(make_regression_data(40), num_epochs=2, per_device_batch_size=2, resume_from=save_dir)
    assert starts == [(6, True)]
    assert resumed.progress.global_step == 40
    assert all(bool(p.isfinite().all()) for p in resumed.model.parameters())


# ---------------------------------------------------------------- rotation


def poisoned_copy(state: Path, global_step: int, finite_key: bool | None) -> Path:
    """A copy of ``state`` that claims ``global_step`` and holds NaN weights, as an older version
    could have written it: with ``"finite": false`` in its manifest, or (None) no such key."""
    copy = state.parent / f"step_{global_step}"
    shutil.copytree(state, copy)
    weights = safe_torch_load(copy / "model.pt")
    torch.save({name: value * float("nan") for name, value in weights.items()}, copy / "model.pt")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["global_step"] = global_step
    manifest.pop("run_step", None)  # older versions: ordered by the global step
    manifest.pop("finite", None)
    if finite_key is not None:
        manifest["finite"] = finite_key
    (copy / "manifest.json").write_text(json.dumps(as_version_1(manifest)))
    return copy


def test_rotation_never_deletes_the_newest_finite_state_for_newer_non_finite_ones(tmp_path: Path) -> None:
    save_dir = tmp_path / "states"
    first = make_trainer((), nan_from=None)
    first.train(make_regression_data(8), num_epochs=1, per_device_batch_size=2)
    first.save_training_state(save_dir / "seed-state")
    poisoned_copy(save_dir / "seed-state", 100, finite_key=False)
    poisoned_copy(save_dir / "seed-state", 101, finite_key=None)
    shutil.rmtree(save_dir / "seed-state")

    seen: list[list[str]] = []

    class ListStates(TrainerCallback):  # runs after the saver: sees each rotation's result
        event_order = STATE_SAVES_ORDER + 1

        def on_train_step_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            seen.append(sorted(p.name for p in save_dir.iterdir() if p.name != ".run.lock"))

    saver = SaveTrainingStateCallback(save_dir, save_every_n_steps=2, max_checkpoints=2, save_at_end=False)
    make_trainer((saver, ListStates()), nan_from=None).train(
        make_regression_data(12), num_epochs=1, per_device_batch_size=2
    )
    # 6 updates: a state at 2, 4 and 6, each kept beside the newest poisoned one.
    assert seen[1::2] == [sorted([f"step_{step}", "step_101"]) for step in (2, 4, 6)]


# ---------------------------------------------------------------- the other writers of weights


def test_save_best_refuses_nan_weights_stops_and_keeps_the_best_finite_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "best.pt"
    best = SaveBestModelCallback(path, watch_metric="epoch_number", greater_is_better=True)
    trainer = make_trainer(
        (RecordEpochNumber(), best), nan_from=STEPS_PER_EPOCH + 3
    )  # in epoch 2, no NaN guard
    trainer.train(make_regression_data(2 * STEPS_PER_EPOCH), num_epochs=3, per_device_batch_size=2)
    assert trainer.progress.epoch == 2  # stopped at the end of epoch 2, not 3
    saved = safe_torch_load(path)
    assert saved["epoch"] == 1 and is_finite(saved["model_state_dict"])
    assert best.best_epoch == 1
    # ... and the best finite weights are loaded back at the end
    assert all(bool(p.isfinite().all()) for p in trainer.model.parameters())
    out = capsys.readouterr().out
    assert (
        f"Training stopped: Not saving the checkpoint {str(path)!r} at step {2 * STEPS_PER_EPOCH}: the weights hold NaN"
        in out
    )


def test_ema_refuses_nan_weights_during_the_run_and_at_its_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    during, at_end = tmp_path / "ema_best.pt", tmp_path / "ema_end.pt"
    watching = ModelEmaCallback(save_path=during, watch_metric="epoch_number", greater_is_better=True)
    trainer = make_trainer((RecordEpochNumber(), watching), nan_from=STEPS_PER_EPOCH + 3)
    data = make_regression_data(2 * STEPS_PER_EPOCH)
    trainer.train(data, num_epochs=3, per_device_batch_size=2, eval_dataset=make_regression_data(4))
    saved = safe_torch_load(during)
    assert saved["epoch"] == 1 and is_finite(saved["model_state_dict"])
    assert trainer.progress.epoch == 2

    end = RecordRunEnd()
    at_end_only = ModelEmaCallback(save_path=at_end, evaluate_during_training=False)
    make_trainer((at_end_only, end), nan_from=5).train(data, num_epochs=1, per_device_batch_size=2)
    assert not at_end.exists()
    assert end.run_end_step == STEPS_PER_EPOCH  # the end hooks after the refusal ran
    out = capsys.readouterr().out
    assert f"Not saving the checkpoint {str(at_end)!r} at step {STEPS_PER_EPOCH}: the weights hold NaN" in out


def test_wsd_does_not_write_checkpoints_after_a_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wsd = WSDCheckpointCallback(save_dir=tmp_path)
    trainer = make_trainer((*get_default_callbacks(progress_bar=False), wsd), nan_from=12)
    # 10 updates per epoch: WSD files due at 9, 10, 19, 20, 38, 40; the NaN comes at update 12.
    trainer.train(
        make_regression_data(40),
        num_epochs=4,
        per_device_batch_size=4,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(num_checkpoints=3),
    )
    assert trainer.progress.global_step == 19
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_10_wsd_post_decay.pt",
        "checkpoint_10_wsd_post_decay.pt.crc32",
        "checkpoint_9_wsd_pre_decay",
    ]
    assert wsd.saved_checkpoints == [
        str(tmp_path / "checkpoint_9_wsd_pre_decay"),
        str(tmp_path / "checkpoint_10_wsd_post_decay.pt"),
    ]
    assert is_finite(safe_torch_load(tmp_path / "checkpoint_9_wsd_pre_decay" / "model.pt"))
    assert is_finite(safe_torch_load(tmp_path / "checkpoint_10_wsd_post_decay.pt")["model_state_dict"])
    out = capsys.readouterr().out
    assert (
        f"Not saving the training state {str(tmp_path / 'checkpoint_19_wsd_pre_decay')!r} at step 19" in out
    )


def test_save_checkpoint_outside_a_run_refuses_nan_weights_and_keeps_the_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    trainer = make_trainer((), nan_from=None)
    trainer.save_checkpoint(path)
    before = path.read_bytes()
    with torch.no_grad():
        trainer.model.bias.fill_(float("inf"))
    with pytest.raises(
        NonFiniteStateError,
        match=r"Not saving the checkpoint .*weights\.pt' at step 0: the weights hold NaN or infinity;",
    ):
        trainer.save_checkpoint(path)
    assert path.read_bytes() == before
    with pytest.raises(NonFiniteStateError, match="Not saving the training state"):
        trainer.save_training_state(tmp_path / "state")
    assert sorted(tmp_path.iterdir()) == [path, tmp_path / "weights.pt.crc32"]


# ---------------------------------------------------------------- TerminateOnNaNCallback


@pytest.mark.parametrize(("check_every", "expected_stop"), [(1, 2), (3, 3), (4, 4)])
def test_terminate_on_nan_checks_every_n_optimizer_updates_not_batches(
    check_every: int, expected_stop: int
) -> None:
    trainer = make_trainer((TerminateOnNaNCallback(check_every_n_steps=check_every),), nan_from=2)
    # 4 batches per update: counting batches would stop at other steps.
    trainer.train(
        make_regression_data(48), num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=4
    )
    assert trainer.progress.global_step == expected_stop


def test_terminate_on_nan_catches_a_nan_in_the_last_update_of_an_epoch_at_its_end() -> None:
    trainer = make_trainer((TerminateOnNaNCallback(check_every_n_steps=100),), nan_from=STEPS_PER_EPOCH)
    trainer.train(make_regression_data(2 * STEPS_PER_EPOCH), num_epochs=3, per_device_batch_size=2)
    assert trainer.progress.global_step == STEPS_PER_EPOCH
    assert math.isnan(trainer.run_history.get_latest_metric("train_loss_epoch"))


# ---------------------------------------------------------------- the flag itself


def test_non_finite_flag_sees_nan_and_inf_in_any_float_dtype_and_no_false_alarm_near_the_limits() -> None:
    near_fp16_limit = torch.full((3,), 60000.0, dtype=torch.float16)
    assert not bool(non_finite_flag([near_fp16_limit, near_fp16_limit.clone()]))  # their sum overflows fp16
    assert not bool(non_finite_flag([torch.tensor([1e300], dtype=torch.float64), near_fp16_limit]))
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        for bad in (float("nan"), float("inf"), -float("inf")):
            assert bool(non_finite_flag([torch.ones(2), torch.tensor([0.0, bad], dtype=dtype)])), (dtype, bad)
    assert non_finite_flag([torch.tensor([1, 2]), torch.empty(0)]) is None  # nothing floating to check
    assert state_is_finite({"w": torch.ones(2), "steps": torch.tensor(3)})
    assert not state_is_finite({"w": torch.tensor([1.0, float("nan")])})


class NaNAtStepTrainer(Trainer):
    def __init__(self, *args: Any, nan_at_step: int, **kwargs: Any) -> None:
        self.nan_at_step = nan_at_step
        super().__init__(*args, **kwargs)

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if self.progress.global_step == self.nan_at_step:
            output["loss"] = output["loss"] * float("nan")
        return output


def test_terminate_on_nan_remembers_a_nan_folded_away_before_a_distant_check() -> None:
    stops: list[int] = []

    class Stops(TrainerCallback):
        def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
            stops.append(trainer.progress.global_step)

    trainer = make_trainer(
        (TerminateOnNaNCallback(check_every_n_steps=80), Stops()),
        trainer_class=NaNAtStepTrainer,
        nan_at_step=3,
    )
    # 100 steps; the NaN of step 3 stays in the epoch's loss sum until the check at step 80.
    trainer.train(make_regression_data(200), num_epochs=1, per_device_batch_size=2)
    assert stops == [80]


@pytest.mark.parametrize(("check_every", "expected_stop_step"), [(1, 4), (4, 4), (3, 6)])
def test_terminate_on_nan_stops_cleanly_at_the_next_check(check_every: int, expected_stop_step: int) -> None:
    events: list[str] = []

    class Ends(TrainerCallback):
        def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
            events.append("stop")

        def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
            events.append("end")

    trainer = make_trainer(
        (TerminateOnNaNCallback(check_every_n_steps=check_every), Ends()),
        trainer_class=NaNAtStepTrainer,
        nan_at_step=3,
    )
    trainer.train(make_regression_data(40), num_epochs=1, per_device_batch_size=2)
    assert events == ["stop", "end"]
    assert trainer.progress.global_step == expected_stop_step
