"""The Trainer's data loaders: how they are made, seeded and prepared (a base class of the Trainer).

Methods without a prefix are meant to be overridden, as in the Trainer: ``get_default_*_dl_kwargs``
give the default ``DataLoader`` arguments, ``create_*_dataloader`` build the loaders. The
samplers and loader defaults themselves live in :mod:`pytorch_accelerated.data`.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader

from ._internal.preparation import needs_preparing, prepare_optimizer, prepare_together, prepares_together
from ._internal.process_group import shared_random_seed
from .data import (
    ReproducibleShuffleSampler,
    default_dataloader_kwargs,
    is_map_style,
    merge_dataloader_kwargs,
    prepare_eval_dataloader,
    shard_evaluation,
)
from .run_config import RunState, TrainerRunConfig


class DataLoaderMethods:
    """The Trainer's data-loader methods and the preparation of model, optimizer and loaders."""

    _accelerator: Accelerator
    model: nn.Module
    optimizer: Any
    train_dataset: Any
    eval_dataset: Any
    collate_fn: Any
    run_state: RunState
    run_config: TrainerRunConfig | None
    _seed: int | None
    _train_generator: torch.Generator | None
    _train_dataloader: Any
    _eval_dataloader: Any
    _prepared_model: nn.Module | None
    _prepared_optimizer: Any
    _direct_steps: bool
    #: The merged loader arguments of this run's ``create_*_dataloader`` calls ("train", "eval").
    _merged_dl_kwargs: dict[str, dict[str, Any]]

    def _create_dataloaders(
        self, batch_size: int, train_kwargs: dict[str, Any] | None, eval_kwargs: dict[str, Any] | None
    ) -> None:
        self._merged_dl_kwargs = {}
        self._train_dataloader = self.create_train_dataloader(batch_size, train_kwargs)
        if self.eval_dataset is not None:
            self._eval_dataloader = self.create_eval_dataloader(batch_size, eval_kwargs)

    def _run_config_dl_kwargs(
        self, train_kwargs: dict[str, Any] | None, eval_kwargs: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The loader arguments the run config records: the merged ones the default
        ``create_*_dataloader`` used, else (overridden) the ones passed to ``train()``."""
        merged = getattr(self, "_merged_dl_kwargs", {})
        return {
            "train_dl_kwargs": merged.get("train", train_kwargs),
            "eval_dl_kwargs": merged.get("eval", eval_kwargs),
        }

    def _set_evaluation_run_config(self, batch_size: int, eval_kwargs: dict[str, Any] | None) -> None:
        """Give an evaluation on a Trainer that has not trained its own run config (callbacks
        read e.g. ``run_config.is_world_process_zero``); a training run's config is kept."""
        if self.run_config is None or self.run_config.evaluation_only:
            kwargs = getattr(self, "_merged_dl_kwargs", {}).get("eval", eval_kwargs)
            self.run_config = TrainerRunConfig.for_evaluation(
                self._accelerator, per_device_batch_size=batch_size, eval_dl_kwargs=kwargs, seed=self._seed
            )

    def _record_dl_kwargs(self, which: str, kwargs: dict[str, Any]) -> None:
        self._merged_dl_kwargs = {**getattr(self, "_merged_dl_kwargs", {}), which: dict(kwargs)}

    def get_default_train_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Data-loader arguments for training; ``train_dataloader_kwargs`` are merged over them."""
        kwargs = self._default_dl_kwargs(self.train_dataset, batch_size)
        kwargs["shuffle"] = True
        return kwargs

    def get_default_eval_dl_kwargs(self, batch_size: int) -> dict[str, Any]:
        """Data-loader arguments for evaluation; ``eval_dataloader_kwargs`` are merged over them."""
        kwargs = self._default_dl_kwargs(self.eval_dataset, batch_size)
        kwargs["shuffle"] = False
        return kwargs

    def _default_dl_kwargs(self, dataset: Any, batch_size: int) -> dict[str, Any]:
        return default_dataloader_kwargs(
            dataset, batch_size, self._accelerator.device, self._seed, self._accelerator.num_processes
        )

    def create_train_dataloader(
        self, batch_size: int, train_dl_kwargs: dict[str, Any] | None = None
    ) -> DataLoader:
        """Return the training ``DataLoader`` (before it is prepared for distribution)."""
        kwargs = merge_dataloader_kwargs(self.get_default_train_dl_kwargs(batch_size), train_dl_kwargs)
        self._record_dl_kwargs("train", kwargs)
        self.run_state.train_sampler = None
        self._train_generator = kwargs.get("generator")
        if kwargs.pop("shuffle", False) and is_map_style(self.train_dataset):
            sampler = ReproducibleShuffleSampler(len(self.train_dataset), self._shuffle_seed())
            kwargs["sampler"] = self.run_state.train_sampler = sampler
        return DataLoader(dataset=self.train_dataset, collate_fn=self.collate_fn, **kwargs)

    def create_eval_dataloader(
        self, batch_size: int, eval_dl_kwargs: dict[str, Any] | None = None
    ) -> DataLoader:
        """Return the evaluation ``DataLoader``.

        By default every process gets its own share of the samples, each sample exactly once,
        and the same number of batches (see :class:`~pytorch_accelerated.data.ShardedEvalBatchSampler`).
        """
        kwargs = merge_dataloader_kwargs(self.get_default_eval_dl_kwargs(batch_size), eval_dl_kwargs)
        self._record_dl_kwargs("eval", kwargs)
        custom_order = any(key in (eval_dl_kwargs or {}) for key in ("sampler", "batch_sampler"))
        if is_map_style(self.eval_dataset) and not custom_order and not kwargs.get("shuffle"):
            processes = (self._accelerator.num_processes, self._accelerator.process_index)
            kwargs = shard_evaluation(
                kwargs, len(self.eval_dataset), kwargs.get("batch_size") or batch_size, *processes
            )
        return DataLoader(dataset=self.eval_dataset, collate_fn=self.collate_fn, **kwargs)

    def _prepare_model_optimizer_and_dataloaders(self) -> None:
        """Wrap the model and optimizer for distribution (once) and prepare the data loaders.

        Under DeepSpeed (or with its ``DummyOptim``) model, optimizer and training loader go to
        one ``prepare`` call, as DeepSpeed needs; otherwise each is prepared on its own, so that a
        plain optimizer can be stepped directly where accelerate's wrapper would only call through.
        """
        model_pending = self._prepared_model is None or self.model is not self._prepared_model
        optimizer_pending = self.optimizer is not None and self.optimizer is not self._prepared_optimizer
        if (model_pending or optimizer_pending) and prepares_together(self._accelerator, self.optimizer):
            prepared = prepare_together(self._accelerator, self.model, self.optimizer, self._train_dataloader)
            self.model, self.optimizer, self._train_dataloader = prepared
            self._prepared_model, self._prepared_optimizer, self._direct_steps = (
                self.model,
                self.optimizer,
                False,
            )
        if self._prepared_model is None or self.model is not self._prepared_model:
            if any(parameter.requires_grad for parameter in self.model.parameters()):
                self.model = self._accelerator.prepare(self.model)
                self._prepared_model = self.model
            else:  # DDP refuses a model with nothing to train: placed only, wrapped once it trains
                self.model = self._accelerator.prepare_model(self.model, evaluation_mode=True)
        if self.optimizer is not None and self.optimizer is not self._prepared_optimizer:
            self.optimizer, self._direct_steps = prepare_optimizer(self._accelerator, self.optimizer)
            self._prepared_optimizer = self.optimizer
        if needs_preparing(self._train_dataloader):
            self._train_dataloader = self._accelerator.prepare(self._train_dataloader)
        self._eval_dataloader = prepare_eval_dataloader(self._accelerator, self._eval_dataloader)

    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed
        if seed is not None:
            set_seed(seed)

    def _shuffle_seed(self) -> int:
        return self._seed if self._seed is not None else shared_random_seed(self._accelerator)

    @property
    def train_dataloader(self) -> Any:
        """The prepared training data loader of the current run."""
        return self._train_dataloader

    @train_dataloader.setter
    def train_dataloader(self, dataloader: Any) -> None:
        """Replace the training loader; set in ``on_train_epoch_start`` it is used for that epoch."""
        self._train_dataloader = dataloader

    @property
    def eval_dataloader(self) -> Any:
        """The prepared evaluation data loader of the current run or evaluation."""
        return self._eval_dataloader

    @eval_dataloader.setter
    def eval_dataloader(self, dataloader: Any) -> None:
        """Replace the evaluation loader; set in ``on_eval_epoch_start`` it is used for that epoch."""
        self._eval_dataloader = dataloader
