"""The Trainer's default Accelerator and the process group it creates: its collective timeout, a value every
process agrees on, and its destruction when the interpreter exits."""

from __future__ import annotations

import atexit
import contextlib
import math
import os
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, broadcast_object_list

from .accelerator_checks import has_accelerator_device

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
    with contextlib.suppress(ValueError):  # not a number: the error below
        if math.isfinite(seconds := float(text)) and seconds > 0:
            return seconds
    raise ValueError(
        f"The environment variable {name}={text!r} must be a positive number of seconds, "
        f"e.g. {name}={default:g}; unset it for the default ({default:g} s)."
    )


def collective_timeout_s() -> float:
    """The collective timeout of the process groups the Trainer creates, in seconds."""
    return seconds_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S)


#: How long the processes wait for each other while their group forms, when the collective
#: timeout is shorter: they reach that point seconds apart (one imports or builds its model more
#: slowly), and a short ``PT_ACC_COLLECTIVE_TIMEOUT`` is meant for collectives, not for that wait.
#: A process that never arrives is found by the launcher (torchrun ends the others when one
#: exits) or, for a hand-made launch, by the check of :mod:`.launch_checks` before this.
GROUP_FORMATION_TIMEOUT_S = DEFAULT_COLLECTIVE_TIMEOUT_S


def accelerator_with_collective_timeout(**kwargs: Any) -> Accelerator:
    """``Accelerator(**kwargs)`` whose process group, when it creates one, times out collectives
    after :func:`collective_timeout_s`.

    The group forms with the longer of that and :data:`GROUP_FORMATION_TIMEOUT_S`, then one
    barrier under that timeout connects every process (NCCL connects lazily, at the first
    collective); only then does the collective timeout apply. A group created before keeps its
    own timeout.
    """
    collective = timedelta(seconds=collective_timeout_s())
    forms_group = torch.distributed.is_available() and not torch.distributed.is_initialized()
    formation = max(collective, timedelta(seconds=GROUP_FORMATION_TIMEOUT_S))
    accelerator = Accelerator(kwargs_handlers=[InitProcessGroupKwargs(timeout=formation)], **kwargs)
    if forms_group and torch.distributed.is_initialized():
        torch.distributed.barrier()
        # torch.distributed.set_timeout is public from torch 2.14; 2.13 has it under this name.
        set_timeout = getattr(torch.distributed, "set_timeout", None)
        (set_timeout or torch.distributed.distributed_c10d._set_pg_timeout)(collective)
    return accelerator


def default_accelerator() -> Accelerator:
    """The Trainer's Accelerator (configured by ``accelerate config`` / ``launch`` / the environment as
    usual): collectives time out after :func:`collective_timeout_s`, and a group of processes
    launched on a machine with no accelerator forms a CPU (gloo) group."""
    launched_as_group = int(os.environ.get("WORLD_SIZE", "1")) > 1
    return accelerator_with_collective_timeout(cpu=launched_as_group and not has_accelerator_device())


def shared_random_seed(accelerator: Accelerator) -> int:
    """A random seed, the same on every process: process 0 draws it for all."""
    drawn = [int(torch.randint(0, 2**31 - 1, ()).item())]
    if accelerator.num_processes > 1:
        broadcast_object_list(drawn)
    return drawn[0]


_cleanup_registered = False


def destroy_process_group_at_exit(accelerator: Accelerator) -> None:
    """Destroy the process group of ``accelerator`` (if it has several processes) when the
    interpreter exits, once per process.

    Left alive, gloo's threads are still running when the interpreter tears down, and the
    process can abort ("terminate called without an active exception") after a successful
    run, so that the launcher reports a failure.
    """
    global _cleanup_registered
    if accelerator.num_processes > 1 and not _cleanup_registered:
        atexit.register(_destroy_process_group)
        _cleanup_registered = True


def _destroy_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
