"""Finite weights only: the check that every writer of weights makes before it writes.

A checkpoint holding NaN or infinite weights is worse than none: it looks like progress, and
rotation would delete the good states to make room for it. So every save (training states,
single-file checkpoints, and through them save-best, EMA, WSD and save-at-end) checks, at save
time, that the weights it is about to write and the training loss since the epoch began are
finite; when they are not, nothing is written and :class:`NonFiniteStateError` ends the run as
``TerminateOnNaNCallback`` would. Knows nothing of the Trainer: it is given the run's objects
(:class:`~.training_objects.TrainingObjects`) and the model to check.

The training loss needs no bookkeeping of its own: the Trainer sums each step's loss on the
device (``trainer.loop_state.train_loss.running_total``), and that sum is NaN or infinite once
any loss of the epoch was. Reading it is the only host read, made at checks only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch
from torch import nn

from .._internal.distributed import per_process
from .._internal.errors import StopTrainingError
from .._internal.fsdp import is_dtensor
from .training_objects import TrainingObjects


class NonFiniteStateError(StopTrainingError):
    """Raised instead of writing weights (or after a loss) that hold NaN or infinity.

    A :class:`~pytorch_accelerated.callbacks.StopTrainingError`: raised during a run, it ends
    the run cleanly, as ``TerminateOnNaNCallback`` would; raised outside one, it reaches the
    caller. Nothing was written.
    """


def non_finite_flag(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """A device tensor that is true when any floating-point value in ``tensors`` (this
    process's shard of a sharded one) is NaN or infinite (no host read); None when there is
    nothing to check."""
    # A sharded (DTensor) tensor is checked through this process's shard: the check's gather
    # across processes covers the others.
    local = (cast(Any, tensor).to_local() if is_dtensor(tensor) else tensor for tensor in tensors)
    floats = [tensor.detach() for tensor in local if torch.is_floating_point(tensor) and tensor.numel()]
    if not floats:
        return None
    # The largest magnitude of each tensor (NaN propagates through it), one kernel per
    # device and dtype; each is finite in its own dtype, and cat promotes to the widest one.
    maxima = torch._foreach_norm(floats, ord=float("inf"))
    return (
        torch.cat([maximum.reshape(1).to(maxima[0].device) for maximum in maxima])
        .isfinite()
        .all()
        .logical_not()
    )


def non_finite_loss_flag(loss_total: Any) -> torch.Tensor | bool:
    """True (a device tensor, no host read) when a training loss of the current epoch was NaN
    or infinite on this process: ``loss_total``, the epoch's weighted sum of them, then is too."""
    if isinstance(loss_total, torch.Tensor):
        return loss_total.detach().isfinite().logical_not()
    return not math.isfinite(float(loss_total))


def state_is_finite(state: Mapping[str, Any]) -> bool:
    """True when every floating-point tensor of a loaded state dict is finite (a host read)."""
    flag = non_finite_flag(value for value in state.values() if isinstance(value, torch.Tensor))
    return flag is None or not bool(flag.item())


def check_finite_before_save(objects: TrainingObjects, model: nn.Module, what: str) -> None:
    """Raise :class:`NonFiniteStateError` on every process if the weights of ``model``
    (parameters and floating-point buffers) or the epoch's training loss (the sum of this epoch's
    losses, ``objects.loop_state.train_loss.running_total``) are not finite on any process.

    ``what`` names what would have been written (e.g. ``"the training state 'states/step_8'"``);
    the error names it, the update step (``objects.progress.global_step``), what was not finite
    and on which process. A collective (every process must call it, as every save is); one host read.
    """
    device = objects.accelerator.device
    weights = non_finite_flag(itertools.chain(model.parameters(), model.buffers()))
    flags = torch.zeros(2, device=device)
    if weights is not None:
        flags[0] = weights.to(device)
    flags[1] = torch.as_tensor(
        non_finite_loss_flag(objects.loop_state.train_loss.running_total), device=device
    )
    rows = per_process(objects.accelerator, flags)  # one row per process, read once: which processes saw what
    if any(value > 0 for row in rows for value in row):
        raise NonFiniteStateError(_refusal(what, objects.progress.global_step, rows))


_REASONS = ("the weights hold NaN or infinity", "the training loss of this epoch was NaN or infinite")


def _refusal(what: str, step: int, rows: list[list[float]]) -> str:
    """The one line that says what was not saved, at which step, and why (on which processes)."""
    ranks = [
        [str(rank) for rank, row in enumerate(rows) if row[column] > 0] for column in range(len(_REASONS))
    ]
    reasons = [
        reason + (f" (on process {', '.join(where)})" if len(rows) > 1 else "")
        for reason, where in zip(_REASONS, ranks, strict=True)
        if where
    ]
    return (
        f"Not saving {what} at step {step}: {' and '.join(reasons)}; "
        f"nothing was written, and what was saved before is kept."
    )
