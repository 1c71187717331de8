"""The checkpoint API of pytorch-accelerated 0.1.61 keeps working (docs/migration.md):
load_checkpoint, load_training_state / train(resume_from=), checkpoints of torch.compile'd
models, and training-state directories written by 0.1.61.

Each item is exercised in pytorch-accelerated 0.1.61's form: its return shapes, its override of
``load_training_state``, and its directory layout, written here with accelerate's real
``Accelerator.save_state`` plus ``trainer_metadata.pt``.
"""

from __future__ import annotations

import functools
import os
import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.schedulers.cosine_scheduler import CosineLrScheduler
from tests.helpers import make_linear_model, make_regression_data
from tests.helpers import make_trainer as make_any_trainer

DATA = make_regression_data(16)  # 4 batches of 4: 4 updates per epoch


make_trainer = functools.partial(make_any_trainer, seed=1, lr=0.1, momentum=0.9)


def cosine(optimizer: torch.optim.Optimizer) -> CosineLrScheduler:
    return CosineLrScheduler(optimizer, total_num_epochs=3, num_update_steps_per_epoch=4)


def trained(num_epochs: int = 1, scheduler: bool = True) -> Trainer:
    trainer = make_trainer(model=make_linear_model(seed=0))
    trainer.train(
        DATA,
        num_epochs=num_epochs,
        per_device_batch_size=4,
        create_scheduler_fn=cosine if scheduler else None,
    )
    return trainer


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    plain_a, plain_b = getattr(a, "_orig_mod", a), getattr(b, "_orig_mod", b)
    return all(
        torch.equal(x, y)
        for x, y in zip(plain_a.state_dict().values(), plain_b.state_dict().values(), strict=True)
    )


# ---------------------------------------------------------------------------- load_checkpoint


def test_load_checkpoint_returns_the_whole_dict_as_the_original(tmp_path: Path) -> None:
    source = trained()
    source.save_checkpoint(tmp_path / "c.pt", checkpoint_kwargs={"epoch": 1, "best": 0.5})
    loaded = make_trainer().load_checkpoint(tmp_path / "c.pt")
    assert set(loaded) == {
        "model_state_dict",
        "optimizer_state_dict",
        "scheduler_state_dict",
        "epoch",
        "best",
    }
    assert (loaded["epoch"], loaded["best"]) == (1, 0.5)
    assert torch.equal(loaded["model_state_dict"]["weight"], source.get_model().weight)


def test_load_checkpoint_skips_an_absent_optimizer_state(tmp_path: Path) -> None:
    trained().save_checkpoint(tmp_path / "w.pt", save_optimizer=False)
    trainer = make_trainer()
    before = trainer.optimizer.state_dict()
    loaded = trainer.load_checkpoint(tmp_path / "w.pt")  # the original's default load_optimizer=True
    assert "optimizer_state_dict" not in loaded and trainer.optimizer.state_dict() == before


def test_evaluation_only_trainer_loads_a_full_checkpoint_and_evaluates(tmp_path: Path) -> None:
    source = trained()
    source.save_checkpoint(tmp_path / "c.pt")
    evaluator = make_trainer(optimizer=None)  # the original crashed here
    evaluator.load_checkpoint(tmp_path / "c.pt")
    assert same_weights(evaluator.get_model(), source.get_model())
    assert evaluator.scheduler is None  # the file's scheduler state is skipped (changed from 0.1.61)
    evaluator.evaluate(DATA, per_device_batch_size=4)


def test_a_bad_optimizer_state_changes_nothing_and_says_why(tmp_path: Path) -> None:
    source = trained()
    state = {
        "model_state_dict": source.get_model().state_dict(),
        "optimizer_state_dict": {"state": {}, "param_groups": [{"params": [0]}]},
    }
    torch.save(state, tmp_path / "bad.pt")
    trainer = make_trainer()
    with pytest.raises(
        RuntimeError, match=r"does not fit this optimizer: it holds 1 parameter group\(s\) of \[1\]"
    ):
        trainer.load_checkpoint(tmp_path / "bad.pt")
    assert not same_weights(trainer.get_model(), source.get_model())


# ---------------------------------------------------------------------------- load_training_state


class SaveAtUpdate(TrainerCallback):
    def __init__(self, directory: Path, update: int) -> None:
        self.directory, self.update = directory, update

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if kwargs.get("is_update_step") and trainer.progress.global_step == self.update:
            trainer.save_training_state(self.directory, checkpoint_kwargs={"global_step": self.update})


def test_load_training_state_returns_the_1_based_epoch_it_was_saved_in(tmp_path: Path) -> None:
    trainer = make_trainer(model=make_linear_model(seed=0), callbacks=(SaveAtUpdate(tmp_path / "mid", 6),))
    trainer.train(DATA, num_epochs=2, per_device_batch_size=4)
    trainer.save_training_state(tmp_path / "end")
    assert make_trainer().load_training_state(tmp_path / "mid") == {"current_epoch": 2, "global_step": 6}
    assert make_trainer().load_training_state(tmp_path / "end") == {"current_epoch": 2}


class OverridingTrainer(Trainer):
    """The original's pattern: override load_training_state and call super()."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loaded: list[dict[str, Any]] = []

    def load_training_state(self, training_state_dir: Any) -> dict[str, Any]:
        result = super().load_training_state(training_state_dir)
        self.loaded.append(result)
        return result


def test_train_resume_from_calls_the_overridden_method_and_keeps_the_exact_position(tmp_path: Path) -> None:
    first = make_trainer(model=make_linear_model(seed=0), callbacks=(SaveAtUpdate(tmp_path / "mid", 6),))
    first.train(DATA, num_epochs=3, per_device_batch_size=4, create_scheduler_fn=cosine)
    model = make_linear_model(seed=1)
    resumed = OverridingTrainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), callbacks=()
    )
    resumed.train(
        DATA, num_epochs=3, per_device_batch_size=4, create_scheduler_fn=cosine, resume_from=tmp_path / "mid"
    )
    assert resumed.loaded == [{"current_epoch": 2, "global_step": 6}]
    assert resumed.progress.global_step == 12  # 6 restored + 6 more: not a re-run of epoch 2
    assert same_weights(resumed.get_model(), first.get_model())


# ---------------------------------------------------------------------------- torch.compile


def compiled_trainer(seed: int) -> Trainer:
    return make_trainer(model=torch.compile(make_linear_model(seed=seed), backend="eager"))


def test_checkpoint_of_a_compiled_model_loads_into_the_plain_model_and_back(tmp_path: Path) -> None:
    compiled = compiled_trainer(0)
    compiled.train(DATA, num_epochs=1, per_device_batch_size=4)
    compiled.save_checkpoint(tmp_path / "compiled.pt")
    saved = torch.load(tmp_path / "compiled.pt", weights_only=True)["model_state_dict"]
    assert sorted(saved) == ["bias", "weight"]  # the unwrapped model's keys, as the original saved
    plain = make_trainer()
    plain.load_checkpoint(tmp_path / "compiled.pt")
    assert same_weights(plain.get_model(), compiled.get_model())

    torch.save(
        {"model_state_dict": compiled.get_model().state_dict()}, tmp_path / "old.pt"
    )  # "_orig_mod." keys
    other = make_trainer()
    other.load_checkpoint(tmp_path / "old.pt")
    assert same_weights(other.get_model(), compiled.get_model())

    back = compiled_trainer(2)
    back.load_checkpoint(tmp_path / "compiled.pt")
    assert same_weights(back.get_model(), compiled.get_model())


def test_training_state_of_a_compiled_model_loads_into_the_plain_model_and_back(tmp_path: Path) -> None:
    compiled = compiled_trainer(0)
    compiled.train(DATA, num_epochs=1, per_device_batch_size=4)
    compiled.save_training_state(tmp_path / "state")
    assert sorted(torch.load(tmp_path / "state" / "model.pt", weights_only=True)) == ["bias", "weight"]
    plain = make_trainer()
    plain.load_training_state(tmp_path / "state")
    assert same_weights(plain.get_model(), compiled.get_model())
    plain.save_training_state(tmp_path / "plain")
    back = compiled_trainer(2)
    back.load_training_state(tmp_path / "plain")
    assert same_weights(back.get_model(), compiled.get_model())


# ---------------------------------------------------------------------------- original directories


class Stale:
    """A stale earlier copy of the scheduler state (the original re-registered at each save)."""

    def state_dict(self) -> dict[str, Any]:
        return {"num_updates": -1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def write_original_state(
    directory: Path, current_epoch: int, safe_serialization: bool = True
) -> dict[str, Any]:
    """A state as 0.1.61 writes it: accelerate's save_state + trainer_metadata.pt. Returns what
    was saved, and the RNG draws that come right after the save."""
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = make_linear_model(seed=7)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    scheduler = cosine(optimizer)
    for _ in range(5):
        scheduler.step()
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(Stale())
    accelerator.register_for_checkpointing(scheduler)
    accelerator.save_state(str(directory), safe_serialization=safe_serialization)
    torch.save({"current_epoch": current_epoch, "note": "kept"}, directory / "trainer_metadata.pt")
    draws = (torch.rand(3), np.random.rand(3), random.random())
    return {"model": model, "optimizer": optimizer.state_dict(), "draws": draws}


@pytest.mark.parametrize("safe_serialization", [True, False], ids=["model.safetensors", "pytorch_model.bin"])
def test_load_training_state_restores_an_original_directory(tmp_path: Path, safe_serialization: bool) -> None:
    saved = write_original_state(tmp_path / "epoch_2", 2, safe_serialization)
    assert {"optimizer.bin", "custom_checkpoint_0.pkl", "custom_checkpoint_1.pkl", "random_states_0.pkl"} <= {
        p.name for p in (tmp_path / "epoch_2").iterdir()
    }
    trainer = make_trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert trainer.load_training_state(tmp_path / "epoch_2") == {"current_epoch": 2, "note": "kept"}
    messages = [str(w.message) for w in caught]
    assert any("written by pytorch-accelerated 0.1.x" in m and "start of epoch 2" in m for m in messages), (
        messages
    )
    # 0.1.x recorded no requires_grad: the warning says it is not restored.
    assert any("nor which parameters require gradients" in m for m in messages), messages
    assert not any("RNGs are not restored" in m for m in messages), messages
    assert same_weights(trainer.get_model(), saved["model"])
    assert torch.equal(
        trainer.optimizer.state_dict()["state"][0]["momentum_buffer"],
        saved["optimizer"]["state"][0]["momentum_buffer"],
    )
    draws = (torch.rand(3), np.random.rand(3), random.random())  # the RNGs are back where they were saved
    assert (
        torch.equal(draws[0], saved["draws"][0])
        and np.array_equal(draws[1], saved["draws"][1])
        and draws[2] == saved["draws"][2]
    )


def test_resume_from_an_original_directory_starts_at_the_start_of_its_epoch(tmp_path: Path) -> None:
    write_original_state(tmp_path / "epoch_2", 2)
    trainer = make_trainer()
    with pytest.warns(
        UserWarning,
        match=r"continues at the start of epoch 2, after 4 updates; the scheduler's counter is set to 4",
    ):
        trainer.train(
            DATA,
            num_epochs=3,
            per_device_batch_size=4,
            create_scheduler_fn=cosine,
            resume_from=tmp_path / "epoch_2",
        )
    assert trainer.progress.global_step == 12 and trainer.scheduler.num_updates == 12
    assert trainer.run_history.current_epoch == trained(3).run_history.current_epoch


def test_resume_from_an_original_final_directory_has_nothing_left_to_train(
    tmp_path: Path, capsys: Any
) -> None:
    write_original_state(tmp_path / "final", 4)  # final/: num_epochs + 1
    trainer = make_trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train(DATA, num_epochs=3, per_device_batch_size=4, resume_from=tmp_path / "final")
    messages = " | ".join(str(w.message) for w in caught)
    assert "start of epoch 4, after 12 updates" in messages and "Nothing to train" not in messages
    assert capsys.readouterr().out == (
        f"Training stopped before it started: Nothing to train: the state resumed from {tmp_path / 'final'} "
        f"already completed 3 epochs (num_epochs=3). Pass a larger num_epochs to continue.\n"
    )
    assert trainer.progress.global_step == 12


def test_an_original_fsdp_sharded_directory_is_refused_clearly(tmp_path: Path) -> None:
    directory = tmp_path / "epoch_1"
    (directory / "pytorch_model_fsdp_0").mkdir(parents=True)
    torch.save({"current_epoch": 1}, directory / "trainer_metadata.pt")
    with pytest.raises(
        ValueError,
        match=r"sharded \(FSDP\) training state of pytorch-accelerated 0.1.x \(pytorch_model_fsdp_0\)",
    ):
        make_trainer().load_training_state(directory)


def test_a_folder_of_original_directories_asks_for_one_by_name(tmp_path: Path) -> None:
    write_original_state(tmp_path / "epoch_1", 1)
    with pytest.raises(
        ValueError,
        match=r"name one of the states written by pytorch-accelerated 0.1.x \(epoch_1\) explicitly",
    ):
        make_trainer().load_training_state(tmp_path)


class RestoresItself(Trainer):
    """0.1.61's other pattern: an override that restores what it wants itself, without super(),
    and returns the epoch to start at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.epochs_started: list[int] = []

    def load_training_state(self, training_state_dir: Any) -> dict[str, Any]:
        checkpoint = torch.load(Path(training_state_dir) / "weights.pt", weights_only=True)
        self.get_model().load_state_dict(checkpoint)
        return {"current_epoch": 3}

    def train_epoch_start(self) -> None:
        super().train_epoch_start()
        self.epochs_started.append(self.run_history.current_epoch)


def test_an_override_returning_current_epoch_without_super_starts_the_run_at_that_epoch(
    tmp_path: Path,
) -> None:
    source = trained(num_epochs=1, scheduler=False)
    (tmp_path / "mine").mkdir()
    torch.save(source.get_model().state_dict(), tmp_path / "mine" / "weights.pt")
    model = make_linear_model(seed=1)
    trainer = RestoresItself(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(DATA, num_epochs=4, per_device_batch_size=4, resume_from=tmp_path / "mine")
    assert trainer.epochs_started == [3, 4]  # epochs 3 and 4 of 4, as 0.1.61 started at epoch 3
    assert trainer.progress.epoch == 4 and trainer.progress.global_step == 8
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == 2


@pytest.mark.parametrize("given", [str, Path], ids=["str", "Path"])
def test_an_override_is_given_a_path_it_can_open_as_the_one_asked(tmp_path: Path, given: Any) -> None:
    seen: list[tuple[str, str, Path, Path]] = []

    class Records(RestoresItself):
        def load_training_state(self, training_state_dir: Any) -> dict[str, Any]:
            seen.append(
                (
                    os.fspath(training_state_dir),
                    str(training_state_dir),
                    Path(training_state_dir),
                    training_state_dir / "weights.pt",
                )
            )
            return super().load_training_state(training_state_dir)

    (tmp_path / "mine").mkdir()
    torch.save(
        trained(num_epochs=1, scheduler=False).get_model().state_dict(), tmp_path / "mine" / "weights.pt"
    )
    model = make_linear_model(seed=1)
    trainer = Records(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(DATA, num_epochs=4, per_device_batch_size=4, resume_from=given(tmp_path / "mine"))
    mine = tmp_path / "mine"
    assert seen == [(str(mine), str(mine), mine, mine / "weights.pt")]
    assert trainer.epochs_started == [3, 4]


def test_an_override_returning_a_current_epoch_past_num_epochs_trains_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = trained(num_epochs=1, scheduler=False)
    (tmp_path / "mine").mkdir()
    torch.save(source.get_model().state_dict(), tmp_path / "mine" / "weights.pt")
    model = make_linear_model(seed=1)
    trainer = RestoresItself(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(DATA, num_epochs=2, per_device_batch_size=4, resume_from=tmp_path / "mine")
    assert capsys.readouterr().out.startswith(
        f"Training stopped before it started: Nothing to train: the state resumed from {tmp_path / 'mine'} "
        f"already completed "
    )
    assert trainer.epochs_started == [] and same_weights(trainer.get_model(), source.get_model())
