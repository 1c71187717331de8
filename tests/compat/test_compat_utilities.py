"""The names of pytorch-accelerated 0.1.61 (the package, ``.trainer`` and ``.callbacks``), its
tracking, fine-tuning and utilities keep working (docs/migration.md).

Each kept item is exercised in 0.1.61's form (its import paths, keyword names, attribute names,
tuple shapes), and ours too where both are accepted, with worked numbers; where 0.1.61 was at
fault (docs/migration.md, "What changed"), the fix is checked to stay.
"""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import accelerate
import accelerate.utils
import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer, accelerate_notebook_launcher, logger, notebook_launcher, set_seed
from pytorch_accelerated.callbacks import (
    CallbackMethodNotImplementedError,
    DataLoaderSlice,
    LimitBatchesCallback,
    LossTracker,
    ModelEma,
)
from pytorch_accelerated.finetuning import BN_MODULES, Layer, LayerGroup, ModelFreezer
from pytorch_accelerated.tracking import InMemoryRunHistory
from tests.helpers import make_linear_model, subprocess_env

# ---------------------------------------------------------------- names


def test_package_exports_set_seed_the_notebook_launcher_and_a_logger():
    assert set_seed is accelerate.utils.set_seed
    assert accelerate_notebook_launcher is notebook_launcher is accelerate.notebook_launcher
    assert logger is logging.getLogger("pytorch_accelerated")
    set_seed(3)
    first = torch.rand(2)
    set_seed(3)
    assert torch.equal(first, torch.rand(2))


def test_importing_the_package_reseeds_nothing(tmp_path: Path):
    # changed from 0.1.61: 0.1.61 ran set_seed(42) on import. A fresh interpreter, so the import is real.
    script = textwrap.dedent(
        """
        import random
        import numpy as np
        import torch
        random.seed(7); np.random.seed(7); torch.manual_seed(7)
        before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        import pytorch_accelerated
        after = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
        assert before[0] == after[0], "python"
        assert (before[1] == after[1]).all(), "numpy"
        assert torch.equal(before[2], after[2]), "torch"
        print("UNCHANGED")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=subprocess_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "UNCHANGED" in result.stdout, result.stderr


def test_trainer_module_re_exports_the_default_callbacks_and_helpers():
    from pytorch_accelerated import callbacks, data, utils
    from pytorch_accelerated.trainer import (
        DEFAULT_CALLBACKS,
        LimitBatchesCallback,
        LogMetricsCallback,
        MoveModulesToDeviceCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        TerminateOnNaNCallback,
        remove_padding,
        worker_init_fn,
    )

    assert DEFAULT_CALLBACKS == (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        ProgressBarCallback,
        LogMetricsCallback,
    )
    assert LimitBatchesCallback is callbacks.LimitBatchesCallback
    assert remove_padding is utils.remove_padding and worker_init_fn is data.worker_init_fn
    padded = torch.tensor([[1, 2], [3, 4], [-1, -1]])
    assert remove_padding(padded, -1).tolist() == [[1, 2], [3, 4]]


def test_callbacks_module_re_exports_tracking_and_utils_names():
    from pytorch_accelerated import tracking, utils

    assert LossTracker is tracking.LossTracker
    assert ModelEma is utils.ModelEma and DataLoaderSlice is utils.DataLoaderSlice
    with pytest.raises(NotImplementedError):  # an Exception, as in 0.1.61
        raise CallbackMethodNotImplementedError("on_custom_event")
    assert issubclass(CallbackMethodNotImplementedError, Exception)


# ---------------------------------------------------------------- tracking


def test_loss_tracker_worked_example_with_the_original_and_our_names():
    tracker = LossTracker()
    tracker.update(2.0, 4)
    tracker.update(1.0, 1)
    assert (tracker.total_loss, tracker.running_count, tracker.average) == (9.0, 5, 1.8)
    assert (tracker.running_total, tracker.count, tracker.loss_value) == (9.0, 5, 1.0)
    tracker.total_loss, tracker.running_count = 3.0, 2  # the aliases write too
    assert (tracker.running_total, tracker.count, tracker.average) == (3.0, 2, 1.5)
    tracker.running_total = 8.0
    assert tracker.total_loss == 8.0
    tracker.reset()
    assert (tracker.total_loss, tracker.running_count) == (0.0, 0)
    assert math.isnan(tracker.average)  # changed from 0.1.61: no average yet is not an average of 0


@pytest.mark.parametrize("error_type", [ValueError, KeyError])
def test_get_latest_metric_without_values_raises_both_error_types(error_type):
    history = InMemoryRunHistory()
    history.update_metric("ema_loss", 1.0)
    with pytest.raises(error_type) as raised:
        history.get_latest_metric("loss")
    assert str(raised.value) == "No values recorded for metric 'loss'. Recorded metrics: ema_loss."


# ---------------------------------------------------------------- fine-tuning


def block_model() -> nn.Sequential:
    """Three layer groups: a conv + batch norm + activation block, an activation, a head."""
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU()),
        nn.ReLU(),
        nn.Linear(2, 3),
    )


def test_layer_groups_unpack_into_tuple_index_module_and_frozen_snapshot():
    model = block_model()
    freezer = ModelFreezer(model, freeze_batch_norms=False)
    before = freezer.get_layer_groups()
    freezer.freeze()
    groups = freezer.get_layer_groups()
    assert all(isinstance(group, (LayerGroup, tuple)) and len(group) == 3 for group in groups)
    unpacked = [(idx, module, is_frozen) for idx, module, is_frozen in groups]
    # The conv + batch norm group counts as frozen: one of its parameters is (original rule).
    assert unpacked == [((0, -3), model[0], True), ((1, -2), model[1], False), ((2, -1), model[2], False)]
    assert [group.is_frozen for group in before] == [False, False, False]  # a snapshot
    assert freezer.num_groups == 3
    assert model[0][1].weight.requires_grad  # the batch norm still learns


@pytest.mark.parametrize("set_modules_as_eval", [False, True])
def test_layers_unpack_into_group_index_module_and_frozen_snapshot(set_modules_as_eval):
    model = block_model()
    freezer = ModelFreezer(model)
    freezer.freeze(set_modules_as_eval=set_modules_as_eval)
    layers = [(idx, module, is_frozen) for idx, module, is_frozen in freezer.get_layers()]
    assert all(isinstance(layer, Layer) for layer in freezer.get_layers())
    # Layers are the leaf modules; one without parameters is frozen when it is in eval mode.
    assert layers == [
        ((0, -3), model[0][0], True),
        ((0, -3), model[0][1], False),
        ((0, -3), model[0][2], set_modules_as_eval),
        ((1, -2), model[1], set_modules_as_eval),
        ((2, -1), model[2], False),
    ]
    assert [name for name, _ in freezer.get_named_layers()] == ["0.0", "0.1", "0.2", "1", "2"]


def test_creating_a_freezer_makes_every_parameter_trainable():
    model = block_model()
    model.requires_grad_(False)
    ModelFreezer(model)
    assert all(p.requires_grad for p in model.parameters())


def test_freeze_bn_is_an_alias_of_freeze_batch_norms_and_bn_modules_lists_the_four():
    assert BN_MODULES == (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    model = block_model()
    freezer = ModelFreezer(model)
    assert freezer.freeze_bn is freezer.freeze_batch_norms is False
    freezer.freeze_bn = True
    assert freezer.freeze_batch_norms is True
    freezer.freeze(0, 0)
    assert not any(p.requires_grad for p in model[0].parameters())
    assert ModelFreezer(block_model(), freeze_batch_norms=True).freeze_bn is True


class BlockWithOwnScale(nn.Module):
    """A module with children that also owns a parameter directly."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_modules_with_children_and_their_own_parameters_are_layers_and_get_frozen():
    # changed from 0.1.61: 0.1.61 listed leaf modules only and never froze ``scale``.
    model = nn.Sequential(BlockWithOwnScale(), nn.Linear(2, 1))
    freezer = ModelFreezer(model)
    assert [name for name, _ in freezer.get_named_layers()] == ["0", "0.linear", "1"]
    freezer.freeze()
    assert not model[0].scale.requires_grad and not model[0].linear.weight.requires_grad
    assert freezer.get_layers()[0] == ((0, -2), model[0], True)


def test_freeze_with_set_modules_as_eval_freezes_too():
    # changed from 0.1.61: 0.1.61 swapped two arguments internally and froze nothing when asked for eval.
    model = block_model()
    ModelFreezer(model).freeze(0, 0, set_modules_as_eval=True)
    assert not model[0][0].weight.requires_grad and not model[0][0].training


def test_gradual_unfreezing_in_the_original_form_gives_param_groups():
    model = block_model()
    freezer = ModelFreezer(model)
    freezer.freeze(from_index=0, to_index=-2)
    optimizer = torch.optim.SGD(freezer.get_trainable_parameters(), lr=0.1)
    for param_group in freezer.unfreeze(from_index=-3, to_index=-3).values():
        optimizer.add_param_group({**param_group, "lr": 0.01})
    assert [len(g["params"]) for g in optimizer.param_groups] == [4, 2]  # head + bn; conv
    assert [group.is_frozen for group in freezer.get_layer_groups()] == [False, False, False]


# ---------------------------------------------------------------- utils


def loader(num_batches: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(list(range(num_batches)), batch_size=1)


def test_data_loader_slice_takes_slice_size_or_num_batches_with_both_attributes():
    dl = loader(10)
    positional, by_original_name, by_our_name = (
        DataLoaderSlice(dl, 3),
        DataLoaderSlice(dl, slice_size=3),
        DataLoaderSlice(dl, num_batches=3),
    )
    for sliced in (positional, by_original_name, by_our_name):
        assert sliced.dl is dl and sliced.slice_size == sliced.num_batches == 3
        assert len(sliced) == 3 and [int(b) for b in sliced] == [0, 1, 2]
    by_original_name.num_batches = 2
    assert by_original_name.slice_size == 2 and len(by_original_name) == 2
    assert len(DataLoaderSlice(loader(2), slice_size=5)) == 2  # changed from 0.1.61: what it really yields


def test_data_loader_slice_rejects_conflicting_names_and_bad_sizes():
    with pytest.raises(ValueError, match=r"slice_size=3 and num_batches=4: they are two names"):
        DataLoaderSlice(loader(5), 3, num_batches=4)
    with pytest.raises(
        ValueError, match=r"DataLoaderSlice: slice_size must be a whole number >= 0 or None, got -1"
    ):
        DataLoaderSlice(loader(5), slice_size=-1)
    with pytest.raises(
        ValueError, match=r"DataLoaderSlice: num_batches must be a whole number >= 0 or None, got 1.5"
    ):
        DataLoaderSlice(loader(5), num_batches=1.5)


def bn_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))


def step_model(model: nn.Module) -> None:
    """Move every parameter and the batch-norm statistics, as a training step would."""
    model.train()
    model(torch.randn(4, 2))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)


def test_model_ema_update_fn_is_the_formula_and_the_default_update_matches_it():
    model = bn_model()
    ema = ModelEma(model, decay=0.75)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    step_model(model)
    ema.update(model)
    for name, value in model.state_dict().items():
        if value.is_floating_point():
            expected = ema.update_fn(before[name], value)
            assert torch.allclose(expected, 0.75 * before[name] + 0.25 * value)
            assert torch.allclose(ema.module.state_dict()[name], expected)


class RecordingEma(ModelEma):
    """0.1.61's subclass pattern: a different average through ``update_fn``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model, decay=0.5)
        self.calls: list[tuple[torch.dtype, tuple[int, ...]]] = []

    def update_fn(self, ema_model_weights: torch.Tensor, updated_model_weights: torch.Tensor) -> torch.Tensor:
        self.calls.append((ema_model_weights.dtype, tuple(updated_model_weights.shape)))
        return torch.maximum(ema_model_weights, updated_model_weights) + 1


def test_an_overridden_update_fn_is_called_for_every_float_tensor_and_counts_are_copied():
    model = bn_model()
    ema = RecordingEma(model)
    before = {k: v.clone() for k, v in ema.module.state_dict().items()}
    step_model(model)
    step_model(model)
    ema.update(model)
    floats = {k: v for k, v in model.state_dict().items() if v.is_floating_point()}
    # weight, bias, bn weight, bn bias, running_mean, running_var: not num_batches_tracked
    assert ema.calls == [(torch.float32, tuple(v.shape)) for v in floats.values()]
    for name, value in floats.items():
        assert torch.equal(ema.module.state_dict()[name], torch.maximum(before[name], value) + 1)
    tracked = ema.module.state_dict()["1.num_batches_tracked"]
    assert tracked.dtype == torch.long and int(tracked) == 2  # changed from 0.1.61: copied, not averaged


@pytest.mark.parametrize("value", ["none", "None", "NONE", " none "])
def test_pt_acc_limit_batches_none_in_any_case_means_no_limit(monkeypatch, value):
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", value)
    trainer = Trainer(make_linear_model(), loss_func=nn.MSELoss(), optimizer=None, callbacks=())
    assert trainer.callback_handler.get_callback(LimitBatchesCallback) is None


def test_pt_acc_limit_batches_with_a_number_limits_every_epoch(monkeypatch):
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", "2")
    trainer = Trainer(make_linear_model(), loss_func=nn.MSELoss(), optimizer=None, callbacks=())
    assert trainer.callback_handler.get_callback(LimitBatchesCallback).num_batches == 2


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two"])
def test_pt_acc_limit_batches_rejects_zero_negatives_and_non_integers(monkeypatch, value):
    # changed from 0.1.61: 0.1.61 passed "0" to int() and trained on no batches (a NaN loss).
    monkeypatch.setenv("PT_ACC_LIMIT_BATCHES", value)
    expected = (
        rf"The environment variable PT_ACC_LIMIT_BATCHES \(batches per epoch\) must be a whole number "
        rf">= 1, got '{value}'\. Unset it to train on every batch"
    )
    with pytest.raises(ValueError, match=expected):
        Trainer(make_linear_model(), loss_func=nn.MSELoss(), optimizer=None, callbacks=())
