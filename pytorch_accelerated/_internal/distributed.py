"""Working across processes: gathering tensors that differ in length, means and flags over every
process, printing once per node. The Trainer's ``gather``, ``gather_for_metrics``, ``any_process``
and ``print`` are these, given its accelerator.
"""

from __future__ import annotations

import builtins
from contextlib import nullcontext
from typing import Any, cast

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, recursively_apply
from tqdm.auto import tqdm


def gather_ragged(accelerator: Accelerator, data: Any, padding: bool = False) -> Any:
    """Concatenate each tensor leaf of ``data`` over processes along dim 0, no padding kept.

    Tensors may have a different length along dim 0 on each process; other dimensions must
    agree. Non-tensor leaves are gathered as Python objects. Every process must call this with
    the same structure, or the collective calls would not line up. With ``padding`` this
    process contributes no rows (and no object).
    """
    is_object = not isinstance(data, (torch.Tensor, dict, list, tuple))
    if padding and not is_object:
        data = recursively_apply(
            lambda tensor: tensor.reshape(-1)[:0] if tensor.dim() == 0 else tensor[:0], data
        )
    if accelerator.num_processes == 1:
        return [] if padding and is_object else data
    if is_object:
        return gather_object([] if padding else [data])
    return recursively_apply(
        lambda tensor: _gather_tensor(accelerator, tensor), data, error_on_other_type=True
    )


def _gather_tensor(accelerator: Accelerator, tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    lengths = accelerator.gather(torch.tensor([tensor.shape[0]], device=tensor.device)).tolist()
    padded = accelerator.pad_across_processes(tensor, dim=0, pad_index=0)
    gathered, chunk = accelerator.gather(padded), padded.shape[0]
    return torch.cat([gathered[i * chunk : i * chunk + n] for i, n in enumerate(lengths)])


def gather(accelerator: Accelerator, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
    """What ``Trainer.gather`` does: concatenate ``tensor`` from every process along dim 0.

    Tensors may differ in length along dim 0: with ``padding_value=None`` the result holds each
    process's rows and nothing else; with a ``padding_value`` (as in 0.1.61) shorter tensors are
    padded with it, gathered, and every row (for 1-D, every element) equal to it is dropped, real
    rows made only of that value too. Every process must call this."""
    if padding_value is None:
        return cast(torch.Tensor, gather_ragged(accelerator, tensor))
    padded = accelerator.pad_across_processes(tensor, dim=0, pad_index=padding_value)
    return strip_padding(accelerator.gather(padded), padding_value)


def strip_padding(padded: torch.Tensor, padding_value: Any) -> torch.Tensor:
    """``padded`` without its padding: for 1-D, the elements equal to ``padding_value``; for
    more dimensions, the rows (along dim 0) whose elements all equal it."""
    if padded.dim() <= 1:
        return padded[padded != padding_value]
    return padded[~(padded == padding_value).flatten(1).all(dim=1)]


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


def per_process(accelerator: Accelerator, values: Any) -> list[list[float]]:
    """Every process's ``values`` (numbers, or a device tensor: the same length on every process),
    one row per process, known on every process: one all-gather and one host read."""
    row = torch.as_tensor(values, dtype=torch.float32, device=accelerator.device).reshape(1, -1)
    if accelerator.num_processes > 1:
        row = accelerator.gather(row)
    return row.tolist()


def ranks_where(accelerator: Accelerator, flag: bool | torch.Tensor) -> list[int]:
    """The processes on which ``flag`` is true, the same list on every process (a collective:
    every process must call this)."""
    return [rank for rank, (value,) in enumerate(per_process(accelerator, flag)) if value]


def print_once_per_node(accelerator: Accelerator, *args: Any, **kwargs: Any) -> None:
    """``print`` on each node's main process, above any open tqdm progress bar (which is
    cleared first and redrawn below the text, so the text starts on a line of its own)."""
    if accelerator.is_local_main_process:
        # With no bar drawn (tqdm does not list disabled bars) there is nothing to clear: skip
        # tqdm's locks and its scan of the bars, which cost more than the print.
        bars_drawn = getattr(tqdm, "_instances", None)
        with tqdm.external_write_mode(file=kwargs.get("file")) if bars_drawn else nullcontext():
            builtins.print(*args, **kwargs)
