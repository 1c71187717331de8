"""Gathering across processes when tensors differ in length."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, recursively_apply


def gather_ragged(accelerator: Accelerator, data: Any) -> Any:
    """Concatenate each tensor leaf of ``data`` over processes along dim 0, no padding kept.

    Tensors may have a different length along dim 0 on each process; other dimensions must
    agree. Non-tensor leaves are gathered as Python objects. Every process must call this with
    the same structure, or the collective calls would not line up.
    """
    if accelerator.num_processes == 1:
        return data
    if not isinstance(data, (torch.Tensor, dict, list, tuple)):
        return gather_object([data])
    return recursively_apply(lambda tensor: _gather_tensor(accelerator, tensor), data, error_on_other_type=True)


def _gather_tensor(accelerator: Accelerator, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    length = torch.tensor([tensor.shape[0]], device=tensor.device)
    lengths = accelerator.gather(length).tolist()
    padded = accelerator.pad_across_processes(tensor, dim=0, pad_index=0)
    gathered = accelerator.gather(padded)
    chunk = padded.shape[0]
    pieces = [gathered[i * chunk : i * chunk + n] for i, n in enumerate(lengths)]
    return torch.cat(pieces)


def mean_over_processes(accelerator: Accelerator, total: Any, count: Any) -> float:
    """``sum(total) / sum(count)`` over every process: one all-reduce and one host read."""
    totals = torch.stack(
        [
            torch.as_tensor(total, dtype=torch.float64, device=accelerator.device),
            torch.as_tensor(count, dtype=torch.float64, device=accelerator.device),
        ]
    )
    if accelerator.num_processes > 1:
        totals = accelerator.reduce(totals, reduction="sum")
    summed_total, summed_count = totals.tolist()
    return summed_total / summed_count if summed_count else float("nan")
