"""RunHistory, LossTracker, placeholders and utils."""

from __future__ import annotations

import functools
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytorch_accelerated import TrainerPlaceholderValues as P
from pytorch_accelerated.tracking import InMemoryRunHistory, LossTracker
from pytorch_accelerated.trainer import replace_trainer_placeholder_values
from pytorch_accelerated.utils import DataLoaderSlice, remove_padding


def test_run_history_records_prefixes_and_counts_epochs_from_one() -> None:
    history = InMemoryRunHistory()
    assert history.current_epoch == 1
    history.update_metric("loss", 1.0)
    history.set_metric_name_prefix("ema_")
    history.update_metric("loss", 2.0)
    assert history.get_metric_names() == {"loss", "ema_loss"}
    assert history.get_latest_metric("ema_loss") == 2.0
    history._increment_epoch()
    assert history.current_epoch == 2
    history.delete_metric("loss")
    assert history.get_metric_values("loss") == []
    with pytest.raises(KeyError, match=r"No values recorded for metric 'loss'. Recorded metrics: ema_loss"):
        history.get_latest_metric("loss")
    history.reset()
    assert (history.get_metric_names(), history.current_epoch, history.metric_name_prefix) == (set(), 1, "")


def test_run_history_state_dict_round_trips() -> None:
    history = InMemoryRunHistory()
    history.update_metric("a", 1.0)
    history._increment_epoch()
    history.update_metric("a", 0.5)
    restored = InMemoryRunHistory()
    restored.load_state_dict(history.state_dict())
    assert restored.get_metric_values("a") == [1.0, 0.5] and restored.current_epoch == 2


def test_loss_tracker_weights_by_batch_size_and_keeps_tensors_on_device() -> None:
    tracker = LossTracker()
    assert math.isnan(tracker.average)
    tracker.update(torch.tensor(2.0), batch_size=3)
    tracker.update(torch.tensor(4.0), batch_size=1)
    assert isinstance(tracker.running_total, torch.Tensor)
    assert tracker.average == pytest.approx(2.5)
    assert tracker.total == pytest.approx(10.0)
    tracker.reset()
    assert tracker.count == 0


def test_placeholders_support_multiplication_addition_and_each_other() -> None:
    trainer = SimpleNamespace(
        run_config=SimpleNamespace(
            num_epochs=3, num_update_steps_per_epoch=5, num_local_update_steps_per_epoch=5
        ),
        train_dataloader=[0] * 10,
        eval_dataloader=[0] * 4,
    )
    fn = functools.partial(
        dict,
        a=P.NUM_EPOCHS * 2 + 1,
        b=P.NUM_EPOCHS * P.NUM_UPDATE_STEPS_PER_EPOCH,
        c=P.TRAIN_DATALOADER_LEN,
        d=P.EVAL_DATALOADER_LEN + 1,
        e=2 * P.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH,
        f="left alone",
    )
    assert replace_trainer_placeholder_values(trainer, fn)() == {
        "a": 7,
        "b": 15,
        "c": 10,
        "d": 5,
        "e": 10,
        "f": "left alone",
    }


def test_dataloader_slice_limits_batches_and_reports_length() -> None:
    sliced = DataLoaderSlice(torch.utils.data.DataLoader(list(range(10)), batch_size=2), 3)
    assert len(sliced) == 3 and [b.tolist() for b in sliced] == [[0, 1], [2, 3], [4, 5]]
    assert sliced.batch_size == 2


def test_remove_padding_drops_padded_elements_and_rows() -> None:
    assert remove_padding(torch.tensor([1, 2, -1, -1]), -1).tolist() == [1, 2]
    rows = torch.tensor([[1, 2], [-1, -1], [3, -1]])
    assert remove_padding(rows, -1).tolist() == [[1, 2], [3, -1]]


def test_logged_hyperparameters_are_values_never_object_reprs(tmp_path: Any) -> None:
    """A generator in the loader's arguments is logged as its seed (every tracker takes this dict)."""
    from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrackingCallback
    from tests.helpers import make_regression_data, make_trainer

    tracking = TrackingCallback(
        "csv", logging_dir=tmp_path, run_name="run", hyperparameters={"tag": object()}
    )
    trainer = make_trainer((*DEFAULT_CALLBACKS, tracking))
    kwargs = {"generator": torch.Generator().manual_seed(1234)}
    trainer.train(
        make_regression_data(8), num_epochs=1, per_device_batch_size=4, train_dataloader_kwargs=kwargs
    )
    hparams = json.loads((tmp_path / "run" / "hparams.json").read_text())
    assert hparams["train_dl_kwargs.generator"] == 1234
    assert hparams["tag"] == "object"
    assert not [key for key, value in hparams.items() if " at 0x" in str(value)]
