"""A launch whose processes do not add up fails early, with an error that says how to launch.

When the processes of a group were started without torch's elastic agent (``WORLD_SIZE``,
``RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set by hand or by a script, SLURM's ``srun``,
accelerate's ``debug_launcher``), nothing checked that all ``WORLD_SIZE`` of them were started: a
missing one leaves the others waiting in torch's rendezvous for the whole collective timeout,
then failing with a message that names neither the setting nor the fix. So before accelerate
creates the process group, each process checks in at ``MASTER_ADDR:MASTER_PORT`` (the store the
group will use) and waits at most :func:`rendezvous_timeout_s` for the others; a process launched
with another ``WORLD_SIZE``, or with a ``RANK`` another process already has, stops every process
that checked in at once.

Under ``torchrun``, ``accelerate launch --multi_gpu`` and ``notebook_launcher`` the elastic
agent has already gathered every machine before it starts the processes (its own wait is
``--rdzv_conf timeout=...``), so there is nothing to check and nothing is done.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch

from .process_group import seconds_from_env

#: How long a process waits for every process of its launch to check in, unless
#: ``PT_ACC_RENDEZVOUS_TIMEOUT`` says otherwise: on one machine the processes start together;
#: machines started by hand or by a scheduler may start minutes apart.
DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0
DEFAULT_SEVERAL_MACHINES_RENDEZVOUS_TIMEOUT_S = 180.0
RENDEZVOUS_TIMEOUT_ENV = "PT_ACC_RENDEZVOUS_TIMEOUT"

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_KEY_PREFIX = "pytorch_accelerated/launch"
_JOINED = "joined"

# Process 0's store server must outlive the check: accelerate's process group reuses it (its
# store is multi-tenant). Every process counts its checks, so that a second group in the same
# processes (after destroy_process_group) uses fresh keys.
_servers: list[torch.distributed.TCPStore] = []
_checks_done = 0


@dataclass(frozen=True)
class Launch:
    """What the environment says about this process's place in its launch."""

    world_size: int
    rank: int
    master_addr: str
    master_port: int

    def where(self) -> str:
        return f"MASTER_ADDR:MASTER_PORT={self.master_addr}:{self.master_port}"

    def several_machines(self) -> bool:
        """True unless the launch is visibly on this machine alone."""
        local_world_size = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
        if local_world_size.isdigit() and int(local_world_size) < self.world_size:
            return True
        address = self.master_addr.lower()
        return not (
            address in _LOOPBACK_NAMES
            or address == socket.gethostname().lower()
            or address.startswith("127.")
        )


def launch_to_check() -> Launch | None:
    """The launch to check, or None: one process, a group torch's elastic agent gathered
    (``torchrun``, ``accelerate launch --multi_gpu``, ``notebook_launcher``), a process group
    that already exists,
    or an environment without the four variables (accelerate then says what is missing)."""
    world_size, rank, master_addr, master_port = values = [
        os.environ.get(name, "").strip() for name in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")
    ]
    if (
        not all(values)
        or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        or not torch.distributed.is_available()
        or torch.distributed.is_initialized()
        # torch's own error is clear about a malformed value
        or not (world_size.isdigit() and rank.isdigit() and master_port.isdigit())
        or int(world_size) < 2
    ):
        return None
    launch = Launch(int(world_size), int(rank), master_addr, int(master_port))
    if launch.rank >= launch.world_size:
        raise RuntimeError(
            f"This process was launched with RANK={launch.rank}, but WORLD_SIZE={launch.world_size} "
            f"allows ranks 0 to {launch.world_size - 1}: give every process the same WORLD_SIZE (the "
            f"number of processes of the whole launch, on every machine) and its own RANK below it."
        )
    return launch


def rendezvous_timeout_s(launch: Launch) -> float:
    """How long to wait for the processes of ``launch``: ``PT_ACC_RENDEZVOUS_TIMEOUT``, else
    60 s on one machine and 180 s when the processes may be on several."""
    return seconds_from_env(
        RENDEZVOUS_TIMEOUT_ENV,
        DEFAULT_SEVERAL_MACHINES_RENDEZVOUS_TIMEOUT_S
        if launch.several_machines()
        else DEFAULT_RENDEZVOUS_TIMEOUT_S,
    )


def check_every_process_joins() -> None:
    """Wait until every process of this launch has checked in; raise, on every process that did,
    an error that says what does not add up and how to launch instead (see the module docstring).

    Called before the Trainer creates its Accelerator. Costs a few store round trips.
    """
    global _checks_done
    launch = launch_to_check()
    if launch is None:
        return
    timeout_s = rendezvous_timeout_s(launch)
    store = _open_store(launch, timeout_s)
    if launch.rank == 0:
        _servers.append(store)
    prefix = f"{_KEY_PREFIX}/{_checks_done}"
    _checks_done += 1
    if (conflict := _claim_place(store, prefix, launch)) is not None:
        store.compare_set(f"{prefix}/done", "", conflict)
        raise RuntimeError(conflict)
    if store.add(f"{prefix}/{_JOINED}", 1) == launch.world_size:
        store.compare_set(f"{prefix}/done", "", _JOINED)
    # Wait for the last process to check in (or for one to report a conflict).
    try:
        store.wait([f"{prefix}/done"], timedelta(seconds=timeout_s))
    except RuntimeError as error:  # torch's DistStoreError: the time is up
        raise RuntimeError(_missing_message(store, prefix, launch, timeout_s)) from error
    if (outcome := store.get(f"{prefix}/done").decode()) != _JOINED:
        raise RuntimeError(outcome)


def _open_store(launch: Launch, timeout_s: float) -> torch.distributed.TCPStore:
    """Process 0 serves the store at MASTER_ADDR:MASTER_PORT (multi-tenant, as torch's own
    rendezvous does, which then shares it); the others connect to it."""
    try:
        return torch.distributed.TCPStore(
            launch.master_addr,
            launch.master_port,
            is_master=launch.rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
            multi_tenant=True,
        )
    except (RuntimeError, OSError) as error:  # torch's DistNetworkError is a RuntimeError
        raise RuntimeError(_unreachable_message(launch, timeout_s, error)) from error


def _unreachable_message(launch: Launch, timeout_s: float, error: BaseException) -> str:
    if launch.rank == 0:
        return (
            f"Process 0 of this launch (RANK=0, WORLD_SIZE={launch.world_size}) could not serve the "
            f"launch's store at {launch.where()}: {error}. The port is probably in use by another "
            f"program or run on this machine (or by another process also launched with RANK=0): "
            f"choose a free port (MASTER_PORT, torchrun --master_port, accelerate launch "
            f"--main_process_port), the same for every process, and give each process its own RANK."
        )
    return (
        f"RANK={launch.rank} of WORLD_SIZE={launch.world_size} found no process 0 at {launch.where()} "
        f"within {timeout_s:g} s: the process with RANK=0 was not started, or listens at another "
        f"address or port. Start every process of the launch, each with the same MASTER_ADDR (the "
        f"machine of RANK=0, reachable from here) and MASTER_PORT. ({RENDEZVOUS_TIMEOUT_ENV}="
        f"{timeout_s:g} seconds sets how long to wait.)"
    )


def _claim_place(store: torch.distributed.TCPStore, prefix: str, launch: Launch) -> str | None:
    """Publish this process's WORLD_SIZE and claim its RANK; return what conflicts, if anything."""
    own = str(launch.world_size)
    agreed = store.compare_set(f"{prefix}/world_size", "", own).decode()
    if agreed != own:
        return (
            f"The processes of this launch disagree on its size: RANK={launch.rank} was launched "
            f"with WORLD_SIZE={own}, but a process before it with WORLD_SIZE={agreed} (both at "
            f"{launch.where()}). Launch every process with the same size: on every machine the "
            f"same torchrun --nnodes and --nproc_per_node (accelerate launch: --num_machines and "
            f"--num_processes), or the same WORLD_SIZE."
        )
    if store.add(f"{prefix}/rank/{launch.rank}", 1) > 1:
        return (
            f"Two processes of this launch (WORLD_SIZE={own}, {launch.where()}) were launched with "
            f"RANK={launch.rank}: give each process its own RANK (each machine its own torchrun "
            f"--node_rank or accelerate launch --machine_rank), or use a free MASTER_PORT if this "
            f"is another run on the same port."
        )
    return None


def _missing_message(store: torch.distributed.TCPStore, prefix: str, launch: Launch, timeout_s: float) -> str:
    joined = store.add(f"{prefix}/{_JOINED}", 0)
    missing = [rank for rank in range(launch.world_size) if not store.check([f"{prefix}/rank/{rank}"])]
    shown = ", ".join(str(rank) for rank in missing[:10]) + (", ..." if len(missing) > 10 else "")
    return (
        f"Only {joined} of the WORLD_SIZE={launch.world_size} processes of this launch reached "
        f"{launch.where()} within {timeout_s:g} s (this is RANK={launch.rank}; missing: RANK {shown}). "
        f"The others were not started, were started with another MASTER_ADDR/MASTER_PORT, or are "
        f"still busy before creating the Trainer. Start every process of the launch: on every machine "
        f"the same torchrun --nnodes and --nproc_per_node and its own --node_rank (accelerate launch: "
        f"the same --num_machines and --num_processes, its own --machine_rank), all with the same "
        f"master address and a free master port. ({RENDEZVOUS_TIMEOUT_ENV}={timeout_s:g} seconds "
        f"sets how long to wait; raise it if the processes legitimately start further apart.)"
    )
