"""WSDCheckpointCallback: checkpoints at decay starts, the initial checkpoint, state round trips, resume."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, StopTrainingError, TrainerCallback
from pytorch_accelerated.callbacks.wsd_checkpoints import WSDCheckpointCallback
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from pytorch_accelerated.schedulers import WSDLrScheduler
from tests.helpers import RecordUpdates, assert_close_weights, make_regression_data, weights
from tests.helpers import make_trainer as make_any_trainer

make_trainer = functools.partial(make_any_trainer, lr=0.05)


# ---------------------------------------------------------------- WSDCheckpointCallback

WSD_FN = WSDLrScheduler.create_scheduler_fn(num_checkpoints=3)


def run_wsd(save_dir: Path) -> tuple[Trainer, WSDCheckpointCallback, RecordUpdates]:
    callback, recorder = WSDCheckpointCallback(save_dir=save_dir), RecordUpdates()
    trainer = make_trainer((callback, recorder), momentum=0.9)
    # 10 updates per epoch, 40 in all: checkpoints at [10, 20, 40], decays of int(0.1 * period) (at
    # least 1) updates from [9, 19, 38].
    trainer.train(make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    return trainer, callback, recorder


def test_wsd_checkpoints_are_saved_exactly_at_decay_starts_and_checkpoint_steps(tmp_path: Path) -> None:
    trainer, callback, recorder = run_wsd(tmp_path / "ckpt")
    assert trainer.scheduler.get_decay_start_steps() == [9, 19, 38]
    assert trainer.scheduler.get_checkpoint_steps() == [10, 20, 40]
    assert callback.checkpoint_steps == {10, 20, 40} and callback.decay_fraction == 0.1
    assert [info["pre_decay_step"] for info in callback.decay_info] == [9, 19, 38]
    assert callback.last_checkpoint_step == 40
    names = [
        "checkpoint_9_wsd_pre_decay",
        "checkpoint_10_wsd_post_decay.pt",
        "checkpoint_19_wsd_pre_decay",
        "checkpoint_20_wsd_post_decay.pt",
        "checkpoint_38_wsd_pre_decay",
        "checkpoint_40_wsd_post_decay.pt",
    ]
    checksums = [f"{name}.crc32" for name in names if name.endswith(".pt")]  # beside each file
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(names + checksums)
    assert callback.saved_checkpoints == [str(tmp_path / "ckpt" / name) for name in names]
    for name in names:
        step = int(name.split("_")[1])
        if name.endswith(".pt"):  # post-decay: a checkpoint file
            saved = safe_torch_load(tmp_path / "ckpt" / name)
            assert saved["scheduler_state_dict"]["_num_updates"] == step
            weights_saved = saved["model_state_dict"]
        else:  # pre-decay: a training state directory
            saved = make_trainer(()).load_training_state(tmp_path / "ckpt" / name)
            weights_saved = safe_torch_load(tmp_path / "ckpt" / name / "model.pt")
        kind = "wsd_post_decay" if name.endswith(".pt") else "wsd_pre_decay"
        assert (saved["checkpoint_type"], saved["step"], saved["global_step"]) == (kind, step, step)
        assert (saved["total_steps"], saved["decay_fraction"]) == (40, 0.1)
        assert saved["epoch"] == (step - 1) // 10 + 1
        assert_close_weights(weights_saved, recorder.model_weights[step - 1])


@pytest.mark.parametrize(
    ("scheduler_fn", "found"),
    [
        (None, "this run has no scheduler (None)"),
        (lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 2), "this run has a StepLR"),
    ],
)
def test_wsd_callback_without_a_wsd_scheduler_says_how_to_create_one(
    tmp_path: Path, scheduler_fn: Any, found: str
) -> None:
    trainer = make_trainer((WSDCheckpointCallback(save_dir=tmp_path),))
    with pytest.raises(ValueError) as error:
        trainer.train(make_regression_data(8), num_epochs=1, create_scheduler_fn=scheduler_fn)
    assert (
        "WSDCheckpointCallback needs a scheduler with get_checkpoint_steps(), such as WSDLrScheduler"
        in str(error.value)
    )
    assert found in str(error.value)
    assert "create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(" in str(error.value)


class CaptureStart(TrainerCallback):
    def __init__(self, stop: bool) -> None:
        self.stop, self.weights, self.num_updates, self.lr, self.momentum = stop, {}, None, None, None
        self.position: dict[str, int] = {}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.position = trainer.progress.state_dict()
        self.weights, self.num_updates = weights(trainer.get_model()), trainer.scheduler.num_updates
        self.lr = trainer.optimizer.param_groups[0]["lr"]
        self.momentum = trainer.optimizer.state[next(trainer.get_model().parameters())].get("momentum_buffer")
        if self.stop:
            raise StopTrainingError("captured")


@pytest.mark.parametrize("is_continuation", [False, True])
def test_initial_checkpoint_loads_model_and_optimizer_and_the_schedule_unless_a_continuation(
    tmp_path: Path, is_continuation: bool
) -> None:
    run_wsd(tmp_path / "first")
    pre_decay = tmp_path / "first" / "checkpoint_19_wsd_pre_decay"  # a training state directory
    saved = {
        "model_state_dict": safe_torch_load(pre_decay / "model.pt"),
        "optimizer_state_dict": safe_torch_load(pre_decay / "optimizer.pt"),
    }
    capture = CaptureStart(stop=True)
    trainer = make_trainer(
        (WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=pre_decay), capture),
        seed=7,
        momentum=0.9,
    )
    scheduler_fn = WSDLrScheduler.create_scheduler_fn(
        num_checkpoints=3, is_continuation_from_checkpoint=is_continuation
    )
    trainer.train(
        make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=scheduler_fn
    )
    assert_close_weights(capture.weights, saved["model_state_dict"])
    torch.testing.assert_close(capture.momentum, saved["optimizer_state_dict"]["state"][0]["momentum_buffer"])
    assert capture.num_updates == (0 if is_continuation else 19)
    assert capture.lr == pytest.approx(0.05)  # the peak: the stable branch, not the saved optimizer's value
    assert capture.position == {
        "epoch": 0,
        "global_step": 0,
        "batch_index": 0,
        "epoch_step": 0,
    }  # a fresh run


def test_initial_checkpoint_file_loads_a_post_decay_checkpoint_and_its_step(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    post_decay = tmp_path / "first" / "checkpoint_20_wsd_post_decay.pt"
    capture = CaptureStart(stop=True)
    callback = WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=post_decay)
    trainer = make_trainer((callback, capture), seed=7, momentum=0.9)
    trainer.train(make_regression_data(40), num_epochs=4, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    assert_close_weights(capture.weights, safe_torch_load(post_decay)["model_state_dict"])
    assert callback.last_checkpoint_step == 20 and capture.num_updates == 20


def test_a_run_from_a_pre_decay_checkpoint_saves_the_following_checkpoints(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    callback = WSDCheckpointCallback(
        tmp_path / "second", initial_checkpoint=tmp_path / "first" / "checkpoint_19_wsd_pre_decay"
    )
    trainer = make_trainer((callback,), seed=7, momentum=0.9)
    trainer.train(make_regression_data(40), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    # The schedule goes on from update 19: its checkpoint at 20 is this run's update 1. The run
    # ends at step 29, before the last decay (from 38): no final post-decay file is written.
    assert [Path(p).name for p in callback.saved_checkpoints] == ["checkpoint_20_wsd_post_decay.pt"]
    saved = safe_torch_load(tmp_path / "second" / "checkpoint_20_wsd_post_decay.pt")
    assert (saved["step"], saved["global_step"], saved["checkpoint_type"]) == (20, 1, "wsd_post_decay")


def test_wsd_state_dict_round_trips_and_a_restored_state_skips_the_initial_checkpoint(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    callback = WSDCheckpointCallback(
        tmp_path / "second", initial_checkpoint=tmp_path / "first" / "checkpoint_9_wsd_pre_decay"
    )
    state = {"saved_checkpoints": ["a.pt"], "initial_checkpoint_loaded": True, "last_checkpoint_step": 9}
    callback.load_state_dict(state)
    assert callback.state_dict() == state
    capture = CaptureStart(stop=True)
    trainer = make_trainer((callback, capture), seed=7, momentum=0.9)
    before = weights(trainer.model)
    trainer.train(make_regression_data(40), num_epochs=1, per_device_batch_size=4, create_scheduler_fn=WSD_FN)
    assert_close_weights(capture.weights, before)
    assert capture.momentum is None  # the optimizer state was not loaded either
    assert callback.state_dict() == {
        "saved_checkpoints": ["a.pt"],
        "initial_checkpoint_loaded": False,
        "last_checkpoint_step": 9,
    }


def test_a_resumed_run_is_not_restarted_from_the_initial_checkpoint(tmp_path: Path) -> None:
    run_wsd(tmp_path / "first")
    initial = tmp_path / "first" / "checkpoint_9_wsd_pre_decay"

    def run(**kwargs: Any) -> Trainer:
        saver = SaveTrainingStateCallback(
            tmp_path / "states", save_every_n_epochs=1, save_at_end=False, handle_signals=()
        )
        trainer = make_trainer(
            (WSDCheckpointCallback(tmp_path / "second", initial_checkpoint=initial), saver), momentum=0.9
        )
        trainer.train(
            make_regression_data(40),
            num_epochs=2,
            per_device_batch_size=4,
            create_scheduler_fn=WSD_FN,
            **kwargs,
        )
        return trainer

    uninterrupted = weights(run().get_model())
    resumed = run(resume_from=tmp_path / "states" / "epoch_1")
    assert_close_weights(weights(resumed.get_model()), uninterrupted)
