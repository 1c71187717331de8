"""save_checkpoint / load_checkpoint: safe values, atomic files, safe loading."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from tests.helpers import make_linear_model, make_regression_data


def make_trainer(seed: int = 0) -> Trainer:
    model = make_linear_model(seed=seed)
    return Trainer(model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=0.1), callbacks=())


def test_checkpoint_round_trips_model_optimizer_scheduler_and_numpy_and_path_values(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.train(
        make_regression_data(8),
        num_epochs=1,
        per_device_batch_size=4,
        create_scheduler_fn=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    )
    path = tmp_path / "ckpt.pt"
    trainer.save_checkpoint(
        path,
        checkpoint_kwargs={
            "epoch": np.int64(3),
            "acc": np.float32(0.5),
            "where": tmp_path,
            "arr": np.arange(3),
            "nested": {"p": Path("a/b")},
        },
    )
    raw = torch.load(path, weights_only=True)
    assert set(raw) == {
        "model_state_dict",
        "optimizer_state_dict",
        "scheduler_state_dict",
        "epoch",
        "acc",
        "where",
        "arr",
        "nested",
    }

    other = make_trainer(seed=1)
    other.train(
        make_regression_data(8),
        1,
        per_device_batch_size=4,
        create_scheduler_fn=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1),
    )
    loaded = other.load_checkpoint(path)  # the whole dict, as 0.1.61 returned it
    assert set(loaded) - {"model_state_dict", "optimizer_state_dict", "scheduler_state_dict"} == {
        "epoch",
        "acc",
        "where",
        "arr",
        "nested",
    }
    extra = {key: loaded[key] for key in ("epoch", "acc", "where", "arr", "nested")}
    assert extra == {
        "epoch": 3,
        "acc": 0.5,
        "where": str(tmp_path),
        "arr": pytest.approx(torch.arange(3)),
        "nested": {"p": "a/b"},
    }
    assert torch.equal(other.get_model().weight, trainer.get_model().weight)
    assert (
        other.optimizer.state_dict()["state"][0]["step"] == trainer.optimizer.state_dict()["state"][0]["step"]
    )
    assert other.scheduler.state_dict() == trainer.scheduler.state_dict()


def test_checkpoint_without_optimizer_state_loads_the_weights_and_leaves_the_optimizer(
    tmp_path: Path,
) -> None:
    trainer = make_trainer()
    trainer.save_checkpoint(tmp_path / "w.pt", save_optimizer=False)
    other = make_trainer(seed=1)
    before = other.optimizer.state_dict()
    assert set(other.load_checkpoint(tmp_path / "w.pt")) == {"model_state_dict"}
    assert other.optimizer.state_dict() == before
    assert torch.equal(other.get_model().weight, trainer.get_model().weight)


def test_unsafe_checkpoint_value_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    class Custom:
        pass

    with pytest.raises(
        TypeError, match=r"checkpoint_kwargs\['bad'\] holds a .*Custom, which cannot be loaded back safely"
    ):
        make_trainer().save_checkpoint(tmp_path / "c.pt", checkpoint_kwargs={"bad": Custom()})
    assert list(tmp_path.iterdir()) == []


class RunsCode:
    def __reduce__(self) -> tuple:
        return (os.system, ("echo pwned > /dev/null",))


def test_file_that_would_run_code_when_unpickled_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    with open(path, "wb") as file:
        torch.save({"model_state_dict": {}, "payload": RunsCode()}, file)
    with pytest.raises(pickle.UnpicklingError, match=r"Refused to load .*weights_only=True"):
        make_trainer().load_checkpoint(path)


def test_checkpoint_of_another_model_says_it_does_not_fit(tmp_path: Path) -> None:
    trainer = make_trainer()
    trainer.save_checkpoint(tmp_path / "m.pt")
    model = nn.Linear(5, 2)
    other = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    with pytest.raises(RuntimeError, match=r"(?s)does not fit this model.*size mismatch"):
        other.load_checkpoint(tmp_path / "m.pt")


def test_missing_checkpoint_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"No checkpoint file at .*nothing.pt"):
        make_trainer().load_checkpoint(tmp_path / "nothing.pt")


def test_interrupted_save_keeps_the_previous_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = make_trainer()
    path = tmp_path / "ckpt.pt"
    trainer.save_checkpoint(path, checkpoint_kwargs={"version": 1})

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", fail)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(path, checkpoint_kwargs={"version": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]
    assert make_trainer().load_checkpoint(path)["version"] == 1
