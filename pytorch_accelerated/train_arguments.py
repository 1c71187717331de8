"""The arguments of one ``train()`` call: :class:`TrainArguments`, with the per-device batch size of
training that follows from them (the loaders', whichever way it was given). They are checked in one
place, :func:`~pytorch_accelerated._internal.argument_checks.check_train_arguments`, beside the
checks of every other argument.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .data import loader_batch_size


@dataclass(frozen=True)
class TrainArguments:
    """What ``train()`` was given (see :meth:`~pytorch_accelerated.trainer.Trainer.train`), frozen.

    ``gradient_accumulation_steps`` is the one asked for: a run that ``resume_from="auto"`` resumes on
    another number of processes may use another, which keeps the saved global batch (its run config
    says which).
    """

    train_dataset: Any
    num_epochs: int
    eval_dataset: Any
    per_device_batch_size: int
    max_num_train_steps: int | None
    gradient_accumulation_steps: int
    gradient_clip_value: float | None
    create_scheduler_fn: Callable[..., Any] | None
    train_dataloader_kwargs: dict[str, Any] | None
    eval_dataloader_kwargs: dict[str, Any] | None
    reset_run_history: bool
    collate_fn: Callable[..., Any] | None
    resume_from: str | os.PathLike | None
    max_grad_norm: float | None
    seed: int | None

    @property
    def train_batch_size(self) -> int:
        """The per-device batch size of training: a ``batch_size`` in ``train_dataloader_kwargs`` wins."""
        return loader_batch_size(self.train_dataloader_kwargs, self.per_device_batch_size)
