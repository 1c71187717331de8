"""Linear warm-up, then k-decay cosine annealing, then a flat cool-down."""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import torch

from ..placeholders import TrainerPlaceholderValues
from .base import StatefulSchedulerBase, check_int, check_non_negative

# The attribute names of pytorch-accelerated 0.1.61, and ours.
_ORIGINAL_NAMES = {
    "total_iterations": "total_steps",
    "warmup_iterations": "num_warmup_steps",
    "num_cooldown_iterations": "num_cooldown_steps",
    "warmup_lr_init": "warmup_starting_lr",
    "warmup_lr_ratio": "warmup_starting_lr_ratio",
    "lr_min_ratio": "min_lr_ratio",
}


def _alias(name: str) -> property:
    """A read-only attribute of 0.1.61's name for the attribute ``name``."""
    return property(operator.attrgetter(name), doc=f"``{name}`` (0.1.61's name).")


class CosineLrScheduler(StatefulSchedulerBase):
    """Linear warm-up, k-decay cosine annealing (Zhang et al. 2020), then a flat cool-down.

    With ``S = num_update_steps_per_epoch``, the run has ``T = total_num_epochs * S`` updates:
    ``W = num_warmup_epochs * S`` of warm-up, ``C = num_cooldown_epochs * S`` of cool-down and
    ``D = T - W - C`` of decay. For each param group, with ``lr_max`` its initial value, the value
    after ``t`` updates is:

    - ``t < W``: ``lr_start + (lr_max - lr_start) * t / W`` (linear warm-up);
    - ``W <= t < W + D``: ``lr_min + (lr_max - lr_min) * 0.5 * (1 + cos(pi * d**k / D**k))``
      with ``d = t - W``;
    - ``t >= W + D``: ``lr_min`` exactly (cool-down, and for ever after the run).

    ``k_decay=1`` is plain cosine annealing; ``k > 1`` keeps the value high for longer before
    decaying, ``k < 1`` decays sooner. Epoch counts are ints: the schedule changes at update
    granularity, so give fractional warm-ups as a larger ``total_num_epochs`` instead.

    The attribute names of pytorch-accelerated 0.1.61 read the same values: ``total_iterations``
    (``total_steps``), ``warmup_iterations`` (``num_warmup_steps``), ``num_cooldown_iterations``
    (``num_cooldown_steps``), ``warmup_lr_init`` (``warmup_starting_lr``), ``warmup_lr_ratio``
    (``warmup_starting_lr_ratio``) and ``lr_min_ratio`` (``min_lr_ratio``); and
    :meth:`load_state_dict` also loads a state saved by that version.

    Args:
        optimizer: The optimizer whose param groups are updated.
        total_num_epochs: The number of epochs of the run.
        num_update_steps_per_epoch: The number of optimizer updates per epoch.
        k_decay: The k of k-decay; must be > 0.
        lr_min: The value at the end of the decay, for every param group.
        min_lr_ratio: If given, each group decays to ``initial value * min_lr_ratio`` instead of
            ``lr_min``.
        num_warmup_epochs: The number of epochs of linear warm-up.
        warmup_starting_lr: The value the warm-up starts from, for every param group.
        warmup_starting_lr_ratio: If given, each group's warm-up starts from
            ``initial value * warmup_starting_lr_ratio`` instead of ``warmup_starting_lr``.
        num_cooldown_epochs: The number of epochs at ``lr_min`` at the end of the run.

    Raises:
        TypeError: If an epoch or step count is not an int.
        ValueError: If a count, value or ratio is out of range, or warm-up and cool-down leave no
            epoch to decay in.

    Examples:
        >>> model = torch.nn.Linear(2, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> scheduler = CosineLrScheduler(
        ...     optimizer, total_num_epochs=4, num_update_steps_per_epoch=10, lr_min=0.0,
        ...     num_warmup_epochs=1, warmup_starting_lr=0.0)
        >>> optimizer.param_groups[0]["lr"]
        0.0
        >>> for _ in range(40):
        ...     scheduler.step()
        >>> optimizer.param_groups[0]["lr"]
        0.0
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_num_epochs: int,
        num_update_steps_per_epoch: int,
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: int = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: int = 0,
    ) -> None:
        self.total_num_epochs = total_num_epochs = check_int("total_num_epochs", total_num_epochs, minimum=1)
        self.num_update_steps_per_epoch = steps_per_epoch = check_int(
            "num_update_steps_per_epoch", num_update_steps_per_epoch, minimum=1
        )
        num_warmup_epochs = check_int("num_warmup_epochs", num_warmup_epochs, minimum=0)
        num_cooldown_epochs = check_int("num_cooldown_epochs", num_cooldown_epochs, minimum=0)
        if num_warmup_epochs + num_cooldown_epochs >= total_num_epochs:
            raise ValueError(
                f"num_warmup_epochs={num_warmup_epochs} plus num_cooldown_epochs="
                f"{num_cooldown_epochs} must be less than total_num_epochs={total_num_epochs}, "
                "leaving at least one epoch to decay in; shorten the warm-up or the cool-down."
            )
        self.k_decay = check_non_negative("k_decay", k_decay)
        if self.k_decay == 0:
            raise ValueError("k_decay must be > 0, got 0; pass 1.0 for plain cosine annealing.")
        self.lr_min = check_non_negative("lr_min", lr_min)
        self.min_lr_ratio = _optional_ratio("min_lr_ratio", min_lr_ratio)
        self.warmup_starting_lr = check_non_negative("warmup_starting_lr", warmup_starting_lr)
        self.warmup_starting_lr_ratio = _optional_ratio("warmup_starting_lr_ratio", warmup_starting_lr_ratio)
        self.num_warmup_steps = num_warmup_epochs * steps_per_epoch
        self.num_cooldown_steps = num_cooldown_epochs * steps_per_epoch
        self.total_steps = total_num_epochs * steps_per_epoch
        self.num_decay_steps = self.total_steps - self.num_warmup_steps - self.num_cooldown_steps
        super().__init__(optimizer, param_group_field="lr")

    def get_updated_values(self, num_updates: int) -> list[float | None]:
        """Return each param group's learning rate after ``num_updates`` optimizer updates."""
        return [self._value(num_updates, lr_max) for lr_max in self.base_lr_values]

    total_iterations = _alias("total_steps")
    warmup_iterations = _alias("num_warmup_steps")
    num_cooldown_iterations = _alias("num_cooldown_steps")
    warmup_lr_init = _alias("warmup_starting_lr")
    warmup_lr_ratio = _alias("warmup_starting_lr_ratio")
    lr_min_ratio = _alias("min_lr_ratio")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state of this version, or one saved by pytorch-accelerated 0.1.61.

        A 0.1.61 state (``total_iterations``, ``warmup_iterations``, ..., ``num_updates``, the
        last counting from -1) sets the schedule from its settings and the counter to
        ``num_updates + 1`` completed updates (or to ``_num_updates`` when the state has one,
        e.g. set by a loader that knows the position), then applies that counter's values.

        Args:
            state_dict: A state returned by :meth:`state_dict`, of this version or of 0.1.61.

        Raises:
            ValueError: If ``state_dict`` is neither.
        """
        if "total_iterations" not in state_dict:
            super().load_state_dict(state_dict)
            return
        state = {_ORIGINAL_NAMES.get(key, key): value for key, value in state_dict.items()}
        state.setdefault("_num_updates", int(state.pop("num_updates", -1)) + 1)
        state["num_decay_steps"] = (
            state["total_steps"] - state["num_warmup_steps"] - state["num_cooldown_steps"]
        )
        super().load_state_dict(state)

    def _value(self, t: int, lr_max: float) -> float:
        if t < self.num_warmup_steps:
            lr_start = (
                lr_max * self.warmup_starting_lr_ratio
                if self.warmup_starting_lr_ratio is not None
                else self.warmup_starting_lr
            )
            return lr_start + (lr_max - lr_start) * t / self.num_warmup_steps
        lr_min = lr_max * self.min_lr_ratio if self.min_lr_ratio is not None else self.lr_min
        t_decay = t - self.num_warmup_steps
        # Return lr_min itself at and after the end of the decay, so the run ends on it exactly.
        if t_decay >= self.num_decay_steps:
            return lr_min
        return lr_min + (lr_max - lr_min) * 0.5 * (
            1 + math.cos(math.pi * ((t_decay / self.num_decay_steps) ** self.k_decay))
        )

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: Any = TrainerPlaceholderValues.NUM_EPOCHS,
        num_update_steps_per_epoch: Any = TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
        k_decay: float = 1.0,
        lr_min: float = 1e-6,
        min_lr_ratio: float | None = None,
        num_warmup_epochs: int = 0,
        warmup_starting_lr: float = 1e-6,
        warmup_starting_lr_ratio: float | None = None,
        num_cooldown_epochs: int = 0,
    ) -> functools.partial[CosineLrScheduler]:
        """Return a factory ``f(optimizer) -> CosineLrScheduler`` for ``trainer.train``.

        The run length defaults to placeholders that the Trainer replaces with the run's real
        values, so the schedule ends exactly when the run does. The other arguments are those of
        :class:`CosineLrScheduler`.
        """
        return functools.partial(cls, **{name: value for name, value in locals().items() if name != "cls"})


def _optional_ratio(name: str, value: float | None) -> float | None:
    return None if value is None else check_non_negative(name, value)
