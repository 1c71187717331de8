"""Which parameters require gradients is part of a training state: recorded, restored, announced.

A real kill and resume of a gradual unfreezing run: tests/integration/test_state_edges.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.state_checks import UnusableStateError
from pytorch_accelerated.finetuning import ModelFreezer
from tests.helpers import make_regression_data, make_trainer, reseal_state


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))


def trainer_with(*callbacks: Any) -> Any:
    return make_trainer(callbacks, model=make_model(), optimizer_class=torch.optim.AdamW)


def requires_grad_of(trainer: Any) -> dict[str, bool]:
    return {name: param.requires_grad for name, param in trainer.get_model().named_parameters()}


def train(trainer: Any, **kwargs: Any) -> None:
    trainer.train(make_regression_data(16), num_epochs=2, per_device_batch_size=4, **kwargs)


def saved_with_backbone_frozen(folder: Path) -> Path:
    """A state saved after 1 epoch of a run whose first layer is frozen: ``folder / "epoch_1"``."""
    trainer = trainer_with(SaveTrainingStateCallback(folder, save_every_n_epochs=1))
    ModelFreezer(trainer.model).freeze()
    train(trainer)
    return folder / "epoch_1"


def requires_grad_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "requires_grad" in str(w.message)]


def test_a_state_records_the_names_of_the_frozen_parameters(tmp_path: Path) -> None:
    state = saved_with_backbone_frozen(tmp_path / "states")
    saved = torch.load(state / "trainer_state.pt", weights_only=True)
    assert saved["frozen_parameters"] == ["0.weight", "0.bias"]


def test_a_state_saved_in_the_background_records_them_as_they_were_when_it_was_copied(tmp_path: Path) -> None:
    trainer = trainer_with()
    ModelFreezer(trainer.model).freeze()
    train(trainer)
    trainer.save_training_state(tmp_path / "state", asynchronous=True)
    trainer.get_model().requires_grad_(True)  # changed while the state is written: not what it holds
    trainer.wait_for_training_state()
    saved = torch.load(tmp_path / "state" / "trainer_state.pt", weights_only=True)
    assert saved["frozen_parameters"] == ["0.weight", "0.bias"]


def test_loading_a_state_by_hand_sets_requires_grad_as_saved_without_a_warning(tmp_path: Path) -> None:
    state = saved_with_backbone_frozen(tmp_path / "states")
    trainer = trainer_with()  # everything trainable
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.load_training_state(state)
    assert requires_grad_of(trainer) == {"0.weight": False, "0.bias": False, "2.weight": True, "2.bias": True}
    assert requires_grad_warnings(caught) == []


class FreezeAllButTheHeadAtStart(TrainerCallback):
    """Sets up a new run: a freezer created when the run starts (which makes everything trainable),
    then every group but the head frozen."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        ModelFreezer(trainer.model).freeze()


def test_a_resume_sets_requires_grad_as_saved_after_the_callbacks_set_up_the_run_and_names_what_changed(
    tmp_path: Path,
) -> None:
    saved = trainer_with(SaveTrainingStateCallback(tmp_path / "states", save_every_n_epochs=1))
    train(saved)  # everything trainable
    resumed = trainer_with(FreezeAllButTheHeadAtStart())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(resumed, resume_from=tmp_path / "states" / "epoch_1")
    assert all(requires_grad_of(resumed).values())
    [message] = requires_grad_warnings(caught)
    assert message.startswith(
        f"Resuming {tmp_path / 'states' / 'epoch_1'}: requires_grad restored as saved for 2 parameter(s): "
        f"trainable, as when it was saved (this run had frozen them): 0.weight, 0.bias. A resumed run trains "
        f"the parameters its state trained"
    )
    assert "set requires_grad once the run has resumed, e.g. in a callback's on_train_epoch_start" in message


def test_a_resume_that_finds_requires_grad_as_saved_says_nothing_of_it(tmp_path: Path) -> None:
    state = saved_with_backbone_frozen(tmp_path / "states")
    resumed = trainer_with()
    ModelFreezer(resumed.model).freeze()  # as the script that saved it did
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(resumed, resume_from=state)
    assert requires_grad_warnings(caught) == []
    assert requires_grad_of(resumed)["0.weight"] is False


def rewrite_trainer_state(state: Path, change: Any) -> None:
    saved = torch.load(state / "trainer_state.pt", weights_only=True)
    change(saved)
    torch.save(saved, state / "trainer_state.pt")
    reseal_state(state)


def test_a_state_without_the_record_leaves_requires_grad_as_it_is(tmp_path: Path) -> None:
    state = saved_with_backbone_frozen(tmp_path / "states")
    rewrite_trainer_state(state, lambda saved: saved.pop("frozen_parameters"))  # as earlier versions wrote
    trainer = trainer_with()
    trainer.load_training_state(state)
    assert all(requires_grad_of(trainer).values())


def test_a_record_that_is_not_a_list_of_names_is_refused_naming_the_file_and_nothing_is_loaded(
    tmp_path: Path,
) -> None:
    state = saved_with_backbone_frozen(tmp_path / "states")
    rewrite_trainer_state(state, lambda saved: saved.update(frozen_parameters={"0.weight": False}))
    trainer = trainer_with()
    before = {name: value.clone() for name, value in trainer.get_model().state_dict().items()}
    with pytest.raises(UnusableStateError) as raised:
        trainer.load_training_state(state)
    assert str(raised.value) == (
        f"{state / 'trainer_state.pt'} records frozen_parameters as dict, not a list of parameter names: it was "
        f"not written by this library, or was changed."
    )
    assert all(torch.equal(value, before[name]) for name, value in trainer.get_model().state_dict().items())
    assert all(requires_grad_of(trainer).values())
