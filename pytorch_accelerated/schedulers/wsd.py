"""Warmup-stable-decay (WSD) learning rates, with a decay before each of several checkpoints."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import torch

from ..placeholders import TrainerPlaceholderValues, is_placeholder
from .base import StatefulSchedulerBase, check_int, check_non_negative


class WSDLrScheduler(StatefulSchedulerBase):
    """Warm-up, then a stable peak learning rate, then a short decay before each checkpoint.

    The run has ``total_steps`` optimizer updates, given directly or as ``num_epochs *
    num_update_steps_per_epoch``. Checkpoint steps follow a geometric progression from 25% of the
    run to its end: one checkpoint is ``[total]``; ``n >= 2`` are ``total * 0.25 * 4 ** (i / (n -
    1))`` for ``i = 0..n-1`` rounded half up, e.g. ``[0.25, 0.5, 1.0] * total`` for ``n = 3``.

    Before checkpoint ``c`` there is a decay phase of ``L = max(1, round(decay_phase_ratio * c))``
    updates starting at ``s = c - L``. For each param group, with ``peak`` its initial value, the
    value after ``t`` updates is:

    - ``t < num_warmup_steps``: ``warmup_starting_lr + (peak - warmup_starting_lr) * t / W``;
    - in the decay before ``c`` (``s <= t <= c``), with ``p = (t - s) / L``:
      ``lr_min + (peak - lr_min) * (1 - sqrt(p))`` ("1-sqrt" cool-down, the default) or
      ``lr_min + (peak - lr_min) * (1 - p)`` (``use_inverse_sqrt_decay=False``), so the value is
      ``lr_min`` exactly at every checkpoint step;
    - otherwise ``peak`` (stable), and ``lr_min`` after the last checkpoint.

    After an intermediate checkpoint the learning rate returns to the peak: the weights saved at
    that checkpoint are an annealed model for a shorter budget, and training goes on along the
    stable branch. Weights saved at a decay start (:meth:`get_decay_start_steps`) have not been
    annealed; a later run continues from them with ``is_continuation_from_checkpoint=True``,
    which skips the warm-up and starts at the peak.

    Args:
        optimizer: The optimizer whose param groups are updated.
        num_epochs: The number of epochs of the run (with ``num_update_steps_per_epoch``).
        num_update_steps_per_epoch: The number of optimizer updates per epoch.
        total_steps: The number of optimizer updates of the run, instead of the two above.
        num_warmup_steps: The number of updates of linear warm-up.
        decay_phase_ratio: The length of each decay as a fraction of its checkpoint step, in (0, 1].
        lr_min: The value at each checkpoint.
        warmup_starting_lr: The value the warm-up starts from.
        use_inverse_sqrt_decay: Decay as ``1 - sqrt(p)`` if True, linearly if False.
        num_checkpoints: The number of checkpoints, each preceded by a decay.
        is_continuation_from_checkpoint: Skip the warm-up (``num_warmup_steps`` is ignored).

    Raises:
        TypeError: If a step or epoch count is not an int.
        ValueError: If the run length is given both ways or neither, a value is out of range, or
            a decay phase does not fit between the warm-up or the previous checkpoint and its own.

    Example:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> scheduler = WSDLrScheduler(optimizer, total_steps=1000, num_checkpoints=3)
        >>> scheduler.get_checkpoint_steps()
        [250, 500, 1000]
        >>> scheduler.get_decay_start_steps()
        [225, 450, 900]
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        num_epochs: int | None = None,
        num_update_steps_per_epoch: int | None = None,
        total_steps: int | None = None,
        num_warmup_steps: int = 0,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> None:
        self.total_steps = _total_steps(num_epochs, num_update_steps_per_epoch, total_steps)
        self.num_epochs = num_epochs
        self.num_update_steps_per_epoch = num_update_steps_per_epoch
        self.num_warmup_steps = check_int("num_warmup_steps", num_warmup_steps, minimum=0)
        self.decay_phase_ratio = _check_decay_phase_ratio(decay_phase_ratio)
        self.lr_min = check_non_negative("lr_min", lr_min)
        self.warmup_starting_lr = check_non_negative("warmup_starting_lr", warmup_starting_lr)
        self.use_inverse_sqrt_decay = bool(use_inverse_sqrt_decay)
        self.num_checkpoints = check_int("num_checkpoints", num_checkpoints, minimum=1)
        self.is_continuation_from_checkpoint = bool(is_continuation_from_checkpoint)
        self._warmup_end = 0 if self.is_continuation_from_checkpoint else self.num_warmup_steps
        self._checkpoint_steps = _checkpoint_steps(self.total_steps, self.num_checkpoints)
        self._decay_start_steps = [
            step - max(1, _round_half_up(self.decay_phase_ratio * step)) for step in self._checkpoint_steps
        ]
        self._check_decays_fit()
        super().__init__(optimizer, param_group_field="lr")

    def get_checkpoint_steps(self) -> list[int]:
        """Return the update counts at which each decay reaches ``lr_min``, in increasing order."""
        return list(self._checkpoint_steps)

    def get_decay_start_steps(self) -> list[int]:
        """Return the update counts at which each decay starts (the last stable-branch values)."""
        return list(self._decay_start_steps)

    def get_updated_values(self, num_updates: int) -> list[float]:
        """Return each param group's learning rate after ``num_updates`` optimizer updates."""
        return [self._value(num_updates, peak) for peak in self.base_values]

    def _value(self, t: int, peak: float) -> float:
        if t < self._warmup_end:
            return self.warmup_starting_lr + (peak - self.warmup_starting_lr) * t / self._warmup_end
        if t > self.total_steps:
            return self.lr_min
        index = self._checkpoint_index(t)
        start, end = self._decay_start_steps[index], self._checkpoint_steps[index]
        if t < start:
            return peak
        # At t == end the shape is exactly 0, so the value is exactly lr_min.
        progress = (t - start) / (end - start)
        shape = 1 - math.sqrt(progress) if self.use_inverse_sqrt_decay else 1 - progress
        return self.lr_min + (peak - self.lr_min) * shape

    def _checkpoint_index(self, t: int) -> int:
        return next(i for i, step in enumerate(self._checkpoint_steps) if t <= step)

    def get_phase_info(self, step: int) -> dict[str, Any]:
        """Describe where the schedule is after ``step`` optimizer updates.

        Args:
            step: An update count from 0 to ``total_steps``.

        Returns:
            A dict with ``phase`` ("warmup", "stable" or "decay"), ``checkpoint_index`` and
            ``checkpoint_step`` (the checkpoint the step is heading to, or is at),
            ``steps_until_checkpoint``, ``decay_start_step``, ``is_decay_phase`` and
            ``is_checkpoint_step``.

        Raises:
            ValueError: If ``step`` is outside ``[0, total_steps]``.
        """
        step = check_int("step", step, minimum=0)
        if step > self.total_steps:
            raise ValueError(
                f"step must be between 0 and total_steps={self.total_steps}, got {step}; the "
                "schedule stays at lr_min after its last checkpoint."
            )
        index = self._checkpoint_index(step)
        checkpoint_step = self._checkpoint_steps[index]
        if step < self._warmup_end:
            phase = "warmup"
        elif step >= self._decay_start_steps[index]:
            phase = "decay"
        else:
            phase = "stable"
        return {
            "phase": phase,
            "checkpoint_index": index,
            "checkpoint_step": checkpoint_step,
            "steps_until_checkpoint": checkpoint_step - step,
            "decay_start_step": self._decay_start_steps[index],
            "is_decay_phase": phase == "decay",
            "is_checkpoint_step": step == checkpoint_step,
        }

    def _check_decays_fit(self) -> None:
        fix = (
            f"use a smaller decay_phase_ratio (got {self.decay_phase_ratio}) or fewer "
            f"num_checkpoints (got {self.num_checkpoints})"
        )
        if self._decay_start_steps[0] < self._warmup_end:
            raise ValueError(
                f"The decay before checkpoint 0 (step {self._checkpoint_steps[0]}) would start at "
                f"step {self._decay_start_steps[0]}, before the warm-up ends at num_warmup_steps="
                f"{self.num_warmup_steps}; use fewer warm-up steps, or {fix}."
            )
        for index in range(1, self.num_checkpoints):
            start, previous = self._decay_start_steps[index], self._checkpoint_steps[index - 1]
            if start < previous:
                raise ValueError(
                    f"The decay before checkpoint {index} (step {self._checkpoint_steps[index]}) "
                    f"would start at step {start}, before the previous checkpoint at step "
                    f"{previous}; {fix}."
                )

    @classmethod
    def create_scheduler_fn(
        cls,
        num_epochs: Any = TrainerPlaceholderValues.NUM_EPOCHS,
        num_update_steps_per_epoch: Any = TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
        total_steps: int | None = None,
        num_warmup_steps: int = 0,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
    ) -> functools.partial[WSDLrScheduler]:
        """Return a factory ``f(optimizer) -> WSDLrScheduler`` for ``trainer.train``.

        The run length defaults to placeholders that the Trainer replaces with the run's real
        values. Given ``total_steps``, the placeholders for ``num_epochs`` and
        ``num_update_steps_per_epoch`` are dropped. The other arguments are those of
        :class:`WSDLrScheduler`.
        """
        if total_steps is not None:
            num_epochs = None if is_placeholder(num_epochs) else num_epochs
            if is_placeholder(num_update_steps_per_epoch):
                num_update_steps_per_epoch = None
        return functools.partial(
            cls,
            num_epochs=num_epochs,
            num_update_steps_per_epoch=num_update_steps_per_epoch,
            total_steps=total_steps,
            num_warmup_steps=num_warmup_steps,
            decay_phase_ratio=decay_phase_ratio,
            lr_min=lr_min,
            warmup_starting_lr=warmup_starting_lr,
            use_inverse_sqrt_decay=use_inverse_sqrt_decay,
            num_checkpoints=num_checkpoints,
            is_continuation_from_checkpoint=is_continuation_from_checkpoint,
        )


def _total_steps(num_epochs: Any, num_update_steps_per_epoch: Any, total_steps: Any) -> int:
    received = (
        f"got total_steps={total_steps!r}, num_epochs={num_epochs!r}, "
        f"num_update_steps_per_epoch={num_update_steps_per_epoch!r}"
    )
    if total_steps is not None:
        if num_epochs is not None or num_update_steps_per_epoch is not None:
            raise ValueError(
                "Give the run length either as total_steps or as num_epochs and "
                f"num_update_steps_per_epoch, not both; {received}. Drop one of them."
            )
        return check_int("total_steps", total_steps, minimum=1)
    if num_epochs is None or num_update_steps_per_epoch is None:
        raise ValueError(
            "Give the run length as total_steps, or as both num_epochs and "
            f"num_update_steps_per_epoch; {received}."
        )
    epochs = check_int("num_epochs", num_epochs, minimum=1)
    return epochs * check_int("num_update_steps_per_epoch", num_update_steps_per_epoch, minimum=1)


def _check_decay_phase_ratio(value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"decay_phase_ratio must be a number in (0, 1], got {value!r}.")
    if not 0 < float(value) <= 1:
        raise ValueError(
            f"decay_phase_ratio must be in (0, 1], got {value}; e.g. 0.1 decays over the last 10% "
            "of the steps before each checkpoint."
        )
    return float(value)


def _round_half_up(value: float) -> int:
    # Python's round() rounds halves to even (round(2.5) == 2); half up is what users expect.
    return math.floor(value + 0.5)


def _checkpoint_steps(total_steps: int, num_checkpoints: int) -> list[int]:
    if num_checkpoints == 1:
        return [total_steps]
    last = num_checkpoints - 1
    steps = [_round_half_up(total_steps * 0.25 * 4 ** (i / last)) for i in range(last)] + [total_steps]
    if steps[0] < 1 or any(a >= b for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(
            f"num_checkpoints={num_checkpoints} is too many for total_steps={total_steps}: the "
            f"checkpoint steps {steps} are not distinct positive steps; use fewer checkpoints "
            "or a longer run."
        )
    return steps
