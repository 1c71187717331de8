import pytest
import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from pytorch_accelerated.finetuning import Layer, LayerGroup, ModelFreezer

NUM_GROUPS = 4


def make_model() -> nn.Sequential:
    """Four layer groups: two blocks with batch norm, one without parameters, and a head.

    The linears before batch norm have no bias, which would get no gradient through it.
    """
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Linear(4, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU()),
        nn.Sequential(nn.Linear(8, 8, bias=False), nn.BatchNorm1d(8), nn.Dropout(0.1)),
        nn.ReLU(),
        nn.Linear(8, 3),
    )


def non_bn_params(module: nn.Module) -> list:
    return [p for m in module.modules() if not isinstance(m, _BatchNorm) for p in m.parameters(recurse=False)]


def bn_params(module: nn.Module) -> list:
    return [p for m in module.modules() if isinstance(m, _BatchNorm) for p in m.parameters()]


def frozen_groups(model: nn.Module) -> set:
    """Indices of the groups whose non-batch-norm parameters are all frozen (groups with some)."""
    return {
        i
        for i, group in enumerate(model.children())
        if non_bn_params(group) and not any(p.requires_grad for p in non_bn_params(group))
    }


def ids(params) -> set:
    return {id(p) for p in params}


def test_layer_groups_are_the_direct_children_in_order():
    model = make_model()
    groups = ModelFreezer(model).get_layer_groups()
    assert [g.layer_group_idx for g in groups] == [(0, -4), (1, -3), (2, -2), (3, -1)]
    assert all(isinstance(g, LayerGroup) for g in groups)
    assert [g.module for g in groups] == list(model.children())


def test_get_layers_lists_parameter_holding_and_leaf_modules_with_their_group():
    model = make_model()
    freezer = ModelFreezer(model)
    named_layers = freezer.get_named_layers()
    layers = freezer.get_layers()
    assert [layer for _, layer in named_layers] == layers
    assert all(isinstance(layer, Layer) for layer in layers)
    assert [(layer.layer_group_idx[0], name) for name, layer in named_layers] == [
        (0, "0.0"), (0, "0.1"), (0, "0.2"),
        (1, "1.0"), (1, "1.1"), (1, "1.2"),
        (2, "2"),
        (3, "3"),
    ]  # fmt: skip
    assert layers[0].module is model[0][0]


def test_freeze_with_defaults_freezes_every_group_but_the_last():
    model = make_model()
    ModelFreezer(model).freeze()
    assert frozen_groups(model) == {0, 1}
    assert all(p.requires_grad for p in model[3].parameters())


@pytest.mark.parametrize(
    "from_index, to_index, expected",
    [
        (0, 1, {0, 1}),
        (1, 0, {0, 1}),
        (-4, -3, {0, 1}),
        (-3, -4, {0, 1}),
        (0, -3, {0, 1}),
        (1, 1, {1}),
        (-1, -1, {3}),
        (3, 0, {0, 1, 3}),
        (0, -1, {0, 1, 3}),
    ],
)
def test_freeze_selects_the_inclusive_range_for_every_index_form(from_index, to_index, expected):
    model = make_model()
    ModelFreezer(model).freeze(from_index=from_index, to_index=to_index)
    assert frozen_groups(model) == expected


@pytest.mark.parametrize("method", ["freeze", "unfreeze"])
@pytest.mark.parametrize("bad_index", [4, -5, 100])
def test_out_of_range_index_raises_naming_index_group_count_and_valid_range(method, bad_index):
    model = make_model()
    expected = (
        rf"index {bad_index} is out of range: the model has 4 layer groups, "
        r"so valid indices are 0 to 3, or -4 to -1"
    )
    with pytest.raises(IndexError, match=expected):
        getattr(ModelFreezer(model), method)(from_index=0, to_index=bad_index)
    with pytest.raises(IndexError, match=expected):
        getattr(ModelFreezer(model), method)(from_index=bad_index, to_index=0)
    assert frozen_groups(model) == set()


def test_model_without_children_raises_with_the_fix():
    with pytest.raises(ValueError, match=r"Linear has none\. Wrap it in a container"):
        ModelFreezer(nn.Linear(2, 2))


def test_freeze_leaves_batch_norms_trainable_by_default():
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze(0, -1)
    assert frozen_groups(model) == {0, 1, 3}
    assert bn_params(model) and all(p.requires_grad for p in bn_params(model))
    assert ids(freezer.get_trainable_parameters()) == ids(bn_params(model))


def test_freeze_batch_norms_flag_freezes_them_too():
    model = make_model()
    freezer = ModelFreezer(model, freeze_batch_norms=True)
    freezer.freeze(0, -1)
    assert not any(p.requires_grad for p in model.parameters())
    assert freezer.get_trainable_parameters() == []


def test_freeze_without_set_modules_as_eval_keeps_every_module_training():
    model = make_model()
    ModelFreezer(model).freeze()
    assert all(m.training for m in model.modules())


def test_set_modules_as_eval_evals_frozen_modules_and_keeps_batch_norm_mode():
    model = make_model()
    model[1][1].eval()  # batch norms keep whatever mode they were in
    ModelFreezer(model).freeze(0, 1, set_modules_as_eval=True)
    assert frozen_groups(model) == {0, 1}  # the original froze nothing when asked for eval
    assert not any(
        m.training for m in [model[0], model[0][0], model[0][2], model[1], model[1][0], model[1][2]]
    )
    assert model[0][1].training and not model[1][1].training
    assert model[2].training and model[3].training


def test_set_modules_as_eval_with_freeze_batch_norms_evals_batch_norms():
    model = make_model()
    ModelFreezer(model, freeze_batch_norms=True).freeze(0, 1, set_modules_as_eval=True)
    assert not any(m.training for m in [*model[0].modules(), *model[1].modules()])
    assert model[3].training


def test_unfreeze_returns_only_the_newly_unfrozen_params_of_each_group():
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze()
    groups = freezer.unfreeze(from_index=-1, to_index=1)
    assert sorted(groups) == [1]  # group 3 was trainable, group 2 has no parameters
    assert ids(groups[1]["params"]) == ids(model[1][0].parameters())
    assert frozen_groups(model) == {0}


def test_unfreeze_called_again_returns_no_params_already_unfrozen():
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze()
    first = freezer.unfreeze(1, 1)
    second = freezer.unfreeze()
    assert sorted(first) == [1] and sorted(second) == [0]
    assert ids(second[0]["params"]) == ids(model[0][0].parameters())
    assert freezer.unfreeze() == {}


def test_unfreeze_with_defaults_unfreezes_every_group():
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze(0, -1)
    groups = freezer.unfreeze()
    assert sorted(groups) == [0, 1, 3]
    assert all(p.requires_grad for p in model.parameters())


def test_unfreeze_with_freeze_batch_norms_returns_batch_norm_params_too():
    model = make_model()
    freezer = ModelFreezer(model, freeze_batch_norms=True)
    freezer.freeze(0, 0)
    groups = freezer.unfreeze(0, 0)
    assert ids(groups[0]["params"]) == ids(model[0].parameters())


@pytest.mark.parametrize("set_modules_as_training", [True, False])
def test_unfreeze_set_modules_as_training_controls_the_mode(set_modules_as_training):
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze(0, 1, set_modules_as_eval=True)
    freezer.unfreeze(1, 1, set_modules_as_training=set_modules_as_training)
    assert all(
        m.training == set_modules_as_training for m in model[1].modules() if not isinstance(m, _BatchNorm)
    )
    assert not model[0][0].training  # outside the range


def sgd_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Takes one step and returns, per parameter name, whether its value changed."""
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(torch.randn(16, 4)), torch.randint(0, 3, (16,))).backward()
    optimizer.step()
    return {name: not torch.equal(before[name], p) for name, p in model.named_parameters()}


def test_training_updates_only_trainable_params_and_unfrozen_groups_join_the_optimizer():
    model = make_model()
    freezer = ModelFreezer(model)
    freezer.freeze()
    optimizer = torch.optim.SGD(freezer.get_trainable_parameters(), lr=0.1)

    changed = sgd_step(model, optimizer)
    assert changed == {name: p.requires_grad for name, p in model.named_parameters()}
    assert not changed["0.0.weight"] and changed["0.1.weight"] and changed["3.weight"]

    for group in freezer.unfreeze(-2, 1).values():
        optimizer.add_param_group({**group, "lr": 0.01})
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.01]

    changed = sgd_step(model, optimizer)
    assert changed["1.0.weight"] and not changed["0.0.weight"]
    assert changed == {name: p.requires_grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("freeze_batch_norms", [False, True])
def test_timm_resnet18_frozen_except_its_last_group_trains_only_the_head(freeze_batch_norms):
    timm = pytest.importorskip("timm")  # absent where torchvision does not import (the lower-bounds tier)
    model = timm.create_model("resnet18", pretrained=False, num_classes=3)
    freezer = ModelFreezer(model, freeze_batch_norms=freeze_batch_norms)
    assert freezer.get_layer_groups()[-1].module is model.fc
    freezer.freeze()
    expected = [*model.fc.parameters()] + ([] if freeze_batch_norms else bn_params(model))
    assert ids(freezer.get_trainable_parameters()) == ids(expected)
    groups = freezer.unfreeze(-3, -3)  # layer4
    assert sorted(groups) == [len(freezer.get_layer_groups()) - 3]
    assert ids(next(iter(groups.values()))["params"]) == ids(
        model.layer4.parameters() if freeze_batch_norms else non_bn_params(model.layer4)
    )


def test_freezer_unwraps_a_compiled_model():
    model = make_model()
    freezer = ModelFreezer(torch.compile(model))
    assert len(freezer.get_layer_groups()) == NUM_GROUPS
    freezer.freeze()
    assert frozen_groups(model) == {0, 1}
