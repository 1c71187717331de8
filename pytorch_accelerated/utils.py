"""Small utilities: process decorators, data-loader slicing, padding helpers, the model EMA."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from copy import deepcopy
from types import TracebackType
from typing import Any, TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import compile_regions as _accelerate_compile_regions
from accelerate.utils import extract_model_from_parallel, is_compiled_module
from torch import nn

from ._internal.argument_checks import check_whole_number
from ._internal.distributed import strip_padding
from .data import worker_init_fn

__all__ = [
    "local_process_zero_only",
    "local_process_zero_first",
    "world_process_zero_only",
    "ModelEma",
    "LimitBatches",
    "DataLoaderSlice",
    "worker_init_fn",
    "remove_padding",
    "compile_regions",
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
    """The first ``slice_size`` batches of a data loader, as an iterable with a length.

    Args:
        dl: The data loader (any iterable with a length).
        slice_size: How many batches to take, >= 0; None takes them all. ``len()`` is the
            number of batches the slice really yields: ``min(len(dl), slice_size)``.
        num_batches: Another name for ``slice_size`` (give one or the other). Both names are
            attributes too, kept equal.

    Raises:
        ValueError: If the size is not a whole number >= 0, or the two names disagree.

    >>> batches = DataLoaderSlice(range(10), slice_size=3)
    >>> list(batches), len(batches), batches.num_batches
    ([0, 1, 2], 3, 3)
    """

    def __init__(self, dl: Any, slice_size: int | None = None, *, num_batches: int | None = None) -> None:
        if slice_size is not None and num_batches is not None and slice_size != num_batches:
            raise ValueError(
                f"DataLoaderSlice got slice_size={slice_size!r} and num_batches={num_batches!r}: they "
                f"are two names for the same number of batches, so give only one of them."
            )
        name = "slice_size" if slice_size is not None else "num_batches"
        self.slice_size = slice_size if slice_size is not None else num_batches
        check_whole_number(self.slice_size, name, minimum=0, optional=True, owner="DataLoaderSlice")
        self.dl = dl

    @property
    def num_batches(self) -> int | None:
        """Another name for :attr:`slice_size`."""
        return self.slice_size

    @num_batches.setter
    def num_batches(self, value: int | None) -> None:
        self.slice_size = value

    def __len__(self) -> int:
        return len(self.dl) if self.slice_size is None else min(len(self.dl), self.slice_size)

    def __iter__(self) -> Iterator[Any]:
        if self.slice_size == 0:  # without starting the loader
            return
        # islice stops before the loader fetches one batch too many.
        yield from itertools.islice(self.dl, self.slice_size)

    def __getattr__(self, name: str) -> Any:
        # Reached only for attributes this class lacks: behave like the wrapped data loader.
        if name in ("dl", "slice_size"):  # not set yet: the constructor has not finished
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
        check_whole_number(num_batches, "num_batches", owner="LimitBatches")
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
    return strip_padding(padded_tensor, pad_value)


def compile_regions(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """Compile ``model`` block by block (regional compilation) and return the model to train.

    Each ``nn.ModuleList`` whose modules are all of one class (the repeated blocks of a
    transformer) has its blocks compiled one by one with ``torch.compile(**compile_kwargs)``:
    identical blocks share one compiled graph, so the model compiles about as fast as one
    block, where compiling the whole model traces every block. The other parts of the model
    are compiled one by one too; a model without repeated blocks is compiled whole. This is
    accelerate's ``accelerate.utils.compile_regions`` (the same as ``accelerate launch
    --dynamo_use_regional_compilation``), checked here first.

    Pass the result to the Trainer as the model. Checkpoints and training states hold the plain
    model's keys (no ``_orig_mod.``), so they load into the uncompiled model and back, and
    ``trainer.get_model(keep_torch_compile=False)`` returns the plain model. See
    docs/recipes/compile.md.

    Args:
        model: The plain (not yet compiled) model.
        **compile_kwargs: Passed to ``torch.compile``: ``backend``, ``mode``, ``dynamic``, ...

    Raises:
        ValueError: If ``model`` was already compiled with ``torch.compile``.
    """
    if is_compiled_module(model) or "_orig_mod" in model.__dict__:
        raise ValueError(
            f"compile_regions was given a model that is already compiled ({type(model).__name__}); pass the "
            f"plain model instead: compile it either whole with torch.compile or by regions, not both."
        )
    return _accelerate_compile_regions(model, **compile_kwargs)


class ModelEma(nn.Module):
    """Keeps an exponential moving average copy of a model.

    After each :meth:`update`, every floating-point parameter and buffer of the copy becomes
    ``decay * ema + (1 - decay) * current``. Integer and boolean buffers, such as batch norm's
    ``num_batches_tracked``, are counts rather than estimates, so they are copied instead. A
    subclass may override :meth:`update_fn` to average differently.

    The copy (``self.module``) is in eval mode, does not require gradients, and starts on the same
    device as the model; move it with ``to()`` like any module. ``state_dict()`` keys are those of
    the model prefixed with ``"module."``; use ``ema.module.state_dict()`` for a checkpoint that
    loads straight into the bare model.

    Args:
        model: The model to average. A model wrapped by DistributedDataParallel or
            ``torch.compile`` is unwrapped, and the copy is of the plain model.
        decay: The weight kept by the average at each update, in [0, 1]. With one update per
            optimizer step, the average covers roughly the last ``1 / (1 - decay)`` steps.

    Raises:
        ValueError: If ``decay`` is not a number in [0, 1].

    Examples:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> _ = torch.nn.init.zeros_(model.bias)
        >>> ema = ModelEma(model, decay=0.9)
        >>> _ = torch.nn.init.ones_(model.bias)  # as if an optimizer step had moved it
        >>> ema.update(model)  # 0.9 * 0.0 + 0.1 * 1.0
        >>> round(ema.module.bias.item(), 4)
        0.1
    """

    def __init__(self, model: nn.Module, decay: float = 0.9999) -> None:
        super().__init__()
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay <= 1:
            raise ValueError(
                f"ModelEma decay must be a number in [0, 1], but got {decay!r}. Values close to 1, "
                f"such as 0.999 or 0.9999, are usual; the average covers about 1 / (1 - decay) updates."
            )
        self.decay = float(decay)
        self.module = deepcopy(_unwrap(model)).eval().requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Moves the average towards the model's current weights: call it after each optimizer step.

        Raises:
            ValueError: If the model's parameters or buffers do not match the average's.
        """
        pairs = self._paired_tensors(model)
        for ema_tensor, tensor in pairs:
            if (
                not ema_tensor.is_floating_point()
            ):  # counts such as num_batches_tracked: an average means nothing
                ema_tensor.copy_(tensor)
        ema_floats = [ema_tensor for ema_tensor, _ in pairs if ema_tensor.is_floating_point()]
        floats = [
            tensor.to(device=ema.device, dtype=ema.dtype) for ema, tensor in pairs if ema.is_floating_point()
        ]
        if type(self).update_fn is not ModelEma.update_fn:  # a subclass's own average
            for ema_tensor, tensor in zip(ema_floats, floats, strict=True):
                ema_tensor.copy_(self.update_fn(ema_tensor, tensor))
        elif ema_floats:
            # lerp(ema, current, 1 - decay) == decay * ema + (1 - decay) * current, in one fused pass.
            torch._foreach_lerp_(ema_floats, floats, 1.0 - self.decay)

    def update_fn(self, ema_model_weights: torch.Tensor, updated_model_weights: torch.Tensor) -> torch.Tensor:
        """Returns the new average of one tensor: ``decay * ema + (1 - decay) * updated``.

        Override it to average differently (pytorch-accelerated 0.1.61's hook): :meth:`update`
        then calls it for every floating-point parameter and buffer, with the model's tensor
        already on the average's device and dtype, and stores what it returns. Integer and
        boolean buffers are still copied. Without an override, :meth:`update` applies this
        formula to every tensor at once.
        """
        return self.decay * ema_model_weights + (1.0 - self.decay) * updated_model_weights

    @torch.no_grad()
    def set(self, model: nn.Module) -> None:
        """Copies the model's current parameters and buffers into the average exactly.

        Raises:
            ValueError: If the model's parameters or buffers do not match the average's.
        """
        for ema_tensor, tensor in self._paired_tensors(model):
            ema_tensor.copy_(tensor)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the averaged model."""
        return self.module(*args, **kwargs)

    def _paired_tensors(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Pairs each tensor of the average with the model's tensor of the same name."""
        ema_named, source_named = (
            dict([*module.named_parameters(), *module.named_buffers()])
            for module in (self.module, _unwrap(model))
        )
        if list(ema_named) != list(source_named):
            missing = sorted(ema_named.keys() - source_named.keys())
            unexpected = sorted(source_named.keys() - ema_named.keys())
            raise ValueError(
                f"ModelEma was given a model whose parameters and buffers differ from the averaged "
                f"copy's (missing: {missing[:5]}, unexpected: {unexpected[:5]}). Pass the same "
                f"model that the ModelEma was created from."
            )
        return list(zip(ema_named.values(), source_named.values(), strict=True))


def _unwrap(model: nn.Module) -> nn.Module:
    """Returns the plain model inside a DistributedDataParallel, DataParallel or compiled wrapper."""
    return extract_model_from_parallel(model, keep_torch_compile=False)
