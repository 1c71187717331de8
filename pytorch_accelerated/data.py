"""Samplers and data-loading helpers used by the Trainer.

Training shuffles with :class:`ReproducibleShuffleSampler`, whose order depends only on a
seed and the epoch, so a run can be repeated (and, later, resumed) exactly; accelerate then
shards its batches across processes.

Evaluation uses :class:`ShardedEvalBatchSampler`: every process gets the same number of
batches (so collective calls made per batch line up and never hang) and every sample exactly
once (no padding with duplicated samples, which would bias the evaluation loss and metrics).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import send_to_device
from torch.utils.data import Dataset, Sampler

from ._internal.accelerate_support import needs_preparing


class ReproducibleShuffleSampler(Sampler[int]):
    """A random permutation of ``range(num_samples)`` determined by ``seed`` and the epoch.

    Call :meth:`set_epoch` before each epoch; the Trainer does.
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()

    def __len__(self) -> int:
        return self.num_samples


class ShardedEvalBatchSampler(Sampler[list[int]]):
    """Splits ``range(num_samples)`` over processes with no padding and equal batch counts.

    Process ``p`` takes indices ``p, p + P, p + 2P, ...``; these are cut into
    ``ceil(ceil(N / P) / batch_size)`` batches, all full but the last ones, none empty.
    """

    def __init__(self, num_samples: int, batch_size: int, num_processes: int = 1, process_index: int = 0):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.process_index = process_index
        self.num_batches = math.ceil(math.ceil(num_samples / num_processes) / batch_size)
        self.indices = range(process_index, num_samples, num_processes)
        if len(self.indices) < self.num_batches:
            raise ValueError(
                f"The evaluation data set of {num_samples} samples cannot be split over "
                f"{num_processes} processes in {self.num_batches} batches of at most {batch_size} "
                f"without giving process {process_index} an empty batch. Use a larger evaluation "
                f"set, fewer processes, or a larger per_device_batch_size."
            )

    def __iter__(self) -> Iterator[list[int]]:
        start = 0
        for batch_number in range(self.num_batches):
            batches_after = self.num_batches - batch_number - 1
            # Leave at least one sample for each batch still to come, so none is empty.
            size = min(self.batch_size, len(self.indices) - start - batches_after)
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

    def __len__(self) -> int:
        return len(self.dataloader)

    def __iter__(self) -> Iterator[Any]:
        for batch in self.dataloader:
            yield send_to_device(batch, self.device, non_blocking=self.non_blocking)


def prepare_eval_dataloader(accelerator: Accelerator, dataloader: Any) -> Any:
    """Prepare an evaluation loader; one already split across processes (by a
    :class:`ShardedEvalBatchSampler`) is only moved to the device."""
    if not needs_preparing(dataloader):
        return dataloader
    if isinstance(dataloader.batch_sampler, ShardedEvalBatchSampler):
        return DeviceDataLoader(dataloader, accelerator.device)
    return accelerator.prepare(dataloader)


def is_map_style(dataset: Any) -> bool:
    return isinstance(dataset, Dataset) and hasattr(dataset, "__len__") and not isinstance(
        dataset, torch.utils.data.IterableDataset
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
    """The Trainer's default ``DataLoader`` arguments (before ``shuffle`` is set for train or eval)."""
    kwargs: dict[str, Any] = {
        "batch_size": batch_size,
        "pin_memory": device.type == "cuda",
        "num_workers": default_num_workers(dataset, batch_size, device, local_processes),
        "worker_init_fn": worker_init_fn,
    }
    if seed is not None:
        # Workers' base seed comes from this generator, not from the global RNG.
        kwargs["generator"] = torch.Generator().manual_seed(seed)
    return kwargs


def default_num_workers(dataset: Any, batch_size: int, device: torch.device, local_processes: int) -> int:
    """Worker processes for loading ``dataset``: none on the CPU or for small data sets.

    Workers cost a start-up per epoch and, on the CPU, compete with the training threads for
    the same cores: they are only used where loading can overlap accelerator work.
    """
    if device.type == "cpu" or not is_map_style(dataset) or len(dataset) < 64 * batch_size:
        return 0
    cpus = os.cpu_count() or 1
    return max(1, min(8, cpus // int(os.environ.get("LOCAL_WORLD_SIZE", local_processes))))


def shard_evaluation(
    kwargs: dict[str, Any], num_samples: int, batch_size: int, num_processes: int, process_index: int
) -> dict[str, Any]:
    """``kwargs`` with a :class:`ShardedEvalBatchSampler` in place of batch size, shuffle and
    drop_last: every process gets its own share of the samples, each once, in equal batch counts."""
    kwargs = {key: value for key, value in kwargs.items() if key not in ("batch_size", "shuffle", "drop_last")}
    kwargs["batch_sampler"] = ShardedEvalBatchSampler(num_samples, batch_size, num_processes, process_index)
    return kwargs


def merge_dataloader_kwargs(defaults: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """``overrides`` over ``defaults``, dropping the defaults that a given sampler or batch
    sampler replaces, and the worker arguments when there are no workers."""
    kwargs = {**defaults, **(overrides or {})}
    if "sampler" in (overrides or {}):
        kwargs.pop("shuffle", None)
    if "batch_sampler" in (overrides or {}):
        for key in ("batch_size", "shuffle", "sampler", "drop_last"):
            kwargs.pop(key, None)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("worker_init_fn", None)
        kwargs.pop("persistent_workers", None)
    return kwargs
