"""Base classes for schedulers that set a value of every optimizer param group after each update.

The convention follows timm: the Trainer calls the scheduler once after each optimizer update,
and the value for ``num_updates`` (the number of updates done so far) is the one the next update
uses. So ``get_updated_values(0)`` is the value of the very first update and
``get_updated_values(T)`` is the value left in the optimizer when a run of ``T`` updates ends.

As in pytorch-accelerated 0.1.61, a subclass may set the attributes that
:meth:`~SchedulerBase.get_updated_values` reads *after* calling ``super().__init__()``: the
starting values are applied once the whole constructor has returned. ``get_updated_values``
returning ``None`` means "no update": the param groups keep their values.
"""

from __future__ import annotations

import copy
import numbers
import warnings
from abc import ABCMeta, abstractmethod
from typing import Any

import torch

from .._internal.argument_checks import check_whole_number
from ..placeholders import is_placeholder


class _AppliedAfterConstruction(ABCMeta):
    """Calls ``_on_constructed()`` once the whole constructor of a scheduler has returned."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__call__(*args, **kwargs)
        instance._on_constructed()
        return instance


class SchedulerBase(metaclass=_AppliedAfterConstruction):
    """Sets ``param_group_field`` of every param group from the number of optimizer updates done.

    At construction, each param group gets an ``initial_<field>`` key holding its starting value
    (unless it already has one, e.g. from a loaded optimizer state, as torch schedulers do); these
    starting values, in ``self.base_lr_values`` (also ``self.base_values``), are what subclasses
    schedule from, whatever the field.

    Subclasses implement :meth:`get_updated_values`. Any numeric param-group field can be
    scheduled, e.g. ``param_group_field="weight_decay"``.

    Args:
        optimizer: The optimizer whose param groups are updated.
        param_group_field: The param-group key to schedule.

    Raises:
        ValueError: If a param group has no ``param_group_field`` key.
        TypeError: If a param group's value for that key is not a number.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        self.optimizer = optimizer
        self.param_group_field = param_group_field
        self._initial_param_group_field = f"initial_{param_group_field}"
        for index, group in enumerate(optimizer.param_groups):
            _check_field(group, index, param_group_field)
            group.setdefault(self._initial_param_group_field, _as_float(group[param_group_field]))
        self.base_lr_values: list[float] = [
            _as_float(group[self._initial_param_group_field]) for group in optimizer.param_groups
        ]

    @property
    def base_values(self) -> list[float]:
        """The starting values of the scheduled field, one per param group (``base_lr_values``)."""
        return self.base_lr_values

    @base_values.setter
    def base_values(self, values: list[float]) -> None:
        self.base_lr_values = values

    def _on_constructed(self) -> None:
        """Called once the whole constructor has returned; applies nothing here."""

    @abstractmethod
    def get_updated_values(self, num_updates: int) -> list[float | None] | float | None:
        """Return the value after ``num_updates`` optimizer updates.

        Args:
            num_updates: The number of optimizer updates done so far (0 before the first one).

        Returns:
            One value per param group, in order (None leaves that group as it is), one value for
            every group, or None for no update at all.
        """

    def step_update(self, num_updates: int) -> None:
        """Set ``param_group_field`` of every param group to its value after ``num_updates`` updates.

        Args:
            num_updates: The number of optimizer updates done so far.

        Raises:
            ValueError: If :meth:`get_updated_values` returns a list of the wrong length.
        """
        values = self.get_updated_values(num_updates)
        if values is None:  # "no update", as in the original library
            return
        groups = self.optimizer.param_groups
        if not isinstance(values, (list, tuple)):
            values = [values] * len(groups)
        if len(values) != len(groups):
            raise ValueError(
                f"{type(self).__name__}.get_updated_values({num_updates}) returned {len(values)} "
                f"values but the optimizer has {len(groups)} param groups; return one value per "
                "param group, or a single value for all of them."
            )
        for group, value in zip(groups, values, strict=True):
            if value is None:
                continue
            current = group[self.param_group_field]
            # Tensor learning rates (capturable/fused optimizers) must be updated in place.
            if isinstance(current, torch.Tensor):
                current.fill_(value)
            else:
                group[self.param_group_field] = value

    def state_dict(self) -> dict[str, Any]:
        """Return the scheduler's state: every attribute except the optimizer.

        The values are plain Python objects, so the state can be saved with ``torch.save`` and
        loaded with ``torch.load(..., weights_only=True)``.
        """
        return {key: copy.deepcopy(value) for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict`; it replaces the configuration too.

        A state saved before ``base_values`` was renamed ``base_lr_values`` loads too.

        Args:
            state_dict: A state returned by :meth:`state_dict`.
        """
        state = copy.deepcopy(dict(state_dict))
        if "base_values" in state:
            state.setdefault("base_lr_values", state.pop("base_values"))
        state.pop("num_updates", None)  # derived from the counter, never an attribute
        self.__dict__.update(state)


class StatefulSchedulerBase(SchedulerBase):
    """A scheduler that counts the optimizer updates itself: call :meth:`step` after each one.

    Once the whole constructor has returned it applies ``get_updated_values(0)``, so the first
    update already uses the schedule's starting value (e.g. the warm-up start). A subclass may
    set the attributes that :meth:`get_updated_values` reads before or after
    ``super().__init__``.

    The update counter is part of :meth:`state_dict` (as ``num_updates``, the number of completed
    updates, and ``_num_updates``), and :meth:`load_state_dict` re-applies the values for the
    restored counter, so a restored scheduler continues exactly where it stopped.

    Args:
        optimizer: The optimizer whose param groups are updated.
        param_group_field: The param-group key to schedule.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, param_group_field: str = "lr") -> None:
        super().__init__(optimizer, param_group_field)
        self._num_updates = 0

    def _on_constructed(self) -> None:
        self.step_update(self._num_updates)

    @property
    def num_updates(self) -> int:
        """The number of times :meth:`step` has been called (restored by :meth:`load_state_dict`)."""
        return self._num_updates

    def state_dict(self) -> dict[str, Any]:
        """Return every attribute except the optimizer, and ``num_updates`` (completed updates)."""
        return {**super().state_dict(), "num_updates": self._num_updates}

    def step(self) -> None:
        """Count one optimizer update and set the values for the next one."""
        self._num_updates += 1
        self.step_update(self._num_updates)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict` and apply its values to the optimizer.

        Args:
            state_dict: A state returned by :meth:`state_dict`.

        Raises:
            ValueError: If ``state_dict`` has no update counter.
        """
        if "_num_updates" not in state_dict:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict got a state without '_num_updates' (keys: "
                f"{sorted(state_dict)}); pass a state returned by {type(self).__name__}.state_dict()."
            )
        super().load_state_dict(state_dict)
        self.step_update(self._num_updates)


def warn_configuration_only(scheduler: StatefulSchedulerBase, what: str) -> None:
    """Warn that a loaded state held no update counter, so the current one is kept."""
    warnings.warn(
        f"{type(scheduler).__name__}.load_state_dict: the state is {what}, which holds the "
        f"configuration but no update counter; the counter stays at {scheduler.num_updates}. "
        "Save the scheduler again with this version to record its position.",
        stacklevel=3,
    )


def _check_field(group: dict[str, Any], index: int, field: str) -> None:
    if field not in group:
        keys = sorted(key for key in group if key != "params")
        raise ValueError(
            f"param_group_field={field!r} is not a key of optimizer param group {index}; "
            f"its keys are {keys}. Pass one of these, e.g. 'lr' or 'weight_decay'."
        )
    value = group[field]
    if not (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        or isinstance(value, torch.Tensor)
        and value.numel() == 1
    ):
        raise TypeError(
            f"param_group_field={field!r} holds {value!r} in optimizer param group {index}, which "
            "is not a number; only numeric fields such as 'lr' or 'weight_decay' can be scheduled."
        )


def _as_float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an ``int`` if it is a whole number of at least ``minimum``.

    Raises:
        TypeError: If ``value`` is an unresolved placeholder.
        ValueError: If ``value`` is not a whole number >= ``minimum`` (floats and bools included).
    """
    if is_placeholder(value):
        raise TypeError(
            f"{name} is the placeholder {value}, which only the Trainer can resolve; use "
            "create_scheduler_fn(...) and pass it to trainer.train(create_scheduler_fn=...), or "
            "pass an int."
        )
    return check_whole_number(value, name, minimum=minimum)


def check_non_negative(name: str, value: Any) -> float:
    """Return ``value`` as a ``float`` if it is a number ``>= 0``.

    Raises:
        TypeError: If ``value`` is not a real number.
        ValueError: If ``value`` is negative.
    """
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r}.")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}; pass 0 or a positive number.")
    return float(value)
