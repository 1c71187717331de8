"""A launch whose processes do not add up fails early on every process that started, with an
error naming the setting and the fix, instead of waiting in torch's rendezvous for minutes.

The launches are set up by hand (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT; plain ``python``
processes, as a script or SLURM's ``srun`` starts them), all started at once over loopback
(the worker is ``workers/launch_mismatch.py``):

- one process of a 2-process group (RANK=0 alone; RANK=1 alone) fails after
  ``PT_ACC_RENDEZVOUS_TIMEOUT`` (2 s here), not after the collective timeout (300 s);
- two processes launched with different WORLD_SIZE, and two launched with the same RANK, fail
  at once (no timeout), every process saying which setting disagrees;
- a MASTER_PORT already in use fails at once, asking for a free port;
- a correct launch of 2 processes still forms one group, which gathers from both.

(Launches through torchrun's agent are not checked here: the agent gathers every machine before
it starts any process; see docs/launching.md, "When a launch does not add up".)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytorch_accelerated._internal.launch_checks import (
    DEFAULT_RENDEZVOUS_TIMEOUT_S,
    DEFAULT_SEVERAL_MACHINES_RENDEZVOUS_TIMEOUT_S,
    RENDEZVOUS_TIMEOUT_ENV,
    launch_to_check,
    rendezvous_timeout_s,
)
from tests.helpers import free_port, subprocess_env
from tests.launch import WORKERS_DIR

TIMEOUT_S = 120.0  # per process: far beyond every wait below
SHORT_RENDEZVOUS_S = 2.0  # the rendezvous timeout of the launches that miss a process
LONG_RENDEZVOUS_S = 100.0  # ... of those that must fail without waiting for it


@dataclass
class Process:
    """What one launched process left behind."""

    returncode: int
    output: str
    result: dict[str, Any]

    def describe(self) -> str:
        return f"exit code {self.returncode}, result {self.result}\n----- output -----\n{self.output}"


#: name -> (WORLD_SIZE, RANK, port key, rendezvous timeout, gather through the group)
SCENARIOS: dict[str, tuple[int, int, str, float, bool]] = {
    "alone0": (2, 0, "alone0", SHORT_RENDEZVOUS_S, False),
    "alone1": (2, 1, "alone1", SHORT_RENDEZVOUS_S, False),
    "size2": (2, 0, "sizes", LONG_RENDEZVOUS_S, False),
    "size3": (3, 1, "sizes", LONG_RENDEZVOUS_S, False),
    "dup0": (3, 0, "dup", LONG_RENDEZVOUS_S, False),
    "dup1a": (3, 1, "dup", LONG_RENDEZVOUS_S, False),
    "dup1b": (3, 1, "dup", LONG_RENDEZVOUS_S, False),
    "busy": (2, 0, "busy", LONG_RENDEZVOUS_S, False),
    "ok0": (2, 0, "ok", LONG_RENDEZVOUS_S, True),
    "ok1": (2, 1, "ok", LONG_RENDEZVOUS_S, True),
}


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory, busy_port: int) -> dict[str, Process]:
    """Start every scenario's processes at once; wait for all; return them by name."""
    out_dir = tmp_path_factory.mktemp("launch_mismatch")
    ports = {key: free_port() for _, _, key, _, _ in SCENARIOS.values()} | {"busy": busy_port}
    running = {name: _start(out_dir, name, *scenario, ports) for name, scenario in SCENARIOS.items()}
    processes = {}
    for name, process in running.items():
        try:
            output = process.communicate(timeout=TIMEOUT_S)[0]
        except subprocess.TimeoutExpired:
            for other in running.values():
                other.kill()
            pytest.fail(
                f"{name} did not finish within {TIMEOUT_S:.0f} s: a hang.\n{process.communicate()[0]}"
            )
        result_file = out_dir / f"{name}.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        processes[name] = Process(process.returncode, output, result)
    return processes


def _start(
    out_dir: Path,
    name: str,
    world_size: int,
    rank: int,
    port_key: str,
    rendezvous_s: float,
    gather: bool,
    ports: dict[str, int],
) -> subprocess.Popen[str]:
    tmp_dir = out_dir / name
    tmp_dir.mkdir()
    env = subprocess_env(tmp_dir)
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    env.update(
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(ports[port_key]),
        PT_ACC_COLLECTIVE_TIMEOUT="300",  # what a missing process made the others wait before
        **{RENDEZVOUS_TIMEOUT_ENV: f"{rendezvous_s:g}"},
    )
    command = [sys.executable, str(WORKERS_DIR / "launch_mismatch.py"), "--out", str(out_dir), "--name", name]
    command += ["--gather", str(int(gather))]
    return subprocess.Popen(
        command, cwd=tmp_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _failed_with(process: Process, *fragments: str) -> None:
    assert process.returncode != 0, process.describe()
    assert process.result.get("error_type") == "RuntimeError", process.describe()
    for fragment in fragments:
        assert fragment in process.result["message"], f"{fragment!r} missing.\n{process.describe()}"
    assert "RuntimeError" in process.output, process.describe()


def test_the_only_process_of_a_two_process_launch_fails_after_the_rendezvous_timeout_naming_the_fix(
    processes: dict[str, Process],
) -> None:
    alone = processes["alone0"]
    _failed_with(
        alone,
        "Only 1 of the WORLD_SIZE=2 processes",
        "MASTER_ADDR:MASTER_PORT=127.0.0.1:",
        "within 2 s",
        "this is RANK=0; missing: RANK 1",
        "the same torchrun --nnodes and --nproc_per_node",
        "--num_machines and --num_processes",
        "free master port",
        f"{RENDEZVOUS_TIMEOUT_ENV}=2 seconds",
    )
    # It waited the rendezvous timeout, not the collective timeout (300 s) as it did before.
    assert SHORT_RENDEZVOUS_S <= alone.result["wait_s"] < 60, alone.describe()


def test_a_process_that_finds_no_process_0_fails_after_the_rendezvous_timeout_naming_the_fix(
    processes: dict[str, Process],
) -> None:
    alone = processes["alone1"]
    _failed_with(
        alone,
        "RANK=1 of WORLD_SIZE=2 found no process 0 at MASTER_ADDR:MASTER_PORT=127.0.0.1:",
        "within 2 s",
        "the same MASTER_ADDR",
        f"{RENDEZVOUS_TIMEOUT_ENV}=2 seconds",
    )
    assert SHORT_RENDEZVOUS_S <= alone.result["wait_s"] < 60, alone.describe()


def test_processes_launched_with_different_world_sizes_both_fail_at_once(
    processes: dict[str, Process],
) -> None:
    for name in ("size2", "size3"):
        process = processes[name]
        _failed_with(
            process,
            "disagree on its size",
            "RANK=1 was launched with WORLD_SIZE=3",
            "WORLD_SIZE=2",
            "the same torchrun --nnodes and --nproc_per_node",
        )
        # The message is the conflict's, not the timeout's: no process waited the 100 s out
        # (only, at most, for the other process to start).
        assert process.result["wait_s"] < LONG_RENDEZVOUS_S, process.describe()


def test_two_processes_launched_with_the_same_rank_stop_every_process_at_once(
    processes: dict[str, Process],
) -> None:
    for name in ("dup0", "dup1a", "dup1b"):
        process = processes[name]
        _failed_with(
            process, "Two processes of this launch (WORLD_SIZE=3", "were launched with RANK=1", "own RANK"
        )
        assert process.result["wait_s"] < LONG_RENDEZVOUS_S, process.describe()


def test_a_master_port_in_use_fails_at_once_asking_for_a_free_port(
    processes: dict[str, Process], busy_port: int
) -> None:
    busy = processes["busy"]
    _failed_with(
        busy, f"MASTER_ADDR:MASTER_PORT=127.0.0.1:{busy_port}", "choose a free port", "--master_port"
    )
    assert busy.result["wait_s"] < LONG_RENDEZVOUS_S, busy.describe()


def test_a_correct_launch_by_hand_still_forms_one_group_that_works(processes: dict[str, Process]) -> None:
    for name in ("ok0", "ok1"):
        process = processes[name]
        finished = process.result.get("error_type", "missing") is None
        assert process.returncode == 0 and finished, process.describe()
        assert process.result["num_processes"] == 2, process.describe()
        assert process.result["gathered"] == [0, 1], process.describe()


# ----------------------------------------------------------------- in this process: no launch


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A hand-set 2-process launch on this machine, as this process's environment."""
    for name, value in {
        "WORLD_SIZE": "2",
        "RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29999",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("TORCHELASTIC_USE_AGENT_STORE", "LOCAL_WORLD_SIZE", RENDEZVOUS_TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_rank_outside_the_world_size_is_an_error_naming_both(launch_env: pytest.MonkeyPatch) -> None:
    launch_env.setenv("RANK", "2")
    with pytest.raises(RuntimeError, match=r"RANK=2, but WORLD_SIZE=2 allows ranks 0 to 1"):
        launch_to_check()


def test_launches_gathered_by_torchrun_or_of_one_process_are_not_checked(
    launch_env: pytest.MonkeyPatch,
) -> None:
    launch_env.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert launch_to_check() is None
    launch_env.delenv("TORCHELASTIC_USE_AGENT_STORE")
    launch_env.setenv("WORLD_SIZE", "1")
    assert launch_to_check() is None


def test_the_rendezvous_timeout_is_longer_on_several_machines_and_set_by_its_variable(
    launch_env: pytest.MonkeyPatch,
) -> None:
    def timeout() -> float:
        launch = launch_to_check()
        assert launch is not None
        return rendezvous_timeout_s(launch)

    assert timeout() == DEFAULT_RENDEZVOUS_TIMEOUT_S == 60
    launch_env.setenv("MASTER_ADDR", "10.0.0.1")
    assert timeout() == DEFAULT_SEVERAL_MACHINES_RENDEZVOUS_TIMEOUT_S == 180
    launch_env.setenv("MASTER_ADDR", "localhost")
    launch_env.setenv("LOCAL_WORLD_SIZE", "1")  # 1 of 2 processes on this machine
    assert timeout() == DEFAULT_SEVERAL_MACHINES_RENDEZVOUS_TIMEOUT_S
    launch_env.setenv(RENDEZVOUS_TIMEOUT_ENV, "7.5")
    assert timeout() == 7.5
    launch_env.setenv(RENDEZVOUS_TIMEOUT_ENV, "soon")
    with pytest.raises(
        ValueError, match=rf"{RENDEZVOUS_TIMEOUT_ENV}='soon' must be a positive number of seconds"
    ):
        timeout()
