"""Placeholders for values that are only known once a training run has started.

A scheduler factory is usually written before the data loaders exist, so the number of
optimizer steps per epoch is not known yet. Put a :class:`TrainerPlaceholderValues` member
(optionally with ``* k`` or ``+ k``) in the keyword arguments of a ``functools.partial`` and
the Trainer replaces it with the run's real value when it creates the scheduler::

    create_scheduler_fn = functools.partial(
        torch.optim.lr_scheduler.OneCycleLR,
        max_lr=0.1,
        epochs=TrainerPlaceholderValues.NUM_EPOCHS,
        steps_per_epoch=TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH,
    )

Values are resolved by attribute lookup on the trainer; nothing is ever ``eval``-ed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .run_config import TrainerRunConfig


class RunWithLoaders(Protocol):
    """What placeholders are resolved from: a run's config and its prepared loaders (a Trainer)."""

    @property
    def run_config(self) -> TrainerRunConfig | None: ...

    @property
    def train_dataloader(self) -> Any: ...

    @property
    def eval_dataloader(self) -> Any: ...


class _Arithmetic:
    """``* k`` and ``+ k`` (either side) of a placeholder or an expression; ``-`` is refused."""

    def _then(self, op: str, operand: Any) -> _Expression:
        raise NotImplementedError

    def __mul__(self, other: Any) -> _Expression:
        return self._then("*", other)

    def __add__(self, other: Any) -> _Expression:
        return self._then("+", other)

    __rmul__ = __mul__
    __radd__ = __add__

    def __sub__(self, other: Any) -> _Expression:
        raise NotImplementedError(
            "Placeholders support only `* k` and `+ k` (as in pytorch-accelerated 0.1.61), not `-`; "
            "write `placeholder + (-k)` to subtract k."
        )

    __rsub__ = __sub__


class _Expression(_Arithmetic):
    """A placeholder with arithmetic applied to it, e.g. ``NUM_EPOCHS * 2 + 1``."""

    def __init__(self, placeholder: TrainerPlaceholderValues, ops: tuple[tuple[str, Any], ...] = ()):
        self.placeholder = placeholder
        self.ops = ops

    @property
    def name(self) -> str:
        """The name of the placeholder the expression starts from, e.g. ``"NUM_EPOCHS"``."""
        return self.placeholder.name

    def _then(self, op: str, operand: Any) -> _Expression:
        return _Expression(self.placeholder, (*self.ops, (op, operand)))

    def as_int(self) -> _Expression:
        """Return this expression truncated to an ``int`` once resolved (``int(value)``)."""
        return self._then("int", None)

    def resolve(self, trainer: RunWithLoaders) -> Any:
        value = self.placeholder.resolve(trainer)
        for op, operand in self.ops:
            operand = operand.resolve(trainer) if is_placeholder(operand) else operand
            value = int(value) if op == "int" else value * operand if op == "*" else value + operand
        return value

    def __repr__(self) -> str:
        text = str(self.placeholder)
        for op, operand in self.ops:
            text = f"int({text})" if op == "int" else f"{text} {op} {operand!r}"
        return text


def _unknown_length(placeholder: str, what: str) -> ValueError:
    return ValueError(
        f"TrainerPlaceholderValues.{placeholder} is not known for this run: the {what} data set is "
        f"a stream (an IterableDataset without __len__), so its number of batches per epoch is "
        f"unknown. Give the scheduler its length in optimizer updates directly (e.g. the "
        f"max_num_train_steps you pass to train()), or give the data set a __len__."
    )


def _dataloader_len(placeholder: str, loader: str, what: str) -> Callable[[Any], int]:
    def get(trainer: RunWithLoaders) -> int:
        try:
            return len(getattr(trainer, loader))
        except TypeError:
            raise _unknown_length(placeholder, what) from None

    return get


def _run_config_field(name: str, placeholder: str) -> Callable[[Any], Any]:
    def get(trainer: RunWithLoaders) -> Any:
        config = trainer.run_config
        if getattr(config, "num_update_steps_per_epoch", 0) is None and (
            name != "num_epochs" or getattr(config, "max_num_train_steps", None) is not None
        ):
            raise _unknown_length(placeholder, "training")
        return getattr(config, name)

    return get


_RESOLVERS: dict[str, Callable[[Any], Any]] = {
    "NUM_EPOCHS": _run_config_field("num_epochs", "NUM_EPOCHS"),
    "NUM_UPDATE_STEPS_PER_EPOCH": _run_config_field(
        "num_update_steps_per_epoch", "NUM_UPDATE_STEPS_PER_EPOCH"
    ),
    "PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH": _run_config_field(
        "num_local_update_steps_per_epoch", "PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH"
    ),
    "TRAIN_DATALOADER_LEN": _dataloader_len("TRAIN_DATALOADER_LEN", "train_dataloader", "training"),
    "EVAL_DATALOADER_LEN": _dataloader_len("EVAL_DATALOADER_LEN", "eval_dataloader", "evaluation"),
}


class TrainerPlaceholderValues(_Arithmetic, Enum):
    """Values of a training run that are known only once ``train()`` has started.

    ``NUM_UPDATE_STEPS_PER_EPOCH`` counts optimizer updates, which happen on every process at
    once, so it is the same number on one process and on many (the original library multiplied
    it by the number of processes). ``PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH`` is kept for
    compatibility and has the same value. ``TRAIN_DATALOADER_LEN`` and ``EVAL_DATALOADER_LEN``
    are the number of batches each process sees per epoch.

    Over a training stream of unknown length (an ``IterableDataset`` without ``__len__``) the
    step counts are unknown (and so is ``NUM_EPOCHS`` with ``max_num_train_steps``): resolving
    them raises a ``ValueError`` that says so.

    ``placeholder * k`` and ``placeholder + k`` are expressions with the same ``.name`` as the
    placeholder; ``-`` raises ``NotImplementedError``, as in the original library. Members'
    values are plain names resolved by attribute lookup: nothing is ever ``eval``-ed.
    """

    NUM_EPOCHS = "num_epochs"
    NUM_UPDATE_STEPS_PER_EPOCH = "num_update_steps_per_epoch"
    PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH = "num_local_update_steps_per_epoch"
    TRAIN_DATALOADER_LEN = "train_dataloader_len"
    EVAL_DATALOADER_LEN = "eval_dataloader_len"

    def resolve(self, trainer: RunWithLoaders) -> Any:
        """Return this placeholder's value for ``trainer``'s current run."""
        return _RESOLVERS[self.name](trainer)

    @classmethod
    def placeholder_set(cls) -> set[str]:
        """Return the names of the placeholders, e.g. ``{"NUM_EPOCHS", ...}``."""
        return {member.name for member in cls}

    def _then(self, op: str, operand: Any) -> _Expression:
        return _Expression(self, ((op, operand),))


def is_placeholder(value: Any) -> bool:
    return isinstance(value, (TrainerPlaceholderValues, _Expression))


def replace_trainer_placeholder_values(trainer: RunWithLoaders, instance: Any) -> Any:
    """Return ``instance`` with every placeholder argument replaced by its value for ``trainer``.

    ``instance`` is a ``functools.partial`` (placeholders may be positional or keyword
    arguments); anything else is returned unchanged.
    """
    if not isinstance(instance, functools.partial):
        return instance
    args = tuple(value.resolve(trainer) if is_placeholder(value) else value for value in instance.args)
    keywords = {
        key: value.resolve(trainer) if is_placeholder(value) else value
        for key, value in instance.keywords.items()
    }
    return functools.partial(instance.func, *args, **keywords)
