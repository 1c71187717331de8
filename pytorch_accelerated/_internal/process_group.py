"""The Trainer's default Accelerator and the process group it creates: its collective timeout, a value every
process agrees on, and its destruction when the interpreter exits."""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs, broadcast_object_list

from . import agent_store
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
    # Under torchrun, on a namespace of the agent's store of its own (see agent_store).
    init = InitProcessGroupKwargs(timeout=formation, init_method=agent_store.init_method())
    accelerator = Accelerator(kwargs_handlers=[init], **kwargs)
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


#: The name torch gives the worker threads of a gloo process group (c10d's ``ProcessGroupGloo::runLoop``).
GLOO_WORKER_THREAD = "pt_gloo_runloop"
#: How long the exit waits at most for those threads to be idle. They are idle microseconds after
#: the last collective; one still busy after this long is stuck in a collective that a failed
#: peer never joined, and will not free anything before the process has ended.
GLOO_SETTLE_LIMIT_S = 2.0


def destroy_process_group_at_exit(accelerator: Accelerator) -> None:
    """When the interpreter exits (if ``accelerator`` has several processes; registered once per
    process): destroy the process group, then wait until gloo's worker threads are idle
    (:func:`wait_until_gloo_workers_idle`), so that a finished run exits with code 0.

    Why: a gloo collective's worker thread marks the collective done, which lets the main thread
    go on, and only then drops its own reference to the collective, freeing its tensors. Freeing a
    tensor that Python also knows needs the GIL. When the main thread has meanwhile reached the end
    of the script and begun to finalize the interpreter, Python ends any other thread that asks for
    the GIL (``pthread_exit``); ending a thread unwinds its stack, and unwinding through the
    collective's ``noexcept`` destructor calls ``std::terminate``: the process aborts
    ("terminate called without an active exception", SIGABRT) after a successful run. Destroying
    the group is not enough alone: it joins the threads only when nothing else holds the group
    (a DistributedDataParallel model does).
    """
    if accelerator.num_processes > 1:
        _register_release_at_exit()


@functools.cache  # once per process, at the first Trainer: atexit runs it after later handlers
def _register_release_at_exit() -> None:
    atexit.register(_release_process_group)


def _release_process_group() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    wait_until_gloo_workers_idle()


def wait_until_gloo_workers_idle(limit_s: float = GLOO_SETTLE_LIMIT_S) -> bool:
    """Wait, the GIL released, until every gloo worker thread of this process is idle: asleep, and
    not woken for 5 ms; at most ``limit_s`` seconds. Return whether they are (True at once where
    there are none, or where the threads of a process cannot be seen: no ``/proc``)."""
    deadline = time.monotonic() + limit_s
    before = _gloo_worker_states()
    while True:
        time.sleep(0.005)  # the GIL is free meanwhile: a worker that needs it to free a tensor takes it
        after = _gloo_worker_states()
        if after == before and all(state == "S" for state, _ in after.values()):
            return True
        if time.monotonic() > deadline:
            return False
        before = after


def _gloo_worker_states() -> dict[str, tuple[str, int]]:
    """Each gloo worker thread of this process (by thread id): its state (``S``: asleep, ``R``:
    running or ready to run, ...) and how many times it has been switched out so far."""
    states = {}
    with contextlib.suppress(OSError):  # no /proc: nothing to see
        for task in Path("/proc/self/task").iterdir():
            with contextlib.suppress(OSError, KeyError, ValueError):  # a thread that ended meanwhile
                if (task / "comm").read_text().strip() != GLOO_WORKER_THREAD:
                    continue
                status = dict(
                    line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line
                )
                switches = sum(
                    int(status[key]) for key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")
                )
                states[task.name] = (status["State"].split()[0], switches)
    return states
