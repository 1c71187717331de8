"""What the Trainer needs to know about accelerate's set-up: which wrappers it can step around,
which loaders are already prepared, whether there is an accelerator device."""

from __future__ import annotations

import atexit
import math
import os
import sys
import warnings
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType, InitProcessGroupKwargs, broadcast_object_list
from accelerate.utils.deepspeed import DummyOptim
from torch import nn
from torch.utils.data import DataLoader

#: How long a process waits in a collective operation (all-reduce, barrier, ...) for the others
#: before it fails, unless ``PT_ACC_COLLECTIVE_TIMEOUT`` says otherwise (torch's own default is
#: 30 minutes). Long enough for the main process to write a large checkpoint while the others
#: wait for it; short enough that a process whose peer failed does not sit idle for half an hour.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300.0
COLLECTIVE_TIMEOUT_ENV = "PT_ACC_COLLECTIVE_TIMEOUT"


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name`` (``default`` when unset)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            f"The environment variable {name}={text!r} must be a positive number of seconds, "
            f"e.g. {name}={default:g}; unset it for the default ({default:g} s)."
        )
    return seconds


def collective_timeout_s() -> float:
    """The collective timeout of the process groups the Trainer creates, in seconds."""
    return seconds_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S)


def process_group_kwargs() -> list[InitProcessGroupKwargs]:
    """accelerate's ``kwargs_handlers`` that give the process group :func:`collective_timeout_s`.

    They apply when the Trainer's Accelerator creates the process group (the usual case under
    ``torchrun`` / ``accelerate launch``); a group created earlier keeps its own timeout.
    """
    return [InitProcessGroupKwargs(timeout=timedelta(seconds=collective_timeout_s()))]


def prepare_optimizer(accelerator: Accelerator, optimizer: Any) -> tuple[Any, bool]:
    """Prepare ``optimizer``; return what the loop should step, and whether it steps directly.

    Where accelerate's optimizer wrapper would only call through, the loop (and the scheduler)
    use the optimizer itself: the wrapper costs more than a small model's whole update
    (accelerate 1.15 searches sys.path for lomo_optim twice per ``step()``).
    """
    prepared = accelerator.prepare(optimizer)
    direct = accelerate_steps_pass_through(accelerator)
    if direct and isinstance(prepared, AcceleratedOptimizer):
        return prepared.optimizer, True
    return prepared, direct  # not a torch optimizer (stepped as it is), or accelerate's path


def prepares_together(accelerator: Accelerator, optimizer: Any) -> bool:
    """True under DeepSpeed (or with its ``DummyOptim``): its engine is built from the model,
    the optimizer and the training loader's batch size, so they go to one ``prepare`` call; and
    under FSDP, whose wrapping replaces the parameters that the optimizer must then hold."""
    engines = (DistributedType.DEEPSPEED, DistributedType.FSDP)
    return accelerator.distributed_type in engines or isinstance(optimizer, DummyOptim)


def prepare_together(
    accelerator: Accelerator, model: nn.Module, optimizer: Any, train_loader: Any
) -> tuple[Any, Any, Any]:
    """Prepare model, optimizer (if any) and training loader (if not prepared yet) in one
    ``prepare`` call; return the three, each unchanged where it was not passed."""
    objects: list[Any] = [model]
    objects += [optimizer] if optimizer is not None else []
    objects += [train_loader] if needs_preparing(train_loader) else []
    prepared = list(accelerator.prepare(*objects)) if len(objects) > 1 else [accelerator.prepare(model)]
    model = prepared.pop(0)
    optimizer = prepared.pop(0) if optimizer is not None else None
    return model, optimizer, (prepared.pop(0) if prepared else train_loader)


def shared_random_seed(accelerator: Accelerator) -> int:
    """A random seed, the same on every process: process 0 draws it for all."""
    drawn = [int(torch.randint(0, 2**31 - 1, ()).item())]
    if accelerator.num_processes > 1:
        broadcast_object_list(drawn)
    return drawn[0]


def needs_preparing(dataloader: Any) -> bool:
    # accelerate's prepared loaders are DataLoader subclasses too; never wrap one twice.
    return isinstance(dataloader, DataLoader) and not isinstance(
        dataloader, (DataLoaderShard, DataLoaderDispatcher)
    )


#: Set-ups where ``Accelerator.backward`` and the prepared optimizer's ``step``/``zero_grad`` only
#: call through to torch. Not DeepSpeed, Megatron-LM or XLA, whose engines do the stepping, nor
#: FSDP, which stays on accelerate's path.
_PASS_THROUGH_DISTRIBUTED_TYPES = frozenset(
    getattr(DistributedType, name)
    for name in (
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "MULTI_HPU",
    )
    if hasattr(DistributedType, name)
)


def accelerate_steps_pass_through(accelerator: Accelerator) -> bool:
    """True where accelerate's backward and optimizer wrapper would add only their cost: no
    fp16 loss scaler, no LOMO optimizer, no accumulation by accelerate, plain data parallelism."""
    return (
        accelerator.scaler is None
        and not accelerator.has_lomo_optimizer
        and accelerator.gradient_accumulation_steps == 1
        and accelerator.distributed_type in _PASS_THROUGH_DISTRIBUTED_TYPES
    )


def has_accelerator_device() -> bool:
    accelerator_api = getattr(torch, "accelerator", None)
    if accelerator_api is not None and hasattr(accelerator_api, "is_available"):
        return bool(accelerator_api.is_available())
    return torch.cuda.is_available()


def check_accelerator(accelerator: Accelerator) -> None:
    """Fail fast on a launch whose processes did not form one group, or on accelerate-side
    accumulation; warn when the precision asked for cannot run here (fp16 on a CPU), or when
    FSDP was asked for but accelerate runs something else (on a CPU)."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != accelerator.num_processes:
        raise RuntimeError(
            f"The launcher started {launched} processes (WORLD_SIZE={launched}), but each one "
            f"joined a group of {accelerator.num_processes}: they would all train the whole "
            f"run separately. On a machine without GPUs, launch with `torchrun --nproc_per_node "
            f"{launched} script.py`, or set ACCELERATE_USE_CPU=1 with `accelerate launch "
            f"--multi_gpu --num_processes {launched} script.py` (`--cpu` starts one process only)."
        )
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
        warn_on_first_process(accelerator, message)


#: Where accelerate hands mixed precision to another engine (its own config decides).
_ENGINES_WITH_OWN_PRECISION = frozenset(
    getattr(DistributedType, name) for name in ("DEEPSPEED", "MEGATRON_LM") if hasattr(DistributedType, name)
)


def unavailable_precision_message(accelerator: Accelerator) -> str | None:
    """What to say when ``accelerator`` was asked for a precision it will not run, else None.

    accelerate 1.16 asked for fp16 on a CPU uses neither fp16 autocast nor a gradient scaler,
    and says nothing: the run is in full precision (fp32).
    """
    requested = str(accelerator.mixed_precision)
    if (
        requested != "fp16"
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


def warn_on_first_process(accelerator: Accelerator, message: str | None) -> None:
    """Warn with ``message`` (when there is one) once per machine, on its first process: a
    configuration that was asked for but cannot run here."""
    if message is not None and accelerator.is_local_main_process:
        warnings.warn(message, UserWarning, stacklevel=4)  # the line that created the Trainer


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


def fsdp_requested() -> bool:
    """True when FSDP was asked for: ``accelerate launch --use_fsdp`` (or ``accelerate config``)
    sets ``ACCELERATE_USE_FSDP=true``, and so does an Accelerator given an ``fsdp_plugin``."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").strip().lower() == "true"


def dropped_fsdp_message(accelerator: Accelerator) -> str | None:
    """What to say when FSDP was asked for but accelerate runs something else, else None.

    accelerate 1.16 enables FSDP only for a group of processes on accelerator devices (GPUs,
    ...): on CPU processes, or in a single process, it silently runs without sharding.
    """
    engine = accelerator.distributed_type
    if not fsdp_requested() or engine in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return None
    processes = accelerator.num_processes
    if engine == DistributedType.NO:
        instead = "a single process that holds the whole model and optimizer state"
    else:
        backend = accelerator.state.backend or "its backend"
        instead = (
            f"plain data parallelism (DDP over {backend}) on {processes} {accelerator.device.type.upper()} "
            f"processes, each holding the whole model and optimizer state"
        )
    return (
        f"FSDP was requested (ACCELERATE_USE_FSDP=true, from `accelerate launch --use_fsdp`, the accelerate "
        f"config or an fsdp_plugin), but accelerate runs {instead}: it enables FSDP only for a group of "
        f"processes on GPUs (or other accelerator devices), so nothing is sharded here. To shard, launch on "
        f"GPUs (`accelerate launch --use_fsdp --fsdp_version 2 --num_processes N script.py`); to run as "
        f"now without this warning, leave out --use_fsdp and the fsdp_plugin."
    )


_cleanup_registered = False


def destroy_process_group_at_exit() -> None:
    """Destroy the process group when the interpreter exits, once per process.

    Left alive, gloo's threads are still running when the interpreter tears down, and the
    process can abort ("terminate called without an active exception") after a successful
    run, so that the launcher reports a failure.
    """
    global _cleanup_registered
    if not _cleanup_registered:
        atexit.register(_destroy_process_group)
        _cleanup_registered = True


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
