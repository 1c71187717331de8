"""Training with timm's schedulers: :class:`TrainerWithTimmScheduler` (importable from
:mod:`pytorch_accelerated.trainer`, as in 0.1.61)."""

from __future__ import annotations

from .trainer import Trainer


class TrainerWithTimmScheduler(Trainer):
    """A Trainer for timm schedulers, which are stepped per update and per epoch.

    timm schedulers take the number of the update or epoch that comes next:
    ``step_update(num_updates)`` after each optimizer update and ``step(epoch)`` after each
    epoch (with the evaluation loss, when there is one, as the metric).
    """

    def scheduler_step(self) -> None:
        self.scheduler.step_update(num_updates=self.progress.global_step + 1)

    def training_run_epoch_end(self) -> None:
        if self.scheduler is None:
            return
        metric = None
        if self.loaders.eval is not None:  # this run evaluated: its loss is the metric
            metric = self.run_history.get_latest_metric("eval_loss_epoch")
        self.scheduler.step(epoch=self.progress.epoch + 1, metric=metric)
