"""What the Trainer offers about processes and devices, and gathering tensors that differ in length.

Evaluation loaders may end with *padding* batches (a repeated sample, so that every process
runs as many batches): a loader says how many of its batches come first with its
``num_real_batches`` attribute. While a padding batch is evaluated,
``eval_batch_is_padding`` is true and ``gather_for_metrics`` takes no row from this process.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object, recursively_apply
from torch import nn
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
    length = torch.tensor([tensor.shape[0]], device=tensor.device)
    lengths = accelerator.gather(length).tolist()
    padded = accelerator.pad_across_processes(tensor, dim=0, pad_index=0)
    gathered = accelerator.gather(padded)
    chunk = padded.shape[0]
    pieces = [gathered[i * chunk : i * chunk + n] for i, n in enumerate(lengths)]
    return torch.cat(pieces)


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
        with tqdm.external_write_mode(file=kwargs.get("file")):
            builtins.print(*args, **kwargs)


class ProcessUtilities:
    """The Trainer's methods about processes and devices: where it runs, who is the main
    process, printing once, gathering, agreeing on a flag (a base class of the Trainer)."""

    _accelerator: Accelerator
    model: nn.Module
    _eval_batch_is_padding: bool = False

    @property
    def accelerator(self) -> Accelerator:
        """The ``accelerate.Accelerator`` this Trainer runs on (read-only)."""
        return self._accelerator

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._accelerator.device

    @property
    def is_local_process_zero(self) -> bool:
        """True on the main process of each node."""
        return self._accelerator.is_local_main_process

    @property
    def is_world_process_zero(self) -> bool:
        """True on the main process of the whole job."""
        return self._accelerator.is_main_process

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per node (on each node's main process), above any open progress bar.

        Takes what the built-in ``print`` takes (``sep``, ``end``, ``file``, ``flush``). While a
        tqdm bar is drawn on the same terminal, the bar is cleared first and redrawn below the
        printed text, so the text starts on a line of its own.
        """
        print_once_per_node(self._accelerator, *args, **kwargs)

    def gather(self, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
        """Concatenate ``tensor`` from every process along dim 0.

        Tensors may differ in length along dim 0 (an uneven last batch): with
        ``padding_value=None`` the result holds each process's rows and nothing else; with a
        ``padding_value`` (as in 0.1.61) shorter tensors are padded with it, gathered, and the
        padding is removed again: every row whose elements all equal ``padding_value`` is
        dropped (for a 1-D tensor, every element equal to it), so real rows made only of that
        value are dropped too. Every process must call this.
        """
        if padding_value is None:
            return gather_ragged(self._accelerator, tensor)
        padded = self._accelerator.pad_across_processes(tensor, dim=0, pad_index=padding_value)
        return strip_padding(self._accelerator.gather(padded), padding_value)

    def gather_for_metrics(self, data: Any) -> Any:
        """Gather nested tensors (dicts, lists, tuples) from every process, each sample once.

        Leaves may differ in length along dim 0 between processes. Every process must call it.
        During a padding batch of evaluation (see :attr:`eval_batch_is_padding`) this process
        contributes no rows, so each sample is gathered once.
        """
        return gather_ragged(self._accelerator, data, padding=self._eval_batch_is_padding)

    @property
    def eval_batch_is_padding(self) -> bool:
        """True while an evaluation batch that only repeats a sample is evaluated.

        Such a batch evens out the number of batches of the processes (a process with fewer
        samples than the others gets one); its loss is not counted and
        :meth:`gather_for_metrics` gathers nothing from it. A metric that is updated on each
        process separately should skip these batches.
        """
        return self._eval_batch_is_padding

    def _eval_batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The batches of an evaluation loader, with :attr:`eval_batch_is_padding` set for each."""
        real = None
        try:
            for number, batch in enumerate(loader):
                if real is None:  # a stream's loader knows it only at its end; then it stays
                    real = getattr(loader, "num_real_batches", None)
                self._eval_batch_is_padding = real is not None and number >= real
                yield batch
        finally:
            self._eval_batch_is_padding = False

    def any_process(self, flag: bool | torch.Tensor) -> bool:
        """True on every process if ``flag`` is true on any (a collective: all must call it)."""
        return bool(ranks_where(self._accelerator, flag))

    def get_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """Return the model without its distributed wrappers."""
        return self._accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)
