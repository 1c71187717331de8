"""Where a run is, on real runs: the history's epoch follows ``progress``, ``run_identity`` and
``loop_state`` are each run's own, ``accelerator`` is read-only, and built-in callbacks write through
the public methods.
"""

from __future__ import annotations

import copy
import functools
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    EarlyStoppingCallback,
    ModelEmaCallback,
    SaveBestModelCallback,
    SaveTrainingStateCallback,
    TrainerCallback,
    WSDCheckpointCallback,
)
from pytorch_accelerated.checkpoints.resume import run_state_dict
from pytorch_accelerated.run_config import LoopState, RunIdentity
from pytorch_accelerated.schedulers import WSDLrScheduler
from pytorch_accelerated.tracking import InMemoryRunHistory, RunHistory
from tests.helpers import make_linear_model, make_regression_data
from tests.helpers import make_trainer as make_any_trainer

SAMPLES, BATCH = 16, 4  # 4 optimizer updates per epoch
TRAIN = make_regression_data(SAMPLES)
EVAL = make_regression_data(8, seed=1)


make_trainer = functools.partial(make_any_trainer, lr=0.05)


def train(trainer: Trainer, num_epochs: int, **kwargs: Any) -> Trainer:
    trainer.train(TRAIN, num_epochs=num_epochs, eval_dataset=EVAL, per_device_batch_size=BATCH, **kwargs)
    return trainer


class RecordEpochs(TrainerCallback):
    """Records (run_history.current_epoch, progress.epoch) at the run's start, at each epoch's
    start and at each epoch's end event, by event name."""

    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def _record(self, event: str, trainer: Trainer) -> None:
        self.seen[event].append((trainer.run_history.current_epoch, trainer.progress.epoch))

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._record("on_training_run_start", trainer)

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self._record("on_train_epoch_start", trainer)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._record("on_training_run_epoch_end", trainer)


def history_of(trainer: Trainer) -> dict[str, list[Any]]:
    history = trainer.run_history
    return {name: list(history.get_metric_values(name)) for name in sorted(history.get_metric_names())}


# ---------------------------------------------------------------------------- history epoch


def test_history_epoch_is_progress_epoch_plus_one_at_each_epoch_start_and_4_after_3_epochs() -> None:
    recorder = RecordEpochs()
    trainer = train(make_trainer((recorder,)), num_epochs=3)
    assert recorder.seen["on_train_epoch_start"] == [(1, 0), (2, 1), (3, 2)]
    assert trainer.run_history.current_epoch == 4
    assert trainer.progress.epoch == 3


def test_kept_history_continues_its_epoch_while_progress_restarts_at_0() -> None:
    recorder = RecordEpochs()
    trainer = train(make_trainer((recorder,)), num_epochs=3)
    recorder.seen.clear()
    train(trainer, num_epochs=3, reset_run_history=False)
    assert recorder.seen["on_train_epoch_start"] == [(4, 0), (5, 1), (6, 2)]
    assert trainer.run_history.current_epoch == 7
    assert trainer.progress.epoch == 3
    assert trainer.run_identity.history_first_epoch == 4
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 6


def test_a_new_train_with_the_default_reset_starts_the_history_again_at_epoch_1() -> None:
    recorder = RecordEpochs()
    trainer = train(make_trainer((recorder,)), num_epochs=3)
    recorder.seen.clear()
    train(trainer, num_epochs=2)
    assert recorder.seen["on_train_epoch_start"] == [(1, 0), (2, 1)]
    assert trainer.run_history.current_epoch == 3
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


class RecordFlatMetric(TrainerCallback):
    """Records the same value of ``flat_metric`` at each epoch end: it never improves."""

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.run_history.update_metric("flat_metric", 1.0)


def test_after_an_early_stop_at_an_epoch_end_the_history_epoch_moves_on_as_after_a_normal_end() -> None:
    stopper = EarlyStoppingCallback(early_stopping_patience=1, watch_metric="flat_metric")
    recorder = RecordEpochs()
    trainer = train(make_trainer((RecordFlatMetric(), stopper, recorder)), num_epochs=4)
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2  # stopped after epoch 2
    trainer.callback_handler.remove_callback(stopper)
    recorder.seen.clear()
    train(trainer, num_epochs=1, reset_run_history=False)
    # Epochs 1 and 2 of the history are done: the next run's first epoch is history epoch 3.
    assert recorder.seen["on_train_epoch_start"] == [(3, 0)]
    assert trainer.run_history.current_epoch == 4


def test_after_an_early_stop_at_an_epoch_end_progress_and_run_state_are_those_of_a_finished_epoch() -> None:
    stopper = EarlyStoppingCallback(early_stopping_patience=1, watch_metric="flat_metric")
    trainer = train(make_trainer((RecordFlatMetric(), stopper)), num_epochs=4)
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2
    assert (trainer.run_history.current_epoch, trainer.progress.epoch) == (3, 2)
    assert trainer.loop_state.epoch_finished is False


class ForwardOnlyHistory(RunHistory):
    """A history that implements only the abstract methods: it can only move forward."""

    def __init__(self) -> None:
        self.values: dict[str, list[Any]] = {}
        self.epoch = 1
        self.prefix = ""
        self.increments = 0

    def get_metric_names(self) -> set[str]:
        return set(self.values)

    def get_metric_values(self, metric_name: str) -> list[Any]:
        return self.values.get(metric_name, [])

    def get_latest_metric(self, metric_name: str) -> Any:
        return self.values[metric_name][-1]

    def update_metric(self, metric_name: str, metric_value: Any) -> None:
        self.values.setdefault(f"{self.prefix}{metric_name}", []).append(metric_value)

    def delete_metric(self, metric_name: str) -> None:
        self.values.pop(metric_name, None)

    def set_metric_name_prefix(self, prefix: str = "") -> None:
        self.prefix = prefix

    @property
    def metric_name_prefix(self) -> str:
        return self.prefix

    @property
    def current_epoch(self) -> int:
        return self.epoch

    def _increment_epoch(self) -> None:
        self.epoch += 1
        self.increments += 1

    def reset(self) -> None:
        self.values, self.epoch, self.prefix = {}, 1, ""


def test_a_history_with_only_the_abstract_methods_follows_the_run_through_the_default_set_current_epoch() -> (
    None
):
    history = ForwardOnlyHistory()
    recorder = RecordEpochs()
    trainer = train(make_trainer((recorder,), run_history=history), num_epochs=2)
    assert trainer.run_history is history
    assert recorder.seen["on_train_epoch_start"] == [(1, 0), (2, 1)]
    assert history.current_epoch == 3
    assert history.increments == 2  # moved forward one epoch at a time
    assert len(history.get_metric_values("train_loss_epoch")) == 2
    assert len(history.get_metric_values("eval_loss_epoch")) == 2


def test_the_default_set_current_epoch_refuses_to_move_back_with_a_clear_message() -> None:
    history = ForwardOnlyHistory()
    history.set_current_epoch(3)
    history.set_current_epoch(3)  # staying is fine
    assert history.current_epoch == 3
    with pytest.raises(
        ValueError,
        match=r"^ForwardOnlyHistory is at epoch 3 and cannot move back to epoch 1; override set_current_epoch to allow it\.$",
    ):
        history.set_current_epoch(1)
    assert history.current_epoch == 3


def test_in_memory_history_can_move_its_epoch_back() -> None:
    history = InMemoryRunHistory()
    history.set_current_epoch(5)
    history.set_current_epoch(2)
    assert history.current_epoch == 2


# ---------------------------------------------------------------------------- resume


class SaveStateAfterEpoch(TrainerCallback):
    """Saves the training state from ``on_training_run_epoch_end`` of epoch ``epoch`` (from 1)."""

    def __init__(self, directory: Path, epoch: int) -> None:
        self.directory, self.epoch = directory, epoch

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if trainer.progress.epoch + 1 == self.epoch:
            trainer.save_training_state(self.directory)


def test_a_run_resumed_after_epoch_2_keeps_history_and_progress_in_step_and_ends_with_the_full_history(
    tmp_path: Path,
) -> None:
    state = tmp_path / "after-epoch-2"
    uninterrupted = train(make_trainer((SaveStateAfterEpoch(state, epoch=2),)), num_epochs=3)
    assert state.is_dir()

    recorder = RecordEpochs()
    resumed = train(make_trainer((recorder,)), num_epochs=3, resume_from=state)

    assert recorder.seen["on_training_run_start"] == [(3, 2)]
    assert recorder.seen["on_train_epoch_start"] == [(3, 2)]
    assert recorder.seen["on_training_run_epoch_end"] == [(3, 2)]
    assert resumed.progress.epoch == uninterrupted.progress.epoch == 3
    assert resumed.run_history.current_epoch == uninterrupted.run_history.current_epoch == 4
    assert history_of(resumed) == history_of(uninterrupted)
    assert len(history_of(resumed)["train_loss_epoch"]) == 3


def test_a_history_with_only_the_abstract_methods_resumes_to_the_full_history(tmp_path: Path) -> None:
    state = tmp_path / "after-epoch-1"
    uninterrupted = train(
        make_trainer((SaveStateAfterEpoch(state, epoch=1),), run_history=ForwardOnlyHistory()), 3
    )
    recorder = RecordEpochs()
    resumed = train(
        make_trainer((recorder,), run_history=ForwardOnlyHistory()), num_epochs=3, resume_from=state
    )
    assert recorder.seen["on_train_epoch_start"] == [(2, 1), (3, 2)]
    assert resumed.run_history.current_epoch == uninterrupted.run_history.current_epoch == 3 + 1
    assert history_of(resumed) == history_of(uninterrupted)


# ---------------------------------------------------------------------------- accelerator, the run's state


def test_accelerator_is_the_trainers_own_and_read_only() -> None:
    own = Accelerator()

    class OwnAccelerator(Trainer):
        def _create_accelerator(self) -> Accelerator:
            return own

    trainer = train(make_trainer(trainer_class=OwnAccelerator), num_epochs=1)
    assert isinstance(trainer.accelerator, Accelerator)
    assert trainer.accelerator is own
    assert trainer.device == own.device
    with pytest.raises(AttributeError):
        trainer.accelerator = Accelerator()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del trainer.accelerator  # type: ignore[misc]
    assert trainer.accelerator is own
    assert make_trainer().accelerator is not own  # each Trainer creates its own by default


class RecordRunState(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[tuple[str, tuple[RunIdentity, LoopState], Any]] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen.append(("on_training_run_start", run_state_of(trainer), trainer.resumed_from))

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.seen.append(("on_train_epoch_start", run_state_of(trainer), trainer.resumed_from))


def run_state_of(trainer: Trainer) -> tuple[RunIdentity, LoopState]:
    return trainer.run_identity, trainer.loop_state


def test_each_train_gets_a_fresh_run_identity_and_loop_state() -> None:
    recorder = RecordRunState()
    trainer = make_trainer((recorder,))
    before = run_state_of(trainer)
    assert isinstance(before[0], RunIdentity) and isinstance(before[1], LoopState)
    train(trainer, num_epochs=1)
    first = run_state_of(trainer)
    assert first[1].epoch_finished is False
    train(trainer, num_epochs=1)
    second = run_state_of(trainer)
    assert len({id(state) for states in (before, first, second) for state in states}) == 6
    assert second[1].epoch_finished is False
    assert second[0].run_id != first[0].run_id  # reset_run_history=True: a new run
    # One object of each for the whole of each run.
    assert [states for _, states, _ in recorder.seen] == [first, first, second, second]
    assert all(a is b for a, b in zip(recorder.seen[0][1], first, strict=True))


class Stateful(TrainerCallback):
    """Records its events, and when its state is loaded."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.order.append("on_training_run_start")

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.order.append("on_train_epoch_start")

    def state_dict(self) -> dict[str, Any]:
        return {"saved": True}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.append("load_state_dict")


def test_a_resumed_run_names_its_state_and_restores_callback_states_once_its_start_events_fired(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    saved = train(make_trainer((SaveStateAfterEpoch(state, epoch=1), Stateful())), num_epochs=2)
    assert saved.resumed_from is None
    recorder, stateful = RecordRunState(), Stateful()
    resumed = train(make_trainer((recorder, stateful)), num_epochs=2, resume_from=tmp_path)  # its newest
    assert stateful.order == ["on_training_run_start", "load_state_dict", "on_train_epoch_start"]
    assert [(event, found) for event, _, found in recorder.seen] == [
        ("on_training_run_start", state),
        ("on_train_epoch_start", state),
    ]
    assert resumed.resumed_from == state and resumed.loop_state.epoch_finished is False
    train(resumed, num_epochs=1)  # a new run
    assert resumed.resumed_from is None


def test_a_state_records_the_weighting_unit_the_shuffle_seed_and_the_first_history_epoch() -> None:
    trainer = train(make_trainer(), num_epochs=1)
    saved = run_state_dict(trainer._training_objects())
    assert set(saved) == {
        "loss_weight_unit",
        "shuffle_seed",
        "history_first_epoch",
        "epoch_trained",
        "train_samples",
        "samples_skipped",
        "run_id",
        "stage",
        "steps_before",
    }
    assert saved["epoch_trained"] is False  # the run ended: nothing of an epoch is done
    assert saved["history_first_epoch"] == 1
    assert saved["shuffle_seed"] == 42  # train()'s default seed
    assert saved["train_samples"] == len(trainer.train_dataset)
    assert saved["samples_skipped"] == 0  # only an epoch resumed on other settings skips samples
    assert saved["run_id"] == trainer.run_identity.run_id and saved["steps_before"] == 0
    fresh = make_trainer()
    assert run_state_dict(fresh._training_objects()) == {
        "run_id": fresh.run_identity.run_id,
        "stage": 1,
        "steps_before": 0,
        "loss_weight_unit": None,
        "shuffle_seed": None,
        "history_first_epoch": 1,
        "epoch_trained": False,
        "train_samples": None,
        "samples_skipped": 0,
    }


# ---------------------------------------------------------------------------- writes go through the Trainer


class RecordingSaves(Trainer):
    """Records every file written through ``save_checkpoint`` and every ``save_training_state``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.checkpoints: list[tuple[Path, nn.Module | None, dict[str, torch.Tensor] | None]] = []
        self.training_states: list[Path] = []
        super().__init__(*args, **kwargs)

    def save_checkpoint(
        self,
        save_path: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        save_per_node: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> None:
        weights = copy.deepcopy(model.state_dict()) if model is not None else None
        self.checkpoints.append((Path(save_path).resolve(), model, weights))
        super().save_checkpoint(
            save_path, checkpoint_kwargs, save_optimizer, save_scheduler, save_per_node, model=model
        )

    def save_training_state(
        self, output_dir: str | os.PathLike, checkpoint_kwargs: dict[str, Any] | None = None
    ) -> None:
        self.training_states.append(Path(output_dir).resolve())
        super().save_training_state(output_dir, checkpoint_kwargs)


def test_built_in_callbacks_write_weights_only_through_the_public_save_checkpoint(tmp_path: Path) -> None:
    ema = ModelEmaCallback(save_path=tmp_path / "ema.pt")
    best = SaveBestModelCallback(tmp_path / "best.pt")
    wsd = WSDCheckpointCallback(save_dir=tmp_path / "wsd")
    states = SaveTrainingStateCallback(tmp_path / "states", save_every_n_epochs=1, handle_signals=())
    trainer = make_trainer((ema, best, wsd, states), trainer_class=RecordingSaves)
    assert isinstance(trainer, RecordingSaves)
    scheduler_fn = WSDLrScheduler.create_scheduler_fn(num_checkpoints=1)
    train(trainer, num_epochs=3, create_scheduler_fn=scheduler_fn)

    written = {path for path, _, _ in trainer.checkpoints}
    pre_decay = (tmp_path / "wsd/checkpoint_11_wsd_pre_decay").resolve()  # a training state
    weight_files = {  # without the checksums that save_checkpoint writes beside its files
        path.resolve()
        for path in tmp_path.rglob("*")
        if path.is_file()
        and path.suffix != ".crc32"
        and "states" not in path.parts
        and pre_decay not in path.resolve().parents
    }
    state_files = {path.resolve() for path in (tmp_path / "states").rglob("*") if path.is_file()}
    state_files |= {path.resolve() for path in pre_decay.rglob("*") if path.is_file()}
    assert {tmp_path / "ema.pt", tmp_path / "best.pt"} <= weight_files
    assert {tmp_path / "wsd/checkpoint_12_wsd_post_decay.pt"} == {
        path for path in weight_files if path.parent.name == "wsd"
    }
    assert pre_decay in trainer.training_states
    assert weight_files <= written, f"written without save_checkpoint: {sorted(weight_files - written)}"
    assert state_files and all(
        any(state_dir in path.parents for state_dir in trainer.training_states) for path in state_files
    )

    models = defaultdict(set)
    for path, model, _ in trainer.checkpoints:
        models[path.name].add(id(model) if model is not None else None)
    assert ema.ema_model is not None
    assert models["ema.pt"] == {id(ema.ema_model.module)}  # the EMA weights, in the same layout
    assert models["best.pt"] == {None}
    assert models["checkpoint_12_wsd_post_decay.pt"] == {None}

    # The EMA file holds the EMA weights of its last save, and loads back into an EMA module.
    last_ema_weights = [weights for path, _, weights in trainer.checkpoints if path.name == "ema.pt"][-1]
    assert last_ema_weights is not None
    for target in (make_linear_model(seed=1), ema.ema_model.module):
        with torch.no_grad():
            for parameter in target.parameters():
                parameter.fill_(7.0)
        trainer.load_checkpoint(tmp_path / "ema.pt", load_optimizer=False, load_scheduler=False, model=target)
        loaded = target.state_dict()
        assert loaded.keys() == last_ema_weights.keys()
        for name, value in last_ema_weights.items():
            assert torch.equal(loaded[name].cpu(), value.cpu()), name
