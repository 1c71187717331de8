"""Elastic membership for real: two torchrun agents (``--nnodes 1:2``, one process each, c10d
rendezvous on loopback, ``--max-restarts 3``) run ``workers/elastic.py``, one script with
``resume_from="auto"`` for every launch, in one shared folder.

The job starts on 2 processes (16 samples per update). After update 4 (state ``step_4`` saved)
one agent and its worker are SIGKILLed mid-epoch: the survivor's worker fails in its next
all-reduce, its agent re-forms the group with 1 process and the relaunch resumes ``step_4`` with
``gradient_accumulation_steps`` 2, keeping 16 samples per update. After update 8 the killed
agent is started again: torchrun stops the 1-process group (SIGTERM: the worker saves and
returns) and restarts with 2, which resume with accumulation 1 and finish. The final weights
equal a plain-PyTorch SGD fed the documented order (each epoch's permutation of seed + epoch,
16 consecutive samples per update), and every update, counted over the attempts that survived,
saw exactly its 16 samples: each sample once per epoch. Then 3 processes, which cannot keep 16
samples per update with a per-device batch of 8, are refused before training.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import free_port, subprocess_env
from tests.launch import WORKERS_DIR, launch_workers

NUM_SAMPLES, GLOBAL_BATCH, NUM_EPOCHS, SEED = 96, 16, 3, 42  # as in workers/elastic.py
UPDATES_PER_EPOCH = NUM_SAMPLES // GLOBAL_BATCH
TIMEOUT_S = 150.0
# Fast membership changes: a dead node is dropped after 6 missed 1 s heartbeats (fewer drop
# live agents of a busy machine too), and a
# rendezvous that has its minimum waits 3 s more for others.
RDZV_CONF = "join_timeout=60,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=6"


class Agent:
    """One torchrun agent (a "machine"): its own process group, its output in a file."""

    def __init__(self, root: Path, port: int, run_id: str, name: str, host: bool = False) -> None:
        self.log = root / f"agent-{name}.log"
        command = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1:2", "--nproc_per_node", "1",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
            "--rdzv-conf", f"{RDZV_CONF},is_host={str(host).lower()}", "--max-restarts", "3", "--monitor-interval", "0.2",
            str(WORKERS_DIR / "elastic.py"), "--out", str(root / "out"), "--save-dir", str(root / "states"),
        ]  # fmt: skip
        # torch 2.4+ lets the rank-0 agent share its store with the workers, but an agent that
        # is rank 0 again after a membership change does not republish the store's address, so a
        # node that joins then waits for it forever (pytorch/pytorch#147064): turn sharing off.
        env = {**subprocess_env(root / "tmp"), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
        with self.log.open("a") as output:
            self.process = subprocess.Popen(
                command,
                cwd=root,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def wait_for(condition: Any, what: str, agents: list[Agent], root: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"Timed out waiting for {what}.\n{describe(agents, root)}")
        time.sleep(0.1)


def describe(agents: list[Agent], root: Path) -> str:
    logs = "\n".join(f"----- {agent.log.name} -----\n{agent.output()}" for agent in agents)
    return f"{logs}\n----- states: {sorted(p.name for p in (root / 'states').glob('*'))}"


def held(root: Path, update: int) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted((root / "out").glob(f"held-{update}-*.json"))]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the elastic job (see the module docstring); return every process's log lines."""
    root = tmp_path_factory.mktemp("elastic")
    (root / "out").mkdir()
    (root / "tmp").mkdir()
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    # On loopback both agents would take the endpoint for their own address and host a store:
    # the first says it hosts (and survives), the other that it does not. Started together, they
    # join the first rendezvous within its last call.
    agents = [Agent(root, port, run_id, "b"), Agent(root, port, run_id, "a", host=True)]
    agents.reverse()
    first = agents[0]
    try:
        wait_for(lambda: len(held(root, 4)) == 2, "both processes to reach update 4", agents, root)
        # The second agent and its worker (in a session of its own) die at once, as with a machine.
        victim = next(mark for mark in held(root, 4) if mark["agent"] != first.process.pid)
        agents[1].stop()
        os.kill(victim["pid"], signal.SIGKILL)
        (root / "out" / "go").touch()
        wait_for(lambda: held(root, 8), "the survivor alone to reach update 8", agents, root)
        agents.append(Agent(root, port, run_id, "b-again"))
        for agent in (first, agents[2]):
            agent.process.wait(timeout=TIMEOUT_S)
        codes = [agent.process.returncode for agent in (first, agents[2])]
        assert codes == [0, 0], describe(agents, root)
        lines = [
            json.loads(line)
            for path in (root / "out").glob("log-*.jsonl")
            for line in path.read_text().splitlines()
        ]
        return {"lines": lines, "output": describe(agents, root), "root": root}
    finally:
        for agent in agents:
            agent.stop()


def attempts(job: dict[str, Any]) -> list[tuple[int, int, list[int]]]:
    """Each launch of the group, in order: (update it started at, processes, their pids)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for line in job["lines"]:
        if line["event"] == "start":
            groups.setdefault((line["progress"]["global_step"], line["num_processes"]), []).append(
                line["pid"]
            )
    return [(step, processes, pids) for (step, processes), pids in sorted(groups.items())]


def starts(job: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (line for line in job["lines"] if line["event"] == "start"),
        key=lambda line: line["progress"]["global_step"],
    )


def test_the_group_shrinks_to_1_process_then_grows_back_to_2_keeping_16_samples_per_update(
    job: dict[str, Any],
) -> None:
    summary = [
        (
            line["num_processes"],
            line["accumulation"],
            line["progress"]["global_step"],
            line["updates_per_epoch"],
        )
        for line in starts(job)
        if line["rank"] == 0
    ]
    # Fresh on 2 x 8 x 1; step_4 on 1 x 8 x 2; the state saved on SIGTERM (update 9) on 2 x 8 x 1.
    assert summary == [(2, 1, 0, 6), (1, 2, 4, 6), (2, 1, 9, 6)], job["output"]
    assert "gradient_accumulation_steps 2 instead of 1 keeps its global batch of 16 samples" in job["output"]
    assert "gradient_accumulation_steps 1 instead of 1" not in job["output"]


def updates_that_count(job: dict[str, Any]) -> dict[int, list[int]]:
    """Sample indices of each update, taken from the launch that made it last (a later launch
    resumed from an earlier state redoes the updates after it)."""
    by_update: dict[int, list[int]] = {}
    for step, _, pids in attempts(job):
        made: dict[int, list[int]] = {}
        for line in job["lines"]:
            if line["event"] == "batch" and line["pid"] in pids and line["update"] > step:
                made.setdefault(line["update"], []).extend(line["ids"])
        by_update.update(made)
    return by_update


def test_every_update_saw_its_16_samples_of_the_order_and_every_sample_once_per_epoch(
    job: dict[str, Any],
) -> None:
    by_update = updates_that_count(job)
    assert sorted(by_update) == list(range(1, NUM_EPOCHS * UPDATES_PER_EPOCH + 1))
    for epoch in range(NUM_EPOCHS):
        order = epoch_order(epoch)
        seen = []
        for k in range(UPDATES_PER_EPOCH):
            ids = by_update[epoch * UPDATES_PER_EPOCH + k + 1]
            assert sorted(ids) == sorted(order[k * GLOBAL_BATCH : (k + 1) * GLOBAL_BATCH])
            seen += ids
        assert Counter(seen) == Counter(range(NUM_SAMPLES))


def epoch_order(epoch: int) -> list[int]:
    """The documented order: one permutation of the training set per epoch, from seed + epoch."""
    return torch.randperm(NUM_SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def test_final_weights_equal_plain_pytorch_fed_the_same_global_batches_on_the_same_schedule(
    job: dict[str, Any], worker_common: ModuleType
) -> None:
    model = worker_common.make_mlp(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.1, epochs=NUM_EPOCHS, steps_per_epoch=UPDATES_PER_EPOCH
    )
    x, y = worker_common.make_data(NUM_SAMPLES, seed=1)
    for epoch in range(NUM_EPOCHS):
        order = torch.tensor(epoch_order(epoch))
        for k in range(UPDATES_PER_EPOCH):
            batch = order[k * GLOBAL_BATCH : (k + 1) * GLOBAL_BATCH]
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x[batch]), y[batch]).backward()
            optimizer.step()
            schedule.step()
    ends = [line for line in job["lines"] if line["event"] == "end"]
    assert [line["num_processes"] for line in ends] == [2, 2]
    assert [line["global_step"] for line in ends] == [NUM_EPOCHS * UPDATES_PER_EPOCH] * 2
    for end in ends:
        for name, value in model.state_dict().items():
            torch.testing.assert_close(
                torch.tensor(end["weights"][name], dtype=torch.float32), value, rtol=0, atol=1e-5
            )


def test_the_states_left_record_who_saved_them_and_the_lines_printed_say_what_happened(
    job: dict[str, Any],
) -> None:
    states = job["root"] / "states"
    saved_by = {
        state.name: tuple(
            json.loads((state / "manifest.json").read_text())[key]
            for key in ("num_processes", "gradient_accumulation_steps", "asked_accumulation_steps")
        )
        for state in states.iterdir()
        if not state.name.startswith(".")
    }
    # 2 x 8 x 1 until the kill; 1 x 8 x 2 (and step_9 on SIGTERM) until the agent came back; 2 x 8 x 1.
    assert saved_by == {
        **{f"step_{n}": (2, 1, 1) for n in (2, 4, 10, 12, 14, 16, 18)},
        **{f"step_{n}": (1, 2, 1) for n in (6, 8, 9)},
    }
    output = job["output"]
    assert "because another process left it" in output  # the survivor's failure names its cause
    assert (
        f"Resuming {states}/step_4 on 1 process(es), saved on 2: gradient_accumulation_steps 2 instead of 1 "
        f"keeps its global batch of 16 samples per update."
    ) in output
    assert f"Training stopped: received SIGTERM; saved the training state to {states}/step_9" in output
    run_id = json.loads((states / "step_9" / "manifest.json").read_text())["run_id"]
    assert f'resume_from="auto": no training state in {states}, starting a new run' in output
    for state, where in (
        ("step_4", "epoch 1, update 4; skipping 8"),
        ("step_9", "epoch 2, update 9; skipping 3"),
    ):
        assert (
            f'resume_from="auto": resuming run {run_id} from {states}/{state}, the newest usable state in '
            f"{states} ({where} batches already trained this epoch)"
        ) in output


def test_3_processes_cannot_keep_16_samples_per_update_and_are_refused_before_training(
    job: dict[str, Any], tmp_path: Path
) -> None:
    states = job["root"] / "states"
    before = sorted(path.name for path in states.iterdir())
    run = launch_workers(
        "elastic.py", tmp_path / "three", "--save-dir", str(states), nproc=3, expect_success=False
    )
    assert run.returncode != 0, run.describe()
    message = (
        f"ValueError: Cannot resume {states}/step_18 on 3 process(es) with the same global batch: it was saved "
        f"with 2 process(es) x per_device_batch_size 8 x gradient_accumulation_steps 1 (16 samples per update), "
        f"and 16 is not a multiple of 3 x per_device_batch_size 8 = 24, so no gradient_accumulation_steps keeps "
        f"it. Launch on 1 or 2 process(es)"
    )
    assert run.output.count(message) == 3, run.describe()  # every process, the same
    assert all(not log.read_text() for log in (tmp_path / "three").glob("log-*.jsonl"))  # no event fired
    assert sorted(path.name for path in states.iterdir()) == before  # nothing written, no lock left
