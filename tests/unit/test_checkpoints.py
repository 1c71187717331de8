"""save_checkpoint / load_checkpoint: safe values, atomic files, safe loading; bad files (empty, truncated,
not written by torch.save, unsafe pickles) get clear errors and change nothing.

Real save faults (file-size limits, signals) and damaged training states: tests/integration/test_checkpoint_faults.py."""

from __future__ import annotations

import functools
import io
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.checkpoints.torch_files import CheckpointFileError, safe_torch_load
from tests.helpers import (
    assert_equal_nested,
    make_regression_data,
    snapshot,
)
from tests.helpers import make_trainer as make_any_trainer

make_trainer = functools.partial(make_any_trainer, optimizer_class=torch.optim.Adam, lr=0.1)


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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "ckpt.pt.crc32"]
    assert make_trainer().load_checkpoint(path)["version"] == 1


def torch_bytes() -> bytes:
    buffer = io.BytesIO()
    torch.save({"weight": torch.randn(64, 64), "step": 3}, buffer)
    return buffer.getvalue()


def npy_bytes() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(5))
    return buffer.getvalue()


def zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    return buffer.getvalue()


BAD_FILES = [
    pytest.param(lambda: b"", "is empty (0 bytes)", id="empty"),
    pytest.param(
        lambda: torch_bytes()[: len(torch_bytes()) // 2],
        "is truncated or corrupt (not a complete torch checkpoint)",
        id="truncated-half",
    ),
    pytest.param(
        lambda: torch_bytes()[:-30],
        "is truncated or corrupt (not a complete torch checkpoint)",
        id="truncated-end",
    ),
    pytest.param(
        lambda: torch_bytes()[:10],
        "is truncated or corrupt (not a complete torch checkpoint)",
        id="truncated-head",
    ),
    pytest.param(
        lambda: bytes(np.random.default_rng(0).integers(0, 256, 1000, dtype=np.uint8)),
        "is not a file written by torch.save",
        id="random-bytes",
    ),
    pytest.param(
        lambda: b"step,loss\n1,0.5\n", "is not a file written by torch.save (it is a text file)", id="text"
    ),
    pytest.param(
        lambda: json.dumps({"epoch": 3}).encode(),
        "is not a file written by torch.save (it is a JSON file)",
        id="json",
    ),
    pytest.param(npy_bytes, "is not a file written by torch.save (it is a numpy .npy file", id="npy"),
    pytest.param(
        zip_bytes, "is a zip archive, not a file written by torch.save (it holds no data.pkl)", id="zip"
    ),
    pytest.param(
        lambda: pickle.dumps({"epoch": 3}),
        "is not a file written by torch.save (it is a plain pickle file",
        id="plain-pickle",
    ),
]


@pytest.mark.parametrize("make_bytes, problem", BAD_FILES)
def test_bad_file_error_names_the_file_and_the_problem_and_never_suggests_weights_only_false(
    tmp_path: Path, make_bytes: Any, problem: str
) -> None:
    path = tmp_path / "bad.pt"
    path.write_bytes(make_bytes())
    with pytest.raises(CheckpointFileError) as error:
        safe_torch_load(path)
    message = str(error.value)
    assert message.startswith(f"{path} ")
    assert problem in message
    assert "weights_only=False" not in message


def test_loading_a_directory_says_it_is_a_directory_and_how_to_load_a_state(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError) as error:
        safe_torch_load(tmp_path)
    assert str(error.value).startswith(f"{tmp_path} is a directory, not a checkpoint file")
    assert "load_training_state" in str(error.value) and "weights_only=False" not in str(error.value)


def test_bad_file_given_to_load_checkpoint_leaves_the_model_unchanged(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(torch_bytes()[:-30])
    trainer = make_trainer()
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=4)
    before = snapshot(trainer)
    with pytest.raises(CheckpointFileError, match="bad.pt is truncated or corrupt"):
        trainer.load_checkpoint(tmp_path / "bad.pt")
    assert_equal_nested(snapshot(trainer), before)


class RunsCode:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.getcwd, ())


@pytest.mark.parametrize("legacy", [False, True], ids=["zip-format", "legacy-format"])
def test_complete_file_with_unsafe_objects_is_refused_explaining_the_danger_of_weights_only_false(
    tmp_path: Path, legacy: bool
) -> None:
    path = tmp_path / "unsafe.pt"
    torch.save(
        {"model_state_dict": {}, "payload": RunsCode()}, path, _use_new_zipfile_serialization=not legacy
    )
    with pytest.raises(pickle.UnpicklingError) as error:
        safe_torch_load(path)
    message = str(error.value)
    assert str(path) in message and "posix.getcwd" in message
    assert "weights_only=False" in message
    assert "can run arbitrary code" in message and "only if you created it yourself" in message
    # ... and Trainer.load_checkpoint refuses it the same way
    with pytest.raises(pickle.UnpicklingError, match=r"Refused to load .*weights_only=True"):
        make_trainer().load_checkpoint(path)
