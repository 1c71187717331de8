"""Freeze and unfreeze parts of a model, for transfer learning and gradual unfreezing.

A model's *layer groups* are its direct children (``model.children()``), numbered from 0. Each group
holds *layers*: its leaf modules, and the submodules that own parameters directly. Freezing a group
sets ``requires_grad=False`` on its parameters; batch-norm layers are left alone unless the freezer
was created with ``freeze_batch_norms=True``, because fine-tuning usually works best when their
affine parameters keep adapting to the new data.

:class:`Layer` and :class:`LayerGroup` are named tuples, as in pytorch-accelerated 0.1.61:
``for (group_index, negative_index), module, is_frozen in freezer.get_layer_groups(): ...``.
"""

from collections.abc import Iterator
from typing import NamedTuple

import torch.nn as nn
from accelerate.utils import extract_model_from_parallel
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["BN_MODULES", "Layer", "LayerGroup", "ModelFreezer"]

#: The batch-norm classes of 0.1.61. The freezer recognises every subclass of torch's
#: ``_BatchNorm``, which includes these (and lazy batch norms).
BN_MODULES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


class Layer(NamedTuple):
    """A layer of a layer group: a leaf module, or a submodule that owns parameters.

    A snapshot, taken when :meth:`ModelFreezer.get_layers` is called. Its qualified name in the
    model is given by :meth:`ModelFreezer.get_named_layers`.

    Attributes:
        layer_group_idx: ``(i, i - num_groups)``: the index of its layer group, counted from the
            start and from the end, e.g. ``(0, -3)`` for the first of three groups.
        module: The layer itself.
        is_frozen: Whether none of its own parameters require gradients; for a layer without
            parameters, whether it is in eval mode.
    """

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


class LayerGroup(NamedTuple):
    """A direct child of the model: the unit that is frozen and unfrozen.

    A snapshot, taken when :meth:`ModelFreezer.get_layer_groups` is called.

    Attributes:
        layer_group_idx: ``(i, i - num_groups)``: its index in ``model.children()``, counted from
            the start and from the end.
        module: The child module.
        is_frozen: Whether any of its parameters does not require gradients, so a group whose
            batch norms were left trainable by :meth:`ModelFreezer.freeze` counts as frozen.
    """

    layer_group_idx: tuple[int, int]
    module: nn.Module
    is_frozen: bool


def _layer_is_frozen(module: nn.Module) -> bool:
    params = list(module.parameters(recurse=False))
    return not any(p.requires_grad for p in params) if params else not module.training


class ModelFreezer:
    """Freezes and unfreezes a model's layer groups (its direct children).

    Indices are inclusive at both ends, may be negative (``-1`` is the last group) and may be given
    in either order: ``freeze(0, 2)`` and ``freeze(2, 0)`` freeze the same three groups.

    Args:
        model: The model to manage. A model wrapped by DistributedDataParallel or ``torch.compile``
            is unwrapped. Freeze before wrapping a model in DistributedDataParallel: DDP only
            registers gradient hooks for the parameters that require gradients when it is created.
        freeze_batch_norms: Whether batch-norm layers are frozen (and have their mode set) with the
            rest of their group. By default they stay trainable and keep their current mode.
            Also readable and settable as ``freeze_bn``, 0.1.61's name.

    Every parameter of the model is made trainable when the freezer is created, so the freezer
    starts from a known state; freeze afterwards.

    Raises:
        ValueError: If the model has no child modules, so there is nothing to freeze.

    Examples:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> freezer = ModelFreezer(model)
        >>> freezer.freeze()  # every group but the last
        >>> [p.shape for p in freezer.get_trainable_parameters()]
        [torch.Size([2, 8]), torch.Size([2])]
        >>> [(idx, is_frozen) for idx, _, is_frozen in freezer.get_layer_groups()]
        [((0, -3), True), ((1, -2), False), ((2, -1), False)]
        >>> sorted(freezer.unfreeze(from_index=0, to_index=0))
        [0]
    """

    def __init__(self, model: nn.Module, freeze_batch_norms: bool = False) -> None:
        self.model = extract_model_from_parallel(model, keep_torch_compile=False)
        self.freeze_batch_norms = freeze_batch_norms
        if self.num_groups == 0:
            raise ValueError(
                f"ModelFreezer needs a model with child modules to use as layer groups, but "
                f"{type(self.model).__name__} has none. Wrap it in a container, e.g. "
                f"nn.Sequential(model), or freeze its parameters directly with requires_grad_(False)."
            )
        self.model.requires_grad_(True)

    @property
    def freeze_bn(self) -> bool:
        """0.1.61's name for :attr:`freeze_batch_norms`."""
        return self.freeze_batch_norms

    @freeze_bn.setter
    def freeze_bn(self, value: bool) -> None:
        self.freeze_batch_norms = value

    @property
    def num_groups(self) -> int:
        """The number of layer groups: the model's direct children."""
        return sum(1 for _ in self.model.children())

    def get_layer_groups(self) -> list[LayerGroup]:
        """Returns the model's direct children as layer groups, in order (a snapshot)."""
        num_groups = self.num_groups
        return [
            LayerGroup(
                (index, index - num_groups),
                module,
                any(not p.requires_grad for p in module.parameters()),
            )
            for index, module in enumerate(self.model.children())
        ]

    def get_layers(self) -> list[Layer]:
        """Returns every layer of every group (a snapshot): its leaf modules, and the submodules
        that own parameters (0.1.61 left those out, and so never froze their parameters)."""
        return [layer for _, layer in self.get_named_layers()]

    def get_named_layers(self) -> list[tuple[str, Layer]]:
        """Returns ``(name, layer)`` for every layer of :meth:`get_layers`, in the same order.

        ``name`` is the layer's qualified name in the model, as in ``model.named_modules()``
        (e.g. ``"layer4.1.conv2"``); it is not a field of :class:`Layer`, which keeps 0.1.61's
        three fields.
        """
        num_groups = self.num_groups
        return [
            (name, Layer((group_index, group_index - num_groups), module, _layer_is_frozen(module)))
            for group_index, (group_name, group) in enumerate(self.model.named_children())
            for name, module in group.named_modules(prefix=group_name)
            # a module that owns parameters, or a leaf
            if next(module.parameters(recurse=False), None) is not None
            or next(module.children(), None) is None
        ]

    def get_trainable_parameters(self) -> list[nn.Parameter]:
        """Returns the model's parameters that require gradients: the ones to give an optimizer."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def freeze(self, from_index: int = 0, to_index: int = -2, set_modules_as_eval: bool = False) -> None:
        """Freezes the layer groups from ``from_index`` to ``to_index``, both included.

        Args:
            from_index: The first group to freeze. Defaults to the first group.
            to_index: The last group to freeze. Defaults to the one before last, which leaves the
                usual classification head trainable.
            set_modules_as_eval: Whether to also put the frozen modules in eval mode, so that
                dropout and (if frozen) batch-norm statistics stop changing. Note that a later
                ``model.train()`` call, such as the Trainer's at each epoch start, undoes this.

        Raises:
            IndexError: If an index is outside the model's layer groups.
        """
        for _, module in self._managed_modules(from_index, to_index):
            for param in module.parameters(recurse=False):
                param.requires_grad = False
            if set_modules_as_eval:
                module.training = False

    def unfreeze(
        self, from_index: int = -1, to_index: int = 0, set_modules_as_training: bool = True
    ) -> dict[int, dict[str, list[nn.Parameter]]]:
        """Unfreezes the layer groups from ``from_index`` to ``to_index``, both included.

        Only parameters that were frozen are returned, so calling this again, or on a range that
        overlaps an earlier call, never hands the optimizer a parameter it already has; this
        assumes the optimizer was built from :meth:`get_trainable_parameters`, not from every
        parameter of the model.

        Args:
            from_index: The first group to unfreeze. Defaults to the last group.
            to_index: The last group to unfreeze. Defaults to the first group.
            set_modules_as_training: Whether to also put the unfrozen modules in training mode.

        Returns:
            For each group that had parameters unfrozen, ``{group_index: {"params": [...]}}``; each
            value can be passed to ``optimizer.add_param_group``, optionally with its own ``lr``.

        Raises:
            IndexError: If an index is outside the model's layer groups.
        """
        unfrozen: dict[int, dict[str, list[nn.Parameter]]] = {}
        for group_index, module in self._managed_modules(from_index, to_index):
            newly_trainable = [p for p in module.parameters(recurse=False) if not p.requires_grad]
            for param in newly_trainable:
                param.requires_grad = True
            if newly_trainable:
                unfrozen.setdefault(group_index, {"params": []})["params"].extend(newly_trainable)
            if set_modules_as_training:
                module.training = True
        return unfrozen

    def _managed_modules(self, from_index: int, to_index: int) -> Iterator[tuple[int, nn.Module]]:
        """Returns ``(group_index, module)`` for every module this freezer manages in the range.

        Modes are set module by module rather than with ``group.train()``, which would recurse into
        batch-norm layers that must keep their mode.
        """
        first, last = sorted((self._resolve_index(from_index), self._resolve_index(to_index)))
        return (
            (group_index, module)
            for group_index, group in enumerate(self.model.children())
            if first <= group_index <= last
            for module in group.modules()
            if self.freeze_batch_norms or not isinstance(module, _BatchNorm)
        )

    def _resolve_index(self, index: int) -> int:
        """Turns a possibly negative group index into a non-negative one, checking its range."""
        num_groups = self.num_groups
        if not -num_groups <= index < num_groups:
            raise IndexError(
                f"Layer group index {index} is out of range: the model has {num_groups} layer "
                f"groups, so valid indices are 0 to {num_groups - 1}, or -{num_groups} to -1 from "
                f"the end. See get_layer_groups() for what each index is."
            )
        return index % num_groups
