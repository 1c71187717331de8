"""The arguments of one ``train()`` call: :class:`TrainArguments`, checked in one place, with the
per-device batch size of training that follows from them (the loaders', whichever way it was given).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from accelerate import Accelerator
from torch import nn

from ._internal.argument_checks import (
    check_accumulation_supported,
    check_clipping_supported,
    check_collate_fn,
    check_dataloader_kwargs,
    check_dataset,
    check_flag,
    check_optimizer_holds_model_parameters,
    check_optional_callable,
    check_positive_number,
    check_seed,
    check_whole_number,
)
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

    def check(self, accelerator: Accelerator, model: nn.Module, optimizer: Any) -> None:
        """Check every argument before anything is set up; ``accelerator`` tells which clipping and
        accumulation its set-up supports.

        Raises:
            ValueError / TypeError: naming the argument, the value seen and the fix.
        """
        if optimizer is None:
            raise ValueError(
                "train() needs an optimizer, but the Trainer was created with optimizer=None. Pass "
                "one, e.g. Trainer(model, loss_func, torch.optim.AdamW(model.parameters()))."
            )
        check_optimizer_holds_model_parameters(model, optimizer)
        check_whole_number(self.num_epochs, "num_epochs")
        check_whole_number(self.per_device_batch_size, "per_device_batch_size")
        check_whole_number(self.gradient_accumulation_steps, "gradient_accumulation_steps")
        check_whole_number(self.max_num_train_steps, "max_num_train_steps", optional=True)
        check_positive_number(self.gradient_clip_value, "gradient_clip_value")
        check_positive_number(self.max_grad_norm, "max_grad_norm")
        check_clipping_supported(accelerator, self.gradient_clip_value)
        check_accumulation_supported(accelerator, self.gradient_accumulation_steps)
        check_dataset(self.train_dataset, "train_dataset")
        if self.eval_dataset is not None:
            check_dataset(self.eval_dataset, "eval_dataset")
        check_optional_callable(
            self.create_scheduler_fn,
            "create_scheduler_fn",
            "a function optimizer -> scheduler",
            " E.g. create_scheduler_fn=CosineLrScheduler.create_scheduler_fn() or "
            "functools.partial(torch.optim.lr_scheduler.StepLR, step_size=10).",
        )
        check_collate_fn(self.collate_fn)
        check_seed(self.seed)
        check_flag(self.reset_run_history, "reset_run_history")
        self._check_resume_from()
        check_dataloader_kwargs(self.train_dataloader_kwargs, "train_dataloader_kwargs")
        check_dataloader_kwargs(self.eval_dataloader_kwargs, "eval_dataloader_kwargs")

    def _check_resume_from(self) -> None:
        if self.resume_from is not None and not isinstance(self.resume_from, (str, os.PathLike)):
            raise TypeError(
                f"resume_from must be a path (str or os.PathLike) to a training state or a folder of "
                f'them, "auto" (the folder of the SaveTrainingStateCallback, or a new run), or None; got '
                f"{self.resume_from!r} ({type(self.resume_from).__name__})."
            )
