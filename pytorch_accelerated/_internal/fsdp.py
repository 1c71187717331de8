"""FSDP and its sharded tensors (DTensor): telling whether a run, a module or a tensor is
sharded without importing torch's FSDP modules, and refusing what cannot run sharded."""

from __future__ import annotations

import sys
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn


def is_dtensor(value: Any) -> bool:
    """True for a sharded ``torch.distributed.tensor.DTensor`` (FSDP2's parameters and their
    optimizer state). Imports nothing: a DTensor exists only once its module was imported, and
    importing it costs half a second."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def fsdp2_modules(module: nn.Module) -> list[Any]:
    """``module`` and those of its submodules that FSDP2's ``fully_shard`` sharded (imports nothing)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return [] if fsdp is None else [part for part in module.modules() if isinstance(part, fsdp.FSDPModule)]


def uses_fsdp(accelerator: Accelerator) -> bool:
    """True when accelerate runs the model under FSDP (its parameters are sharded)."""
    return bool(accelerator.distributed_type == DistributedType.FSDP)


def refuse_under_fsdp(accelerator: Accelerator, what: str, why: str, fix: str) -> None:
    """Raise a ``ValueError`` saying that ``what`` cannot run under FSDP, ``why``, and ``fix``."""
    if uses_fsdp(accelerator):
        raise ValueError(f"{what} cannot run under FSDP: {why}. {fix}")
