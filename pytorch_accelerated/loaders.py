"""The data loaders of a Trainer's run: :class:`TrainerLoaders` (``trainer.loaders``) makes them from the
default arguments merged with the user's, remembers what they were made with and the run's seed,
and holds them once prepared for distribution; it also tells the training loader the epoch and
marks the padding batches (of zero rows) of an evaluation (:meth:`TrainerLoaders.eval_batches`).

The Trainer's overridable methods decide what is made: ``get_default_*_dl_kwargs`` give the
default ``DataLoader`` arguments and ``create_*_dataloader`` build the loaders through this part.
The samplers and loader defaults themselves live in :mod:`pytorch_accelerated.data`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

from ._internal.errors import add_note
from ._internal.process_group import shared_random_seed
from .data import (
    ReproducibleShuffleSampler,
    default_dataloader_kwargs,
    is_map_style,
    loader_batch_size,
    merge_dataloader_kwargs,
    shard_evaluation,
)


class TrainerLoaders:
    """The current run's data loaders and what they were made with.

    Attributes:
        train: the prepared training loader of the current run (None before a run).
        eval: the prepared evaluation loader of the current run or evaluation (None without one).
        merged_kwargs: the ``DataLoader`` arguments each default ``create_*_dataloader`` used
            (defaults with the user's merged over them), by ``"train"`` / ``"eval"``; the run
            config records them.
        seed: the run's seed (None: not seeded); it seeds the shuffle order and the workers.
        train_sampler: the training loader's shuffle sampler (its seed is saved), or None.
        train_generator: the training loader's ``generator`` (reseeded each epoch), if it has one.
        eval_batch_is_padding: see :attr:`~pytorch_accelerated.trainer.Trainer.eval_batch_is_padding`.
    """

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator
        self.train: Any = None
        self.eval: Any = None
        self.merged_kwargs: dict[str, dict[str, Any]] = {}
        self.seed: int | None = None
        self.train_generator: torch.Generator | None = None
        self.train_sampler: ReproducibleShuffleSampler | None = None
        self.eval_batch_is_padding = False

    def set_seed(self, seed: int | None) -> None:
        """Seed every RNG (python, numpy, torch) with ``seed`` and keep it for the loaders (None:
        the RNGs are left alone)."""
        self.seed = seed
        if seed is not None:
            set_seed(seed)

    def default_kwargs(self, dataset: Any, batch_size: int, shuffle: bool) -> dict[str, Any]:
        """The Trainer's default ``DataLoader`` arguments for ``dataset``."""
        return {
            **default_dataloader_kwargs(
                dataset, batch_size, self.accelerator.device, self.seed, self.accelerator.num_processes
            ),
            "shuffle": shuffle,
        }

    def merge(self, which: str, defaults: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
        """``overrides`` merged over ``defaults`` for the ``which`` ("train" / "eval") loader, recorded."""
        kwargs = merge_dataloader_kwargs(defaults, overrides)
        self.merged_kwargs = {**self.merged_kwargs, which: dict(kwargs)}
        return kwargs

    def recorded_kwargs(self, which: str, given: dict[str, Any] | None) -> dict[str, Any] | None:
        """The arguments the run config records for ``which``: the merged ones the default
        ``create_*_dataloader`` used, else (overridden) the ones passed by the user."""
        return self.merged_kwargs.get(which, given)

    def make_train_loader(self, dataset: Any, collate_fn: Any, kwargs: dict[str, Any]) -> DataLoader:
        """The training loader; with ``shuffle``, over a map-style data set, its order comes from a
        :class:`~pytorch_accelerated.data.ReproducibleShuffleSampler` (:attr:`train_sampler`)."""
        self.train_sampler = None
        self.train_generator = kwargs.get("generator")
        if kwargs.pop("shuffle", False) and is_map_style(dataset):
            kwargs["sampler"] = self.train_sampler = ReproducibleShuffleSampler(
                len(dataset), self.seed if self.seed is not None else shared_random_seed(self.accelerator)
            )
        return DataLoader(dataset=dataset, collate_fn=collate_fn, **kwargs)

    def make_eval_loader(
        self,
        dataset: Any,
        collate_fn: Any,
        kwargs: dict[str, Any],
        batch_size: int,
        given: dict[str, Any] | None,
    ) -> DataLoader:
        """The evaluation loader: unless the user ``given`` arguments name a sampler or it is shuffled,
        every process gets its own share of a map-style data set's samples, each sample exactly
        once, in the same number of batches (a :class:`~pytorch_accelerated.data.ShardedEvalBatchSampler`)."""
        if (
            is_map_style(dataset)
            and not {"sampler", "batch_sampler"} & set(given or {})
            and not kwargs.get("shuffle")
        ):
            kwargs = shard_evaluation(
                kwargs,
                len(dataset),
                loader_batch_size(kwargs, batch_size),
                self.accelerator.num_processes,
                self.accelerator.process_index,
            )
        return DataLoader(dataset=dataset, collate_fn=collate_fn, **kwargs)

    def eval_batches(self, loader: Iterable[Any]) -> Iterator[Any]:
        """The batches of an evaluation loader, with :attr:`eval_batch_is_padding` set for each."""
        try:
            for number, batch in enumerate(loader):
                # A stream's loader knows it only at its end; then it stays.
                real = getattr(loader, "num_real_batches", None)
                self.eval_batch_is_padding = real is not None and number >= real
                yield batch
        finally:
            self.eval_batch_is_padding = False

    def explain_padding_failure(self, error: Exception) -> None:
        """Add a note to ``error``, raised by an evaluation or prediction step, when the step's
        batch was a padding batch of zero rows: what it is and how to make the code take it."""
        if self.eval_batch_is_padding:
            add_note(
                error,
                f"Raised on a padding batch of zero rows: process {self.accelerator.process_index} "
                f"has no sample left (fewer samples than processes, or a stream's last batches), so "
                f"it runs a batch with the structure of a real one and no rows, to stay in step with "
                f"the others. Make the model and your metric accept zero rows (e.g. torch.flatten(x, 1) "
                f"instead of x.view(x.size(0), -1); torchmetrics' classification metrics refuse "
                f"them: update them only when the batch has rows), or evaluate at least as many "
                f"samples as processes. See docs/inside-the-trainer.md, 'Evaluation across processes'.",
            )

    @staticmethod
    def set_epoch(dataloader: Any, epoch: int, sampler: Any) -> None:
        """Tell the training loader and its shuffle ``sampler`` the epoch: accelerate's loaders pass
        their own iteration count to the sampler, which a fresh or resumed loader starts at 0."""
        if hasattr(dataloader, "set_epoch"):
            dataloader.set_epoch(epoch)
        if sampler is not None:
            sampler.set_epoch(epoch)
