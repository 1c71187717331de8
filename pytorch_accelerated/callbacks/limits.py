"""Callbacks that run fewer batches per epoch, for quick debugging runs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .._internal.argument_checks import check_whole_number
from ..utils import LIMIT_BATCHES_ENV_VAR, DataLoaderSlice
from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer


class LimitedLoader(DataLoaderSlice):
    """A :class:`DataLoaderSlice` put in place by a limiting callback; ``dl`` is the loader it replaced.

    Limits are never nested: limiting a limited loader slices the original with the smaller
    limit, and :func:`unlimit` always gives back the original, whatever order the callbacks
    that installed the limits run in.
    """


def limit(loader: Any, num_batches: int) -> LimitedLoader:
    """Return ``loader`` cut to its first ``num_batches`` batches."""
    if isinstance(loader, LimitedLoader):
        current = loader.num_batches if loader.num_batches is not None else num_batches
        return LimitedLoader(loader.dl, min(num_batches, current))
    return LimitedLoader(loader, num_batches)


def unlimit(loader: Any) -> Any:
    """Return the loader that :func:`limit` replaced (``loader`` itself if it was not limited)."""
    return loader.dl if isinstance(loader, LimitedLoader) else loader


class LimitBatchesCallback(TrainerCallback):
    """Run only the first ``num_batches`` training and evaluation batches of each epoch.

    Meant for quick debugging runs: check that a script runs end to end before the real run.
    The loaders are replaced at the start of each epoch and restored at its end. The run
    config, the placeholders (e.g. ``NUM_UPDATE_STEPS_PER_EPOCH``, so a scheduler made from
    them) and ``max_num_train_steps``'s number of epochs are still computed from the full
    loaders. Put it before ``ProgressBarCallback`` (first in the list) for the bars to show the
    limited lengths. :class:`~pytorch_accelerated.utils.LimitBatches` adds it to every Trainer
    created inside a ``with`` block.

    Args:
        num_batches: batches per epoch (per process), >= 1.
    """

    def __init__(self, num_batches: int) -> None:
        self.num_batches = check_whole_number(num_batches, "num_batches", owner="LimitBatchesCallback")

    def announcement(self) -> str:
        """The line the Trainer prints when this callback comes from ``PT_ACC_LIMIT_BATCHES``."""
        return (
            f"{LIMIT_BATCHES_ENV_VAR}={self.num_batches} is set (by utils.LimitBatches or the "
            f"environment): each epoch runs at most {self.num_batches} batches."
        )

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        # The Trainer tells the loader the epoch (through the slice), so each epoch still
        # takes a new shuffle although accelerate's loader is never run to its end.
        trainer.train_dataloader = limit(trainer.train_dataloader, self.num_batches)

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.train_dataloader = unlimit(trainer.train_dataloader)

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        trainer.eval_dataloader = limit(trainer.eval_dataloader, self.num_batches)

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        trainer.eval_dataloader = unlimit(trainer.eval_dataloader)

    on_evaluation_run_end = on_eval_epoch_end  # a stop skipped on_eval_epoch_end

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        # A StopTrainingError skips the epoch-end events: restore the loaders here as well.
        self._restore(trainer)

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._restore(trainer)

    @staticmethod
    def _restore(trainer: Trainer) -> None:  # (not through an event, which a subclass may override)
        trainer.train_dataloader = unlimit(trainer.train_dataloader)
        trainer.eval_dataloader = unlimit(trainer.eval_dataloader)


def limit_batches_callback_from_env() -> LimitBatchesCallback | None:
    """A :class:`LimitBatchesCallback` if ``PT_ACC_LIMIT_BATCHES`` is set (by
    :class:`~pytorch_accelerated.utils.LimitBatches`, or by a script), else None."""
    value = os.environ.get(LIMIT_BATCHES_ENV_VAR, "").strip()
    if not value or value.lower() == "none":  # "none": how the original library spelled "no limit"
        return None
    try:
        num_batches = int(value)
    except ValueError:
        num_batches = 0
    check_whole_number(
        num_batches if num_batches >= 1 else value,  # the message shows what the variable holds
        f"The environment variable {LIMIT_BATCHES_ENV_VAR} (batches per epoch)",
        hint="Unset it to train on every batch, or use `with pytorch_accelerated.utils.LimitBatches(n):`.",
    )
    return LimitBatchesCallback(num_batches)
