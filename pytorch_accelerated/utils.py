"""Small utilities: process decorators, data-loader slicing, padding helpers."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, TypeVar

import torch
from accelerate import PartialState

from .data import worker_init_fn
from .ema import ModelEma

__all__ = [
    "local_process_zero_only",
    "local_process_zero_first",
    "world_process_zero_only",
    "ModelEma",
    "LimitBatches",
    "DataLoaderSlice",
    "worker_init_fn",
    "remove_padding",
]

F = TypeVar("F", bound=Callable[..., Any])


def _run_on(predicate: Callable[[PartialState], bool]) -> Callable[[F], F]:
    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state = PartialState()
            result = func(*args, **kwargs) if predicate(state) else None
            # Every rank calls the decorated function, so every rank reaches this barrier.
            state.wait_for_everyone()
            return result

        return wrapper  # type: ignore[return-value]

    return decorator


#: Run the function on the main process of each node only; every rank must call it (it ends
#: with a barrier). Other ranks get ``None``.
local_process_zero_only = _run_on(lambda state: state.is_local_main_process)

#: Run the function on the main process of the whole job only; every rank must call it (it
#: ends with a barrier). Other ranks get ``None``.
world_process_zero_only = _run_on(lambda state: state.is_main_process)


def local_process_zero_first(func: F) -> F:
    """Run the function on each node's main process first, then on the other processes.

    Useful for work that caches files (downloads, preprocessing). Every rank must call it.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with PartialState().local_main_process_first():
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class DataLoaderSlice:
    """The first ``num_batches`` batches of a data loader, as an iterable with a length."""

    def __init__(self, dl: Any, num_batches: int | None = None) -> None:
        if num_batches is not None and num_batches < 0:
            raise ValueError(f"num_batches must be >= 0 or None, got {num_batches}.")
        self.dl = dl
        self.num_batches = num_batches

    def __len__(self) -> int:
        length = len(self.dl)
        return length if self.num_batches is None else min(length, self.num_batches)

    def __iter__(self) -> Iterator[Any]:
        if self.num_batches == 0:
            return
        for index, batch in enumerate(self.dl, start=1):
            yield batch
            if index == self.num_batches:  # stop before the loader fetches one batch too many
                break

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes this class lacks: behave like the wrapped data loader.
        if name == "dl":
            raise AttributeError(name)
        return getattr(self.dl, name)


#: The environment variable set by :class:`LimitBatches`; honoured for compatibility with
#: scripts that set it themselves. The Trainer logs once when it takes effect.
LIMIT_BATCHES_ENV_VAR = "PT_ACC_LIMIT_BATCHES"


class LimitBatches:
    """Limit every Trainer created inside the ``with`` block to ``num_batches`` training and
    evaluation batches per epoch: a quick way to check that a script runs end to end.

    It sets the environment variable ``PT_ACC_LIMIT_BATCHES`` on entry and restores its
    previous value (or its absence) on exit; a Trainer created while it is set adds a
    :class:`~pytorch_accelerated.callbacks.LimitBatchesCallback` and says so in its log.

    >>> import os
    >>> with LimitBatches(2):
    ...     os.environ["PT_ACC_LIMIT_BATCHES"]
    '2'
    >>> "PT_ACC_LIMIT_BATCHES" in os.environ
    False
    """

    def __init__(self, num_batches: int) -> None:
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
            raise ValueError(f"LimitBatches needs num_batches >= 1 (an int), got {num_batches!r}.")
        self.num_batches = num_batches
        self._previous: list[str | None] = []

    def __enter__(self) -> LimitBatches:
        self._previous.append(os.environ.get(LIMIT_BATCHES_ENV_VAR))
        os.environ[LIMIT_BATCHES_ENV_VAR] = str(self.num_batches)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        previous = self._previous.pop()
        if previous is None:
            os.environ.pop(LIMIT_BATCHES_ENV_VAR, None)
        else:
            os.environ[LIMIT_BATCHES_ENV_VAR] = previous


def remove_padding(padded_tensor: torch.Tensor, pad_value: Any) -> torch.Tensor:
    """Remove padding added by ``trainer.gather(tensor, padding_value=...)``.

    For a 1-D tensor, every element equal to ``pad_value`` is dropped; for more dimensions,
    every row (along dim 0) whose elements all equal ``pad_value``.
    """
    if padded_tensor.dim() <= 1:
        return padded_tensor[padded_tensor != pad_value]
    is_padding = (padded_tensor == pad_value).flatten(1).all(dim=1)
    return padded_tensor[~is_padding]
