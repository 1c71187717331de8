"""Synchronise batch-norm statistics across processes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from accelerate import PartialState
from torch import nn

from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

# Device types on which torch's SyncBatchNorm works: on any other, DistributedDataParallel
# refuses to wrap a model holding one ("SyncBatchNorm layers only work with GPU modules") and
# its training forward raises.
SYNC_BATCH_NORM_DEVICE_TYPES = ("cuda", "hpu", "xpu", torch._C._get_privateuse1_backend_name())


class ConvertSyncBatchNormCallback(TrainerCallback):
    """Replace the model's BatchNorm layers by ``torch.nn.SyncBatchNorm`` when training on
    several GPUs, so that batch statistics are computed over the global batch.

    The conversion happens in ``on_init_end``, before the model is wrapped for distribution,
    with ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``; the new layers keep the same
    parameter tensors, so the optimizer created beforehand still updates them.

    The model is left unchanged:

    - on one process, where there is nothing to synchronise;
    - on a group of CPU processes, because torch supports SyncBatchNorm only on GPU-like
      devices (CUDA, XPU, HPU): each process then keeps its own batch statistics, as without
      this callback, and the Trainer prints a line saying so. The same script can thus be
      tried on CPU processes before it runs on GPUs.

    ``converted`` tells whether the model was converted.
    """

    def __init__(self) -> None:
        self.converted = False

    def on_init_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self.converted = False
        if PartialState().num_processes <= 1:
            return
        device_type = trainer.device.type
        if device_type not in SYNC_BATCH_NORM_DEVICE_TYPES:
            trainer.print(
                f"ConvertSyncBatchNormCallback: torch supports SyncBatchNorm only on "
                f"{', '.join(SYNC_BATCH_NORM_DEVICE_TYPES)} devices, not {device_type!r}; batch-norm "
                f"statistics stay per process in this run."
            )
            return
        trainer.model = nn.SyncBatchNorm.convert_sync_batchnorm(trainer.model)
        self.converted = any(isinstance(module, nn.SyncBatchNorm) for module in trainer.model.modules())
