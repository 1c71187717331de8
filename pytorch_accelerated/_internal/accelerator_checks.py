"""Checks of the Accelerator a Trainer was given: processes that did not form one group and
accumulation configured in accelerate fail fast; a precision or FSDP that was asked for but
cannot run here, and a group that a torchrun restart could not form again, are warnings. Also
whether this machine has an accelerator device."""

from __future__ import annotations

import os
import warnings

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from .agent_store import warn_if_restarts_reuse_the_agent_store


def has_accelerator_device() -> bool:
    accelerator_api = getattr(torch, "accelerator", None)
    return (
        bool(accelerator_api.is_available())
        if accelerator_api is not None and hasattr(accelerator_api, "is_available")
        else torch.cuda.is_available()
    )


def check_accelerator(accelerator: Accelerator, created_by: str = "Trainer._create_accelerator") -> None:
    """Fail fast on a launch whose processes did not form one group, or on accelerate-side
    accumulation; warn when the precision asked for cannot run here (fp16 on a CPU), or when
    FSDP was asked for but accelerate runs something else (on a CPU), or when torchrun will
    restart a group formed on its own store without a namespace of its own (see
    :mod:`.agent_store`). ``created_by`` names the method that made ``accelerator`` (an
    override's qualified name), for the message."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise RuntimeError(_not_one_group_message(accelerator, launched, created_by))
    # Under DeepSpeed this is its config's value; train() says what to do with it.
    if (
        accelerator.gradient_accumulation_steps != 1
        and accelerator.distributed_type != DistributedType.DEEPSPEED
    ):
        raise ValueError(
            f"The Accelerator was configured with gradient_accumulation_steps="
            f"{accelerator.gradient_accumulation_steps}; the Trainer handles accumulation "
            f"itself. Remove it from the accelerate config and pass "
            f"train(gradient_accumulation_steps=...) instead."
        )
    for message in (unavailable_precision_message(accelerator), dropped_fsdp_message(accelerator)):
        if message is not None and accelerator.is_local_main_process:  # once per machine
            warnings.warn(message, UserWarning, stacklevel=3)  # the line that created the Trainer
    warn_if_restarts_reuse_the_agent_store()


def _not_one_group_message(accelerator: Accelerator, launched: int, created_by: str) -> str:
    problem = (
        f"The launcher started {launched} processes (WORLD_SIZE={launched}), but each one joined a "
        f"group of {accelerator.num_processes}: they would all train the whole run separately."
    )
    if created_by == "Trainer._create_accelerator" or has_accelerator_device():
        return (
            f"{problem} On a machine without GPUs, launch with `torchrun --nproc_per_node {launched} "
            f"script.py`, or set ACCELERATE_USE_CPU=1 with `accelerate launch --multi_gpu "
            f"--num_processes {launched} script.py` (`--cpu` starts one process only)."
        )
    # The launch was right: an Accelerator made by an override, on a machine without GPUs,
    # joins the processes into one group only when told to run on the CPU.
    precision = str(accelerator.mixed_precision)
    example = f"Accelerator(cpu=True{'' if precision == 'no' else f', mixed_precision={precision!r}'}, ...)"
    return (
        f"{problem} The Accelerator comes from {created_by}, and on a machine without GPUs "
        f"accelerate forms a group of processes only when told to run on the CPU (the Trainer's "
        f"default Accelerator does this; an override must do it itself). Create it with "
        f"{example} in {created_by}, or set ACCELERATE_USE_CPU=1 for the launch "
        f"(`ACCELERATE_USE_CPU=1 torchrun --nproc_per_node {launched} script.py`)."
    )


#: Where accelerate hands mixed precision to another engine (its own config decides).
_ENGINES_WITH_OWN_PRECISION = frozenset(
    getattr(DistributedType, name) for name in ("DEEPSPEED", "MEGATRON_LM") if hasattr(DistributedType, name)
)


def unavailable_precision_message(accelerator: Accelerator) -> str | None:
    """What to say when ``accelerator`` was asked for a precision it will not run, else None.

    accelerate 1.16 asked for fp16 on a CPU uses neither fp16 autocast nor a gradient scaler,
    and says nothing: the run is in full precision (fp32).
    """
    if (
        str(accelerator.mixed_precision) != "fp16"
        or accelerator.native_amp
        or accelerator.distributed_type in _ENGINES_WITH_OWN_PRECISION
    ):
        return None
    return (
        f"mixed_precision='fp16' was requested, but fp16 does not run on this {accelerator.device.type.upper()} "
        f"device: accelerate uses neither fp16 autocast nor a gradient scaler here, so training runs in "
        f"full precision (fp32). For mixed precision on a CPU, use bf16 (`accelerate launch "
        f"--mixed_precision bf16`, or Accelerator(mixed_precision='bf16') in _create_accelerator); "
        f"fp16 needs a GPU."
    )


def dropped_fsdp_message(accelerator: Accelerator) -> str | None:
    """What to say when FSDP was asked for but accelerate runs something else, else None.

    accelerate 1.16 enables FSDP only for a group of processes on accelerator devices (GPUs,
    ...): on CPU processes, or in a single process, it silently runs without sharding.
    """
    engine = accelerator.distributed_type
    # FSDP was asked for: `accelerate launch --use_fsdp` (or `accelerate config`) sets
    # ACCELERATE_USE_FSDP=true, and so does an Accelerator given an fsdp_plugin.
    if os.environ.get("ACCELERATE_USE_FSDP", "false").strip().lower() != "true" or engine in (
        DistributedType.FSDP,
        DistributedType.DEEPSPEED,
    ):
        return None
    if engine == DistributedType.NO:
        instead = "a single process that holds the whole model and optimizer state"
    else:
        instead = (
            f"plain data parallelism (DDP over {accelerator.state.backend or 'its backend'}) on "
            f"{accelerator.num_processes} {accelerator.device.type.upper()} "
            f"processes, each holding the whole model and optimizer state"
        )
    return (
        f"FSDP was requested (ACCELERATE_USE_FSDP=true, from `accelerate launch --use_fsdp`, the accelerate "
        f"config or an fsdp_plugin), but accelerate runs {instead}: it enables FSDP only for a group of "
        f"processes on GPUs (or other accelerator devices), so nothing is sharded here. To shard, launch on "
        f"GPUs (`accelerate launch --use_fsdp --fsdp_version 2 --num_processes N script.py`); to run as "
        f"now without this warning, leave out --use_fsdp and the fsdp_plugin."
    )
