"""Samplers and data-loading helpers used by the Trainer.

Training shuffles with :class:`ReproducibleShuffleSampler`, whose order depends only on a
seed and the epoch, so a run can be repeated (and, later, resumed) exactly; accelerate then
shards its batches across processes.

Evaluation uses :class:`ShardedEvalBatchSampler` (or, for a stream, :class:`ShardedStreamLoader`):
every process gets the same number of batches (so collective calls made per batch line up and
never hang) and every sample exactly once, each batch with samples of its own. Only a process
with no sample at all (fewer samples than processes), and a stream's processes left without a
batch in its last round, get a *padding* batch of zero rows (:func:`zero_rows`: a real sample's
batch with every tensor cut to ``[:0]``) that the loader marks (``num_real_batches``): events
fire and the model runs on it, but no sample is seen twice (docs/inside-the-trainer.md, "Evaluation").

Before a run, :func:`check_same_data_on_every_process` compares a fingerprint of the data sets
across processes, since a data set that differs (e.g. an unseeded ``random_split``) silently
mixes evaluation samples into training, or hangs the run.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import math
import os
import random
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from torch.utils.data import ConcatDataset, Dataset, IterableDataset, Sampler, Subset

from ._internal.preparation import needs_preparing


class ReproducibleShuffleSampler(Sampler[int]):
    """A random permutation of ``range(num_samples)`` determined by ``seed`` and the epoch.

    Call :meth:`set_epoch` before each epoch; the Trainer does. The order is global: accelerate
    cuts it into batches and deals them to the processes in turn, so with P processes and
    per-device batch B, batch *k* of every process ends at sample ``(k + 1) * P * B`` of it.

    >>> sampler = ReproducibleShuffleSampler(6, seed=0)
    >>> order = list(sampler)
    >>> sampler.skip_in_epoch(0, 4)  # the first 4 samples of epoch 0's order were seen already
    >>> list(sampler) == order[4:], len(sampler)
    (True, 2)
    >>> sampler.set_epoch(1); len(sampler)  # later epochs are whole again
    6
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0
        self._skip: tuple[int, int] | None = None  # (epoch, samples) left out of that epoch's order

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_in_epoch(self, epoch: int, num_samples: int) -> None:
        """Leave the first ``num_samples`` of epoch ``epoch``'s order out of that epoch (only):
        how a run resumed on other settings continues the saved epoch (see
        :mod:`pytorch_accelerated.checkpoints.reshard`)."""
        self._skip = (epoch, num_samples) if num_samples else None

    def skipped_in(self, epoch: int) -> int:
        """The samples left out of epoch ``epoch``'s order (0 but in a resumed epoch)."""
        return self._skip[1] if self._skip is not None and self._skip[0] == epoch else 0

    @property
    def skipped(self) -> int:
        """The samples left out of the current epoch's order."""
        return self.skipped_in(self.epoch)

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(
            self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch)
        ).tolist()[self.skipped :]

    def __len__(self) -> int:
        return self.num_samples - self.skipped


class ShardedEvalBatchSampler(Sampler[list[int]]):
    """Splits ``range(num_samples)`` over processes, each sample once, in equal batch counts.

    Process ``p`` takes indices ``p, p + P, p + 2P, ...``; these are cut into
    ``ceil(ceil(N / P) / batch_size)`` batches, all full but the last ones, none empty. Where a
    process has fewer samples than that (only with ``batch_size`` 1, when ``P`` does not divide
    ``N``), every process runs as many batches as the shortest has samples, and the longer ones
    evaluate one batch of 2: every batch of every process holds samples of its own. Only a
    process with no sample at all (``N < P``) gets one padding batch (``num_real_batches`` 0),
    which the loaders cut to zero rows (:func:`zero_rows`).

    >>> [list(ShardedEvalBatchSampler(3, 1, num_processes=2, process_index=p)) for p in (0, 1)]
    [[[0, 2]], [[1]]]
    >>> [list(ShardedEvalBatchSampler(1, 1, num_processes=2, process_index=p)) for p in (0, 1)]
    [[[0]], [[0]]]
    >>> ShardedEvalBatchSampler(1, 1, num_processes=2, process_index=1).num_real_batches
    0
    """

    def __init__(self, num_samples: int, batch_size: int, num_processes: int = 1, process_index: int = 0):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        # No more batches than the shortest process has samples (num_samples // num_processes).
        self.num_batches = max(
            1,
            min(math.ceil(math.ceil(num_samples / num_processes) / batch_size), num_samples // num_processes),
        )
        self.indices = range(process_index, num_samples, num_processes)
        #: Batches holding this process's own samples: all, or none (a process without samples).
        self.num_real_batches = self.num_batches if self.indices else 0

    def __iter__(self) -> Iterator[list[int]]:
        if not self.indices:  # cut to zero rows by the loader; the sample gives their structure
            yield [0]
            return
        start, count = 0, len(self.indices)
        largest = max(self.batch_size, math.ceil(count / self.num_batches))
        for batch_number in range(self.num_batches):
            # Leave at least one sample for each batch still to come, so none is empty.
            size = min(largest, count - start - (self.num_batches - batch_number - 1))
            yield list(self.indices[start : start + size])
            start += size

    def __len__(self) -> int:
        return self.num_batches


class DeviceDataLoader:
    """Iterates over a data loader and moves each batch to ``device``."""

    def __init__(self, dataloader: torch.utils.data.DataLoader, device: torch.device) -> None:
        self.dataloader = dataloader
        self.device = device
        self.non_blocking = bool(getattr(dataloader, "pin_memory", False))

    @property
    def dataset(self) -> Any:
        return self.dataloader.dataset

    @property
    def batch_sampler(self) -> Any:
        return self.dataloader.batch_sampler

    @property
    def num_real_batches(self) -> int | None:
        """The batches before the padding ones (see :class:`ShardedEvalBatchSampler`), or None."""
        return getattr(self.dataloader.batch_sampler, "num_real_batches", None)

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        real = self.num_real_batches
        for number, batch in enumerate(self.dataloader):
            yield self._to_device(batch if real is None or number < real else zero_rows(batch))

    def _to_device(self, batch: Any) -> Any:
        """accelerate's ``send_to_device``, with a shortcut for the usual batch (a tuple or list
        of tensors) that saves a few microseconds per batch (docs/benchmarks.md, evaluation):
        a tensor already on the device is kept, as ``.to()`` would return it, without the call."""
        kind, device = type(batch), self.device
        # A batch with anything else inside goes to send_to_device, which knows what to do with it.
        if (kind is tuple or kind is list) and all(type(item) is torch.Tensor for item in batch):
            moved = [
                item if item.device == device else item.to(device, non_blocking=self.non_blocking)
                for item in batch
            ]
            return moved if kind is list else tuple(moved)
        return send_to_device(batch, device, non_blocking=self.non_blocking)


class ShardedStreamLoader(DeviceDataLoader):
    """An evaluation loader over a stream (an ``IterableDataset``), split across processes with
    each batch evaluated once.

    Every process reads the whole stream, which must yield the same batches on each, and keeps
    batches ``p, p + P, ...``. When the stream ends within a round of ``P`` batches, that last
    round is cut into one share per process (:func:`last_round_shares`), so all have the same
    number of batches, each with samples of its own while there are enough; a process left
    without any gets a padding batch of zero rows (:func:`zero_rows`). ``num_real_batches`` is
    set once the end is seen.
    """

    def __init__(
        self,
        dataloader: torch.utils.data.DataLoader,
        device: torch.device,
        num_processes: int,
        process_index: int,
    ) -> None:
        super().__init__(dataloader, device)
        self.num_processes, self.process_index = num_processes, process_index
        self._real_batches: int | None = None

    @property
    def num_real_batches(self) -> int | None:
        return self._real_batches

    def __len__(self) -> int:  # a TypeError for a stream without a length, as for a DataLoader
        return math.ceil(len(self.dataloader) / self.num_processes)

    def __iter__(self) -> Iterator[Any]:
        self._real_batches, number, batches = None, 0, iter(self.dataloader)
        while (
            len(round_of_batches := list(itertools.islice(batches, self.num_processes))) == self.num_processes
        ):
            yield self._to_device(round_of_batches[self.process_index])
            number += 1
        self._real_batches = number  # the stream ended: its last round shared out, or nothing
        if round_of_batches:
            shares = last_round_shares(round_of_batches, self.num_processes)
            real = self.process_index < len(shares)
            self._real_batches += real
            yield self._to_device(shares[self.process_index] if real else zero_rows(round_of_batches[0]))


def last_round_shares(batches: list[Any], num_processes: int) -> list[Any]:
    """The last batches of a stream (fewer than ``num_processes``) cut into shares for the first
    processes, in order: the largest piece is halved until there is a share for every process or
    every piece holds one sample (the batches as they are when a batch's rows cannot be told,
    see :func:`num_rows`). The processes left over get no share."""
    pieces = [(batch, 0, num_rows(batch)) for batch in batches]
    while len(pieces) < num_processes and all(stop is not None for _, _, stop in pieces):
        largest = max(range(len(pieces)), key=lambda i: pieces[i][2] - pieces[i][1])  # type: ignore[operator]
        batch, start, stop = pieces[largest]
        if stop - start < 2:  # type: ignore[operator]
            break
        middle = (start + stop + 1) // 2  # type: ignore[operator]
        pieces[largest : largest + 1] = [(batch, start, middle), (batch, middle, stop)]
    return [
        batch if (start, stop) == (0, num_rows(batch)) else select_rows(batch, slice(start, stop))
        for batch, start, stop in pieces
    ]


def num_rows(batch: Any) -> int | None:
    """The samples in ``batch``: the length of its first tensor (of at least one dim) or list of
    per-sample values, as :func:`select_rows` sees it; None where it has neither."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() else None
    if isinstance(batch, (list, tuple)) and not _holds_structure(batch):
        return len(batch)
    values = (
        batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else ()
    )
    return next((rows for value in values if (rows := num_rows(value)) is not None), None)


def _holds_structure(values: list[Any] | tuple[Any, ...]) -> bool:
    """Whether a list or tuple in a batch is structure (holds tensors or containers), not one value per sample."""
    return any(isinstance(item, (torch.Tensor, Mapping, list, tuple)) for item in values)


def zero_rows(batch: Any) -> Any:
    """``batch`` with no sample in it (:func:`select_rows` of none): the structure, dtypes and
    trailing shapes of a real batch.

    >>> zero_rows({"x": torch.ones(2, 3), "names": ["a", "b"]})
    {'x': tensor([], size=(0, 3)), 'names': []}
    """
    return select_rows(batch, slice(0, 0))


def select_rows(batch: Any, rows: slice) -> Any:
    """The samples ``rows`` of ``batch``: each tensor of it cut to ``[rows]`` along dim 0 (dtype
    and trailing shape kept; a 0-d tensor stays), each list or tuple of per-sample values
    (strings, numbers, as a collate function makes of them) too; mappings, tuples and lists of
    tensors keep their structure and type. Anything else is kept as it is."""
    if isinstance(batch, torch.Tensor):
        return batch[rows] if batch.dim() else batch
    if isinstance(batch, Mapping):
        selected = {key: select_rows(value, rows) for key, value in batch.items()}
        if isinstance(batch, MutableMapping):  # the same type (a transformers BatchEncoding too)
            same = copy.copy(batch)
            same.update(selected)
            return same
        return selected
    if isinstance(batch, (list, tuple)):
        if not _holds_structure(batch):
            return batch[rows]  # one value per sample
        items = [select_rows(item, rows) for item in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def prepare_eval_dataloader(accelerator: Accelerator, dataloader: Any) -> Any:
    """Prepare an evaluation loader; one already split across processes (by a
    :class:`ShardedEvalBatchSampler`) is only moved to the device, one over a stream is split
    by a :class:`ShardedStreamLoader`."""
    if not needs_preparing(dataloader):
        return dataloader
    if isinstance(dataloader.batch_sampler, ShardedEvalBatchSampler):
        return DeviceDataLoader(dataloader, accelerator.device)
    if isinstance(dataloader.dataset, IterableDataset):
        return ShardedStreamLoader(
            dataloader, accelerator.device, accelerator.num_processes, accelerator.process_index
        )
    return accelerator.prepare(dataloader)


def batches_per_epoch(dataloader: Any, unknown: Any = None) -> Any:
    """The number of batches ``dataloader`` gives per epoch, or ``unknown`` (None) for a stream
    of unknown length."""
    try:
        return len(dataloader)
    except TypeError:
        return unknown


def check_stream_gave_batches(batches_done: int, dataset: Any) -> None:
    """Fail when a training epoch over a stream ended with no batch (it would train nothing)."""
    if batches_done == 0:
        raise ValueError(
            f"The training data set ({type(dataset).__name__}) gave no batch in this epoch: an "
            f"IterableDataset must yield samples on every pass (each epoch iterates it again). "
            f"Check that its __iter__ starts over each time it is called."
        )


def is_map_style(dataset: Any) -> bool:
    return (
        isinstance(dataset, Dataset)
        and hasattr(dataset, "__len__")
        and not isinstance(dataset, torch.utils.data.IterableDataset)
    )


def worker_init_fn(worker_id: int) -> None:
    """Seed ``random`` and numpy in a data-loader worker from the seed torch gave that worker.

    torch seeds each worker with ``base_seed + worker_id``, where ``base_seed`` comes from the
    data loader's generator; seeding the other libraries from it makes augmentations that use
    them reproducible and different in each worker.
    """
    worker_seed = torch.initial_seed() % 2**32
    random.seed(worker_seed)
    try:
        import numpy as np
    except ImportError:  # numpy is optional
        return
    np.random.seed(worker_seed)


def default_dataloader_kwargs(
    dataset: Any, batch_size: int, device: torch.device, seed: int | None, local_processes: int
) -> dict[str, Any]:
    """The Trainer's default ``DataLoader`` arguments (before ``shuffle`` is set for train or eval).

    Worker processes load the data only where loading can overlap accelerator work: none on the
    CPU (where they compete with the training threads for the same cores) or for small data
    sets (they cost a start-up per epoch). Their base seed comes from the loader's ``generator``,
    seeded with ``seed``, not from the global RNG.
    """
    if device.type == "cpu" or not is_map_style(dataset) or len(dataset) < 64 * batch_size:
        num_workers = 0
    else:  # this machine's cores, shared by its processes; 1 to 8 each
        processes_here = int(os.environ.get("LOCAL_WORLD_SIZE", local_processes))
        num_workers = max(1, min(8, (os.cpu_count() or 1) // processes_here))
    return {
        "batch_size": batch_size,
        "pin_memory": device.type == "cuda",
        "num_workers": num_workers,
        "worker_init_fn": worker_init_fn,
        **({"generator": torch.Generator().manual_seed(seed)} if seed is not None else {}),
    }


def shard_evaluation(
    kwargs: dict[str, Any], num_samples: int, batch_size: int, num_processes: int, process_index: int
) -> dict[str, Any]:
    """``kwargs`` with a :class:`ShardedEvalBatchSampler` in place of batch size, shuffle and
    drop_last: every process gets its own share of the samples, each once, in equal batch counts."""
    return {
        **{key: value for key, value in kwargs.items() if key not in ("batch_size", "shuffle", "drop_last")},
        "batch_sampler": ShardedEvalBatchSampler(num_samples, batch_size, num_processes, process_index),
    }


def loader_batch_size(loader_kwargs: Mapping[str, Any] | None, default: int) -> int:
    """The per-device batch size of a loader made with ``loader_kwargs``: their ``batch_size`` (a given
    one wins over ``per_device_batch_size``, as in 0.1.61), else ``default``."""
    return (loader_kwargs or {}).get("batch_size") or default


def merge_dataloader_kwargs(defaults: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``overrides`` over ``defaults``, dropping the defaults that a given sampler or batch
    sampler replaces, and the worker arguments when there are no workers."""
    given = overrides or {}
    kwargs = {**defaults, **given}
    dropped = set()
    if "sampler" in given:
        dropped.add("shuffle")
    if "batch_sampler" in given:  # DataLoader refuses these beside a batch sampler
        dropped |= {"batch_size", "shuffle", "sampler", "drop_last"}
    if kwargs.get("num_workers", 0) == 0:  # no workers to initialise or keep
        dropped |= {"worker_init_fn", "persistent_workers"}
    return {key: value for key, value in kwargs.items() if key not in dropped}


def dataset_fingerprint(dataset: Any) -> tuple[int, int]:
    """``(length, hash of its Subset indices)`` of a map-style data set, cheap to compare across
    processes; ``(-1, 0)`` for None or a stream, whose processes may read different shards.

    The indices of every :class:`~torch.utils.data.Subset` inside it (e.g. from
    ``random_split``, also inside a ``ConcatDataset``) go into the hash, 0 when there is none.
    """
    if not is_map_style(dataset):
        return -1, 0
    pending, hashed = [dataset], []
    while pending:
        current = pending.pop()
        if isinstance(current, Subset):
            hashed.append(torch.as_tensor(list(current.indices), dtype=torch.int64).numpy().tobytes())
            pending.append(current.dataset)
        elif isinstance(current, ConcatDataset):
            pending.extend(current.datasets)
    digest = hashlib.blake2b(b"".join(hashed), digest_size=7).digest()  # 56 bits: a non-negative int64
    return len(dataset), int.from_bytes(digest, "little") if hashed else 0


def check_same_data_on_every_process(accelerator: Accelerator, datasets: dict[str, Any]) -> None:
    """Fail on every process when a data set differs across processes (its length, or the
    indices of a ``random_split``); ``datasets`` maps argument names to data sets (or None).

    One all-gather of a few integers, once per ``train()`` / ``evaluate()``; nothing with one process.
    """
    if accelerator.num_processes == 1:
        return
    local = [value for dataset in datasets.values() for value in dataset_fingerprint(dataset)]
    table = (
        accelerator.gather(torch.tensor(local, dtype=torch.int64, device=accelerator.device))
        .reshape(accelerator.num_processes, -1)
        .tolist()
    )
    for slot, name in enumerate(datasets):
        seen = [tuple(row[2 * slot : 2 * slot + 2]) for row in table]
        if len(set(seen)) == 1:
            continue
        described = "; ".join(
            f"process {process}: {length} samples" + (f", Subset indices hash {digest:#x}" if digest else "")
            for process, (length, digest) in enumerate(seen)
        )
        raise ValueError(
            f"{name} differs across processes ({described}). Every process must build the same data "
            f"set: the Trainer splits it among them, so a different one mixes samples (e.g. evaluation "
            f"samples trained on) or hangs the run. If it comes from torch.utils.data.random_split, seed "
            f"the split: random_split(dataset, lengths, generator=torch.Generator().manual_seed(0)), or "
            f"call torch.manual_seed(...) before splitting."
        )
