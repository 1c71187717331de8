"""Synchronise batch-norm statistics across processes."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import PartialState
from torch import nn

from .base import TrainerCallback

# Device types on which torch's SyncBatchNorm can synchronise in training mode (torch 2.x
# raises "SyncBatchNorm expected input tensor to be on GPU ..." for any other).
_SYNC_DEVICE_TYPES = ("cuda", "hpu", "xpu", torch._C._get_privateuse1_backend_name())


class ConvertSyncBatchNormCallback(TrainerCallback):
    """Replace the model's BatchNorm layers by ``torch.nn.SyncBatchNorm`` when training on
    several processes, so that batch statistics are computed over the global batch.

    The conversion happens in ``on_init_end``, before the model is wrapped for distribution,
    with ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (the new layers keep the same
    parameters, so the optimizer still updates them). On one process the model is left
    unchanged: there is nothing to synchronise.

    torch synchronises batch norm only on GPUs (and XPU/HPU devices): on a group of CPU
    processes the model is converted, evaluation works (it uses the running statistics), but a
    training run stops at its start with an error saying so.
    """

    def __init__(self) -> None:
        #: True once the model of the Trainer holds SyncBatchNorm layers.
        self.converted = False

    def on_init_end(self, trainer: Any, **kwargs: Any) -> None:
        if PartialState().num_processes > 1:
            trainer.model = nn.SyncBatchNorm.convert_sync_batchnorm(trainer.model)
            self.converted = any(isinstance(module, nn.SyncBatchNorm) for module in trainer.model.modules())

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.converted and trainer.device.type not in _SYNC_DEVICE_TYPES:
            raise RuntimeError(
                f"ConvertSyncBatchNormCallback converted the model's BatchNorm layers to "
                f"SyncBatchNorm, but torch can only synchronise them on GPUs "
                f"({', '.join(_SYNC_DEVICE_TYPES)}), not on {trainer.device.type!r}. Remove the "
                f"callback for runs on {trainer.device.type!r} processes."
            )
