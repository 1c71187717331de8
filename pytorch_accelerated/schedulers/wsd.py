"""Warmup-stable-decay (WSD) learning rates, with a decay before each of several checkpoints."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import torch

from .._internal.argument_checks import check_whole_number
from ..placeholders import TrainerPlaceholderValues, is_placeholder
from .base import SchedulerBase, StatefulSchedulerBase, check_int, check_non_negative, warn_configuration_only

# Attributes computed from the settings: recomputed, never taken from a loaded state.
_DERIVED = (
    "checkpoint_steps",
    "checkpoint_decay_info",
    "previous_checkpoint_step",
    "num_updates",
    "_num_updates",
)
# Private attributes of earlier versions of this class, dropped from a loaded state.
_STALE = ("_checkpoint_steps", "_decay_start_steps", "_warmup_end")
# What a continuation schedule keeps of its own when it loads a saved state: its length and flag.
_OWN_LENGTH = ("total_steps", "num_epochs", "num_update_steps_per_epoch", "num_warmup_steps")


class WSDLrScheduler(StatefulSchedulerBase):
    """Warm-up, then a stable peak learning rate, then a short decay before each checkpoint.

    The run has ``T = total_steps`` optimizer updates, given directly or as ``num_epochs *
    num_update_steps_per_epoch``. Checkpoint steps follow a geometric progression from 25% of the
    run to its end (see :func:`estimate_checkpoint_steps`): ``[T]`` for one checkpoint,
    ``[T/4, T/2, T]`` for three.

    The decay before checkpoint ``c_i`` lasts ``L_i = max(1, int(decay_phase_ratio * (c_i -
    c_{i-1})))`` updates (``c_{-1} = 0``) and starts at ``pre_decay_step = c_i - L_i``. For each
    param group, with ``peak`` its initial value and ``r = lr_min`` (a *ratio* of the peak), the
    value after ``t`` updates is:

    - ``t < num_warmup_steps``: ``warmup_starting_lr + (peak - warmup_starting_lr) * t / W``
      (the warm-up wins where it overlaps a decay);
    - in the decay before ``c_i`` (``pre_decay_step < t <= c_i``), with ``p = (t -
      pre_decay_step) / L_i``: ``peak * (r + (1 - r) * (1 - sqrt(p)))`` ("1-sqrt" cool-down,
      the default), or ``peak / (p / r + 1 - p)`` (``use_inverse_sqrt_decay=False``), so the
      value is ``peak * r`` exactly at every checkpoint step;
    - otherwise ``peak`` (stable), and ``peak * r`` after the last checkpoint.

    After an intermediate checkpoint the learning rate returns to the peak: the weights saved at
    that checkpoint are an annealed model for a shorter budget, and training goes on along the
    stable branch. Weights saved at a ``pre_decay_step`` have not been annealed; a later run
    continues from them with ``is_continuation_from_checkpoint=True``: it skips the warm-up, and
    :meth:`load_state_dict` takes the saved settings and peak but keeps its own length, so the
    continued run is a fresh stable phase at the saved peak with its own decay.

    Args:
        optimizer: The optimizer whose param groups are updated.
        num_epochs: The number of epochs of the run (with ``num_update_steps_per_epoch``).
        num_update_steps_per_epoch: The number of optimizer updates per epoch.
        total_steps: The number of optimizer updates of the run, instead of the two above.
        num_warmup_steps: The number of updates of linear warm-up; None for 1% of the run
            (``int(0.01 * total_steps)``).
        decay_phase_ratio: The length of each decay as a fraction of its period, in (0, 1].
        lr_min: The value at each checkpoint, as a ratio of each param group's peak (0.01 decays
            to 1% of the peak).
        warmup_starting_lr: The value the warm-up starts from.
        use_inverse_sqrt_decay: Decay as ``1 - sqrt(p)`` if True, as ``1 / (p / r + 1 - p)`` if
            False.
        num_checkpoints: The number of checkpoints, each preceded by a decay.
        is_continuation_from_checkpoint: Skip the warm-up; :meth:`load_state_dict` then keeps
            this schedule's length and its update counter.

    Raises:
        TypeError: If a step or epoch count is not an int.
        ValueError: If the run length is given both ways or neither, a value is out of range, or
            there are more checkpoints than the run has distinct steps for.

    Examples:
        >>> optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        >>> scheduler = WSDLrScheduler(optimizer, total_steps=1000, num_checkpoints=3)
        >>> scheduler.get_checkpoint_steps()
        [250, 500, 1000]
        >>> scheduler.get_decay_start_steps()
        [225, 475, 950]
        >>> scheduler.get_phase_info(251)["pre_decay_step"]
        475
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        num_epochs: int | None = None,
        num_update_steps_per_epoch: int | None = None,
        total_steps: int | None = None,
        num_warmup_steps: int | None = 0,
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
        self.num_warmup_steps = _warmup_or_one_percent(num_warmup_steps, self.total_steps)
        self.decay_phase_ratio = _check_decay_phase_ratio(decay_phase_ratio)
        self.lr_min = check_non_negative("lr_min", lr_min)
        self.warmup_starting_lr = check_non_negative("warmup_starting_lr", warmup_starting_lr)
        self.use_inverse_sqrt_decay = bool(use_inverse_sqrt_decay)
        self.num_checkpoints = check_int("num_checkpoints", num_checkpoints, minimum=1)
        self.is_continuation_from_checkpoint = bool(is_continuation_from_checkpoint)
        self._set_up_periods()
        super().__init__(optimizer, param_group_field="lr")

    def _set_up_periods(self) -> None:
        self.checkpoint_steps = estimate_checkpoint_steps(self.total_steps, self.num_checkpoints)
        self.checkpoint_decay_info = _decay_info(self.checkpoint_steps, self.decay_phase_ratio)

    @property
    def _warmup_end(self) -> int:
        return 0 if self.is_continuation_from_checkpoint else self.num_warmup_steps

    # ------------------------------------------------------------------ values

    def get_updated_values(self, num_updates: int) -> list[float | None]:
        """Return each param group's learning rate after ``num_updates`` optimizer updates."""
        return [self._value(num_updates, peak) for peak in self.base_lr_values]

    def _value(self, t: int, peak: float) -> float:
        if t < self._warmup_end:
            return self.warmup_starting_lr + (peak - self.warmup_starting_lr) * t / self._warmup_end
        if t >= self.total_steps:
            return peak * self.lr_min
        period = self.checkpoint_decay_info[self._period_index(t)]
        start, end = period["pre_decay_step"], period["period_end"]
        return (
            peak
            if t <= start
            else _decayed(peak, self.lr_min, (t - start) / (end - start), self.use_inverse_sqrt_decay)
        )

    def _period_index(self, t: int) -> int:
        """The first period whose end is at or after ``t``; the last one beyond the run."""
        return next(
            (index for index, info in enumerate(self.checkpoint_decay_info) if info["period_end"] >= t),
            len(self.checkpoint_decay_info) - 1,
        )

    # ------------------------------------------------------------------ introspection

    def get_checkpoint_steps(self) -> list[int]:
        """Return the update counts at which each decay reaches its minimum, in increasing order."""
        return list(self.checkpoint_steps)

    def get_decay_start_steps(self) -> list[int]:
        """Return each period's ``pre_decay_step``: the last update count of the stable branch."""
        return [info["pre_decay_step"] for info in self.checkpoint_decay_info]

    def get_decay_info(self) -> list[dict[str, int]]:
        """Return one dict per period: ``period_start``, ``period_end``, ``decay_steps``, ``pre_decay_step``."""
        return [dict(info) for info in self.checkpoint_decay_info]

    def get_current_step(self) -> int:
        """Return the number of completed updates (0.1.61 counted from -1)."""
        return self._num_updates

    def get_current_phase_info(self) -> dict[str, Any]:
        """Return :meth:`get_phase_info` for the number of completed updates."""
        return self.get_phase_info(self._num_updates)

    @property
    def previous_checkpoint_step(self) -> int | None:
        """None until the first decay starts, then the ``pre_decay_step - 1`` of the latest one."""
        return next(
            (
                info["pre_decay_step"] - 1
                for info in reversed(self.checkpoint_decay_info)
                if self._num_updates >= info["pre_decay_step"]
            ),
            None,
        )

    def get_phase_info(self, num_updates: int) -> dict[str, Any]:
        """Describe the period that ``num_updates`` completed updates are in.

        Args:
            num_updates: An update count >= 0; beyond ``total_steps`` the last period is described.

        Returns:
            The first entry of :meth:`get_decay_info` whose ``period_end >= num_updates`` (keys
            ``period_start``, ``period_end``, ``decay_steps``, ``pre_decay_step``), with ``phase``
            ("warmup", "stable" or "decay"), ``checkpoint_index``, ``checkpoint_step`` (=
            ``period_end``), ``steps_until_checkpoint`` (0 beyond the end), ``decay_start_step``
            (= ``pre_decay_step``), ``is_decay_phase`` and ``is_checkpoint_step``.

        Raises:
            ValueError: If ``num_updates`` is not a whole number >= 0.
        """
        step = check_int("step", num_updates, minimum=0)
        index = self._period_index(step)
        info = self.checkpoint_decay_info[index]
        phase = (
            "warmup" if step < self._warmup_end else "decay" if step > info["pre_decay_step"] else "stable"
        )
        return {
            **info,
            "phase": phase,
            "checkpoint_index": index,
            "checkpoint_step": info["period_end"],
            "steps_until_checkpoint": max(0, info["period_end"] - step),
            "decay_start_step": info["pre_decay_step"],
            "is_decay_phase": phase == "decay",
            "is_checkpoint_step": step == info["period_end"],
        }

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Return every attribute except the optimizer, ``num_updates`` and ``previous_checkpoint_step``."""
        return {**super().state_dict(), "previous_checkpoint_step": self.previous_checkpoint_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state of this version or of pytorch-accelerated 0.1.61, then apply its values.

        - A schedule built with ``is_continuation_from_checkpoint=True`` takes the saved settings
          and peak (``base_lr_values``) but keeps its own length, its flag and its counter: the
          continued run is a fresh stable phase at the saved peak, with its own decay.
        - Otherwise a state of this version restores everything, update counter included; a
          0.1.61 state (no counter) restores the settings, keeps the counter and warns.

        Args:
            state_dict: A state returned by :meth:`state_dict`, of this version or of 0.1.61.

        Raises:
            ValueError: If ``state_dict`` is not a WSD scheduler state.
        """
        if "total_steps" not in state_dict or "decay_phase_ratio" not in state_dict:
            raise ValueError(
                f"WSDLrScheduler.load_state_dict got a state that is not a WSD scheduler's (keys: "
                f"{sorted(state_dict)}); pass a state returned by WSDLrScheduler.state_dict()."
            )
        continuation = self.is_continuation_from_checkpoint
        state = {key: value for key, value in state_dict.items() if key not in (*_STALE, *_DERIVED)}
        if continuation:
            state.update(
                {key: getattr(self, key) for key in (*_OWN_LENGTH, "is_continuation_from_checkpoint")}
            )
        SchedulerBase.load_state_dict(self, state)  # the settings only: the counter is handled here
        self._set_up_periods()
        if "_num_updates" in state_dict and not continuation:
            self._num_updates = int(state_dict["_num_updates"])
        elif not continuation:
            warn_configuration_only(self, "one of pytorch-accelerated 0.1.61")
        self.step_update(self._num_updates)

    # ------------------------------------------------------------------ factory

    @classmethod
    def create_scheduler_fn(
        cls,
        total_num_epochs: Any = TrainerPlaceholderValues.NUM_EPOCHS,
        num_update_steps_per_epoch: Any = TrainerPlaceholderValues.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH,
        num_warmup_epochs: float | None = None,
        decay_phase_ratio: float = 0.1,
        lr_min: float = 1e-6,
        warmup_starting_lr: float = 1e-6,
        use_inverse_sqrt_decay: bool = True,
        num_checkpoints: int = 1,
        is_continuation_from_checkpoint: bool = False,
        *,
        num_epochs: Any = None,
        total_steps: int | None = None,
        num_warmup_steps: int | None = None,
    ) -> functools.partial[WSDLrScheduler]:
        """Return a factory ``f(optimizer) -> WSDLrScheduler`` for ``trainer.train``.

        The parameters, their order and defaults are those of pytorch-accelerated 0.1.61: the run
        length defaults to placeholders that the Trainer replaces with the run's real values,
        and the warm-up is ``num_warmup_epochs`` epochs of updates (None: 1% of the run). The
        keyword-only ``num_epochs`` (for ``total_num_epochs``), ``total_steps`` (instead of the
        epochs) and ``num_warmup_steps`` (for ``num_warmup_epochs``) are this version's names.
        The other arguments are those of :class:`WSDLrScheduler`.

        Raises:
            ValueError: If a value is given under both its names, or ``total_steps`` with an
                epoch count or a number of updates per epoch.
        """
        return functools.partial(
            cls,
            **_run_length(total_num_epochs, num_update_steps_per_epoch, num_epochs, total_steps),
            num_warmup_steps=_warmup_steps(num_warmup_epochs, num_warmup_steps, num_update_steps_per_epoch),
            decay_phase_ratio=decay_phase_ratio,
            lr_min=lr_min,
            warmup_starting_lr=warmup_starting_lr,
            use_inverse_sqrt_decay=use_inverse_sqrt_decay,
            num_checkpoints=num_checkpoints,
            is_continuation_from_checkpoint=is_continuation_from_checkpoint,
        )


def estimate_checkpoint_steps(total_steps: int, num_checkpoints: int = 3) -> list[int]:
    """Return the checkpoint steps of a WSD schedule of ``total_steps`` updates.

    One checkpoint is ``[total_steps]``; ``n >= 2`` are ``total_steps * 0.25 * 4 ** (i / (n -
    1))`` for ``i = 0..n-1``, rounded half up, so they run from a quarter of the run to its end.

    >>> estimate_checkpoint_steps(1000)
    [250, 500, 1000]
    >>> estimate_checkpoint_steps(1000, num_checkpoints=4)
    [250, 397, 630, 1000]

    Raises:
        ValueError: If a count is not a whole number >= 1, or the steps would not be distinct.
    """
    total_steps = check_int("total_steps", total_steps, minimum=1)
    num_checkpoints = check_int("num_checkpoints", num_checkpoints, minimum=1)
    if num_checkpoints == 1:
        return [total_steps]
    last = num_checkpoints - 1
    # Rounded half up (math.floor(x + 0.5)): Python's round() rounds halves to even (round(2.5) == 2).
    steps = [math.floor(total_steps * 0.25 * 4 ** (i / last) + 0.5) for i in range(last)] + [total_steps]
    if steps[0] < 1 or any(a >= b for a, b in zip(steps, steps[1:], strict=False)):
        raise ValueError(
            f"num_checkpoints={num_checkpoints} is too many for total_steps={total_steps}: the "
            f"checkpoint steps {steps} are not distinct positive steps; use fewer checkpoints "
            "or a longer run."
        )
    return steps


def _decay_info(checkpoint_steps: list[int], ratio: float) -> list[dict[str, int]]:
    """One entry per period: it starts at the previous checkpoint and decays for its last part."""
    periods = zip([0, *checkpoint_steps], checkpoint_steps, strict=False)
    return [
        {"period_start": start, "period_end": end, "decay_steps": decay, "pre_decay_step": end - decay}
        for start, end, decay in ((start, end, max(1, int(ratio * (end - start)))) for start, end in periods)
    ]


def _decayed(peak: float, ratio: float, progress: float, use_inverse_sqrt_decay: bool) -> float:
    if progress >= 1:  # exactly the minimum at the checkpoint step
        return peak * ratio
    if use_inverse_sqrt_decay:
        return peak * (ratio + (1 - ratio) * (1 - math.sqrt(progress)))
    if ratio == 0:
        return peak if progress == 0 else 0.0
    return peak / (progress / ratio + 1 - progress)


def _run_length(
    total_num_epochs: Any, steps_per_epoch: Any, num_epochs: Any, total_steps: Any
) -> dict[str, Any]:
    """The run-length keywords of the scheduler, from both versions' names; ValueError on a clash."""
    epochs_given = total_num_epochs is not TrainerPlaceholderValues.NUM_EPOCHS
    if num_epochs is not None and epochs_given:
        raise ValueError(
            f"Give the number of epochs once: total_num_epochs={total_num_epochs!r} (0.1.61's name) "
            f"or num_epochs={num_epochs!r}, not both."
        )
    epochs = num_epochs if num_epochs is not None else total_num_epochs
    if total_steps is None:
        return {"num_epochs": epochs, "num_update_steps_per_epoch": steps_per_epoch, "total_steps": None}
    if num_epochs is not None or epochs_given or not is_placeholder(steps_per_epoch):
        raise ValueError(
            f"Give the run length either as total_steps={total_steps!r} or as the number of epochs "
            f"and num_update_steps_per_epoch, not both; got epochs={epochs!r}, "
            f"num_update_steps_per_epoch={steps_per_epoch!r}. Drop one of them."
        )
    return {"num_epochs": None, "num_update_steps_per_epoch": None, "total_steps": total_steps}


def _warmup_steps(num_warmup_epochs: Any, num_warmup_steps: Any, steps_per_epoch: Any) -> Any:
    """The warm-up in updates: steps, or epochs of updates; None (1% of the run) if neither."""
    if num_warmup_epochs is not None and num_warmup_steps is not None:
        raise ValueError(
            f"Give the warm-up once: num_warmup_epochs={num_warmup_epochs!r} (0.1.61's name) or "
            f"num_warmup_steps={num_warmup_steps!r}, not both."
        )
    if num_warmup_epochs is None:
        return num_warmup_steps
    warmup = steps_per_epoch * num_warmup_epochs
    return warmup.as_int() if is_placeholder(steps_per_epoch) else int(warmup)


def _warmup_or_one_percent(num_warmup_steps: Any, total_steps: int) -> int:
    if num_warmup_steps is None:  # 0.1.61's default: 1% of the run
        return int(0.01 * total_steps)
    if is_placeholder(num_warmup_steps):
        check_int("num_warmup_steps", num_warmup_steps, minimum=0)  # raises, naming the placeholder
    return int(check_whole_number(num_warmup_steps, "num_warmup_steps", minimum=0, optional=True))


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
    return check_int("num_epochs", num_epochs, minimum=1) * check_int(
        "num_update_steps_per_epoch", num_update_steps_per_epoch, minimum=1
    )


def _check_decay_phase_ratio(value: Any) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"decay_phase_ratio must be a number in (0, 1], got {value!r}.")
    if not 0 < float(value) <= 1:
        raise ValueError(
            f"decay_phase_ratio must be in (0, 1], got {value}; e.g. 0.1 decays over the last 10% "
            "of each period between checkpoints."
        )
    return float(value)
