"""Finite weights only: the check that every writer of weights makes before it writes.

A checkpoint holding NaN or infinite weights is worse than none: it looks like progress, and
rotation would delete the good states to make room for it. So every save (training states,
single-file checkpoints, and through them save-best, EMA, WSD and save-at-end) checks, at save
time, that the weights it is about to write and the training loss since the epoch began are
finite; when they are not, nothing is written and :class:`NonFiniteStateError` ends the run as
``TerminateOnNaNCallback`` would. Knows nothing of the Trainer beyond its public attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .._internal.errors import StopTrainingError

if TYPE_CHECKING:
    from ..trainer import Trainer


class NonFiniteStateError(StopTrainingError):
    """Raised instead of writing weights (or after a loss) that hold NaN or infinity.

    A :class:`~pytorch_accelerated.callbacks.StopTrainingError`: raised during a run, it ends
    the run cleanly, as ``TerminateOnNaNCallback`` would; raised outside one, it reaches the
    caller. Nothing was written.
    """


def non_finite_flag(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """A device tensor that is > 0 when any floating-point value in ``tensors`` is NaN or
    infinite (no host read); None when there is nothing to check."""
    floats = [tensor.detach() for tensor in tensors if torch.is_floating_point(tensor) and tensor.numel()]
    if not floats:
        return None
    # NaN and inf propagate through the sum of absolute maxima; one small tensor per device.
    maxima = torch._foreach_norm(floats, ord=float("inf"))
    return torch.stack([m.to(maxima[0].device) for m in maxima]).sum().isfinite().logical_not()


def state_is_finite(state: Mapping[str, Any]) -> bool:
    """True when every floating-point tensor of a loaded state dict is finite (a host read)."""
    flag = non_finite_flag(value for value in state.values() if isinstance(value, torch.Tensor))
    return flag is None or not bool(flag.item())


def check_finite_before_save(trainer: Trainer, model: nn.Module | None, what: str) -> None:
    """Raise :class:`NonFiniteStateError` on every process if the weights of ``model`` (default:
    the Trainer's) or this epoch's training loss are not finite on any process.

    A collective (every process must call it, as every save is); one host read.
    """
    source = trainer.model if model is None else model
    flags = [non_finite_flag(source.parameters())]
    loss_total = trainer.run_state.train_loss.running_total
    if isinstance(loss_total, torch.Tensor):
        flags.append(loss_total.detach().isfinite().logical_not())
    flag: Any = any(bool(f.item()) for f in flags if f is not None)  # one read per flag, at save time only
    if trainer.any_process(flag):
        raise NonFiniteStateError(
            f"Not saving {what}: the weights or the training loss hold NaN or infinity at step "
            f"{trainer.progress.global_step}; stopping the run so that no earlier finite state is lost."
        )
