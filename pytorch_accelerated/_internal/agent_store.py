"""The process group formed on torchrun's own store, in a namespace of its own for every attempt.

Under ``torchrun``, ``accelerate launch`` and ``notebook_launcher``, torch's elastic agent holds the
store that its workers form their process group on (``TORCHELASTIC_USE_AGENT_STORE=True``: the
static rendezvous of ``--master_addr``/``--master_port``, or ``--rdzv-backend c10d`` without
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``). The store outlives the workers. When the agent starts
them again (``--max-restarts``, or a change of membership), the new processes form their group on
the very keys the dead ones wrote there: a new process reads the address of a dead one, and either
fails to connect (``Gloo connectFullMesh failed ... Connection refused``) or waits for it until
the formation times out (pytorch/pytorch#135712). ``TORCHELASTIC_RESTART_COUNT`` cannot name the
attempt: each agent counts its own restarts, and machines can disagree.

So the Trainer forms its group under a key prefix that is new for every attempt, agreed on without
trusting anything an earlier attempt may have left: process 0 draws a token; every other process
asks for it under a nonce it has just drawn (a key no earlier attempt can have written), and waits
for the answer there; process 0 answers every nonce it finds until every other process has said,
under the token, that it has it. The group's keys then live under ``pytorch_accelerated/attempt/
<token>``. It costs a few store round trips per process.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import parse_qsl, urlparse

import torch

#: The ``init_method`` scheme of a group formed this way (torch's ``register_rendezvous_handler``).
SCHEME = "pytorch-accelerated-attempt"
_PREFIX = "pytorch_accelerated/attempt"
_POLL_S = 0.01
#: What torch's elastic agent sets in the environment of its workers: the restart count, the maximum.
ENV_RESTARTS = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


def torchrun_restarts_left() -> int:
    """How many more times torch's elastic agent (``torchrun --max-restarts N``) will restart this
    process's group if it fails (``TORCHELASTIC_MAX_RESTARTS - TORCHELASTIC_RESTART_COUNT``); 0
    without an agent."""
    count, most = (os.environ.get(name, "").strip() for name in ENV_RESTARTS)
    return max(int(most) - int(count), 0) if count.isdigit() and most.isdigit() else 0


def forms_on_agent_store() -> bool:
    """Whether a process group formed now would use torch's elastic agent's store."""
    return (
        os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1
        and torch.distributed.is_available()
        and not torch.distributed.is_initialized()
    )


def init_method() -> str | None:
    """The ``init_method`` for the process group the Trainer's Accelerator forms: a namespace of its
    own on the agent's store when :func:`forms_on_agent_store`; else None (torch's ``env://``)."""
    if not forms_on_agent_store():
        return None
    with contextlib.suppress(RuntimeError):  # registered by an earlier Trainer of this process
        torch.distributed.register_rendezvous_handler(SCHEME, _rendezvous)
    return f"{SCHEME}://"


def _rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: object) -> Iterator[tuple]:
    """torch's rendezvous handler for :data:`SCHEME`: the agent's store (``MASTER_ADDR:MASTER_PORT``)
    under this attempt's prefix, this process's rank, and the number of processes."""
    query = dict(parse_qsl(urlparse(url).query))
    rank = int(query.get("rank", os.environ["RANK"]))
    world_size = int(query.get("world_size", os.environ["WORLD_SIZE"]))
    store = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    token = hand_out_token(store, world_size, timeout) if rank == 0 else ask_for_token(store, rank, timeout)
    yield torch.distributed.PrefixStore(f"{_PREFIX}/{token}", store), rank, world_size
    raise RuntimeError("A process group formed on torchrun's store cannot rendezvous again: form a new one.")


def ask_for_token(store: torch.distributed.Store, rank: int, timeout: timedelta) -> str:
    """On a process other than 0: this attempt's token, from process 0."""
    nonce = uuid.uuid4().hex
    store.set(f"{_PREFIX}/ask/{rank}", nonce)
    answer = f"{_PREFIX}/answer/{nonce}"
    try:
        store.wait([answer], timeout)
    except RuntimeError as error:  # torch's DistStoreError: the time is up
        raise RuntimeError(
            f"RANK={rank} waited {timeout.total_seconds():g} s for process 0 (RANK=0) to form the process "
            f"group on torchrun's store at MASTER_ADDR:MASTER_PORT={os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')}, and it did not come: it failed or is still busy before creating "
            f"the Trainer (see its output)."
        ) from error
    token = store.get(answer).decode()
    store.add(f"{_PREFIX}/{token}/joined", 1)
    return token


def hand_out_token(store: torch.distributed.Store, world_size: int, timeout: timedelta) -> str:
    """On process 0: draw this attempt's token and answer every process that asks, until all
    ``world_size - 1`` others have it."""
    token, answered = uuid.uuid4().hex, dict[int, str]()
    deadline = time.monotonic() + timeout.total_seconds()
    while (joined := store.add(f"{_PREFIX}/{token}/joined", 0)) < world_size - 1:
        for rank in range(1, world_size):
            asked = f"{_PREFIX}/ask/{rank}"
            # A nonce of an earlier attempt is answered too: no process waits for that answer.
            if store.check([asked]) and (nonce := store.get(asked).decode()) != answered.get(rank):
                store.set(f"{_PREFIX}/answer/{nonce}", token)
                answered[rank] = nonce
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Process 0 (RANK=0) waited {timeout.total_seconds():g} s for the other processes of this "
                f"launch to form the process group on torchrun's store, and {joined} of {world_size - 1} "
                f"came: the others failed or are still busy before creating the Trainer (see their output)."
            )
        time.sleep(_POLL_S)
    return token


def warn_if_restarts_reuse_the_agent_store() -> None:
    """Warn (on rank 0) when torchrun will restart this group and its process group was formed on
    the agent's store without a namespace of its own: by an Accelerator other than the Trainer's
    default one (an override of ``_create_accelerator``), or before the Trainer was created."""
    if (
        torchrun_restarts_left() == 0
        or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        or os.environ.get("RANK", "0") != "0"
        or not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or int(os.environ.get("WORLD_SIZE", "1") or 1) < 2
        # the init_method torch recorded for the default group (a private name: absent, no warning)
        or getattr(torch.distributed.distributed_c10d, "_default_pg_init_method", SCHEME)
        in (SCHEME, f"{SCHEME}://")
    ):
        return
    warnings.warn(
        "torchrun will restart this job after a failure (--max-restarts), but its process group was "
        "formed on torchrun's own store by an Accelerator other than the Trainer's default one (an "
        "override of _create_accelerator) or before the Trainer: the failed attempt's addresses stay "
        "there, and a restarted group can read them and fail to form ('Gloo connectFullMesh failed ... "
        "Connection refused', or a wait until the formation times out). Use the Trainer's default "
        "Accelerator, or launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment "
        "and --rdzv-backend c10d (--standalone on one machine), which gives every attempt a store of its own.",
        stacklevel=4,  # the line that creates the Trainer
    )
