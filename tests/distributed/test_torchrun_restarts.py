"""Restarts under ``torchrun --nproc_per_node 2 --max-restarts N`` end where an uninterrupted run ends.

The same script (``workers/restarts.py``) for the first launch and every relaunch; two jobs at
once: an uninterrupted one, and one that meets every kind of fault, one per attempt, each on one
rank: SIGKILL (1 or 2 times during training, at random ranks and updates), SIGTERM (preemption),
a Python exception raised once in a callback, then a SIGKILL inside a save (``--max-restarts``
is the number of faults, so SIGTERM arrives with 3 restarts left). The job must end by itself
with exit 0, with final weights bitwise equal to the uninterrupted run's, at most
``SAVE_EVERY_N_STEPS`` updates redone per failure, no hidden half-written state and no lock left.
(One job for every fault: each attempt starts 2 worker processes, most of the cost; a job per
kind of fault would start the agent and the first attempt again for each.)

The faults are drawn from ``RESTARTS_SEED`` (a new seed per session unless set), printed in every
failure message. torchrun runs with the c10d rendezvous and without
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the processes form their group on the store torchrun's
agent keeps across attempts, where the failed attempt's addresses stay (pytorch/pytorch#135712;
before the Trainer formed its group in a namespace of its own per attempt, the first restart hung
in the group's formation). A third job, with torchrun's default static rendezvous
(``--master_addr``/``--master_port``, the same shared store), meets one SIGKILL.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import pytest
import torch

from tests.helpers import free_port
from tests.launch import WorkerRun, start_workers

SAVE_EVERY_N_STEPS = 8  # as in workers/restarts.py
TOTAL_UPDATES = 240  # 3 epochs x 80 updates
CHECK_SIGNALS_EVERY_N_STEPS = 10  # SaveTrainingStateCallback's default: a SIGTERM stops within 10 updates
SEED = int(os.environ.get("RESTARTS_SEED", random.randrange(1_000_000)))
STATIC_KILL = {"attempt": 0, "rank": 1, "step": 7, "kind": "kill"}


def plan() -> list[dict[str, Any]]:
    """The faults, one per attempt, each after the previous one (so the relaunch, which resumes
    before it, gets there): 1 or 2 SIGKILLs during training, a SIGTERM, an exception after the
    state that SIGTERM saved, then a SIGKILL inside a later save; each at a random rank."""
    rng = random.Random(SEED)
    kinds = ["kill"] * rng.randint(1, 2) + ["term", "raise"]
    faults, step = [], 0
    for attempt, kind in enumerate(kinds):
        first = step + (CHECK_SIGNALS_EVERY_N_STEPS + 2 if kind == "raise" else 1)
        step = rng.randint(first, first + 40)
        faults.append({"attempt": attempt, "rank": rng.randint(0, 1), "step": step, "kind": kind})
    save_step = SAVE_EVERY_N_STEPS * rng.randint(step // SAVE_EVERY_N_STEPS + 1, TOTAL_UPDATES // 8 - 1)
    faults.append(
        {"attempt": len(faults), "rank": rng.randint(0, 1), "step": save_step, "kind": "kill-in-save"}
    )
    return faults


Runs = dict[str, tuple[WorkerRun, list[dict[str, Any]]]]


def describe(name: str, run: WorkerRun, faults: list[dict[str, Any]]) -> str:
    return f"case {name!r}, RESTARTS_SEED={SEED}, faults {faults}\n{run.describe()}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = tmp_path_factory.mktemp("torchrun_restarts")
    groups = {}
    c10d = ("--rdzv-backend", "c10d", "--rdzv-endpoint")
    jobs = (
        ("uninterrupted", [], (*c10d, f"127.0.0.1:{free_port()}")),
        ("faults", plan(), (*c10d, f"127.0.0.1:{free_port()}")),
        ("static", [STATIC_KILL], ()),  # torchrun's default: --master_addr/--master_port
    )
    with pytest.MonkeyPatch.context() as env:
        env.delenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", raising=False)  # the store shared with the agent
        for name, faults, rendezvous in jobs:
            groups[name] = (
                start_workers(
                    "restarts.py",
                    root / name,
                    "--save-dir", str(root / name / "states"),
                    "--faults", json.dumps(faults),
                    torchrun_args=(*rendezvous, "--max-restarts", str(max(len(faults), 3))),
                    timeout_s=600,  # one job of up to 6 attempts in a row
                    expect_success=False,
                ),
                faults,
            )  # fmt: skip
    return {name: (group.wait(), faults) for name, (group, faults) in groups.items()}


def attempts(run: WorkerRun) -> list[dict[str, Any]]:
    """Per attempt: the update each rank resumed from, and the fault it met (if any)."""
    found = []
    for attempt in range(8):
        started = [run.out_dir / f"attempt{attempt}_rank{rank}.json" for rank in (0, 1)]
        if not all(path.exists() for path in started):
            break
        resumed = {json.loads(path.read_text())["resumed_at_update"] for path in started}
        fault = run.out_dir / f"fault{attempt}.json"
        found.append({"resumed": resumed, "fault": json.loads(fault.read_text()) if fault.exists() else None})
    return found


def weights(run: WorkerRun, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run.out_dir / f"weights{rank}.pt", weights_only=True)


def redone_per_failure(run: WorkerRun) -> list[int]:
    """Per failure: the updates the relaunch trains again (the fault's update minus the resumed one)."""
    found = attempts(run)
    return [
        max(found[a]["fault"]["at_update"] - min(found[a + 1]["resumed"]), 0) for a in range(len(found) - 1)
    ]


@pytest.mark.parametrize("name", ["uninterrupted", "faults", "static"])
def test_job_ends_by_itself_with_exit_0_and_the_uninterrupted_weights_bitwise(runs: Runs, name: str) -> None:
    run, faults = runs[name]
    message = describe(name, run, faults)
    assert run.returncode == 0, message
    assert [r["attempt"] for r in run.results] == [len(faults)] * 2, message  # one relaunch per fault
    assert [r["num_processes"] for r in run.results] == [2, 2], message
    assert [r["progress"]["global_step"] for r in run.results] == [TOTAL_UPDATES] * 2, message
    expected = weights(runs["uninterrupted"][0], 0)
    for rank in (0, 1):
        got = weights(run, rank)
        assert got.keys() == expected.keys(), message
        assert all(torch.equal(got[key], expected[key]) for key in expected), message


def test_each_failure_redoes_at_most_save_every_n_steps_updates(runs: Runs) -> None:
    run, faults = runs["faults"]
    message = describe("faults", run, faults)
    found = attempts(run)
    assert [a["fault"]["kind"] for a in found[:-1]] == [f["kind"] for f in faults], message
    assert all(len(a["resumed"]) == 1 for a in found), message  # both ranks resumed from the same update
    redone = redone_per_failure(run)
    print(f"updates redone per failure {redone} (faults {faults}, RESTARTS_SEED={SEED})")
    assert all(0 <= n <= SAVE_EVERY_N_STEPS for n in redone), message
    # SIGTERM: the stop saved a state at or after the signal, nothing redone
    term = next(f["attempt"] for f in faults if f["kind"] == "term")
    assert redone[term] == 0 and min(found[term + 1]["resumed"]) >= faults[term]["step"], message
    # a SIGKILL inside a save: the state it interrupted was not taken, the one before it was
    save_step = faults[-1]["step"]
    assert min(found[-1]["resumed"]) == save_step - SAVE_EVERY_N_STEPS, message


def test_relaunch_leaves_complete_states_only_and_no_lock(runs: Runs) -> None:
    run, faults = runs["faults"]
    states = run.out_dir / "states"
    left = sorted(path.name for path in states.iterdir())
    saved = {f"step_{n}" for n in range(SAVE_EVERY_N_STEPS, TOTAL_UPDATES + 1, SAVE_EVERY_N_STEPS)}
    resumed = {f"step_{n}" for attempt in attempts(run)[1:] for n in attempt["resumed"] if n}  # SIGTERM's
    expected = sorted(saved | resumed | {"final"})
    assert left == expected, describe("faults", run, faults)  # no .run.lock, no hidden .step_N.incomplete
    assert all((states / state / "manifest.json").exists() for state in left)


def test_every_launch_says_what_it_resumed_and_sigterm_exits_143_for_the_agent(runs: Runs) -> None:
    run, faults = runs["faults"]
    message = describe("faults", run, faults)
    states = run.out_dir / "states"
    fresh = f'resume_from="auto": no training state in {states}, starting a new run'
    assert fresh in run.output  # the first launch
    for attempt in attempts(run)[1:]:
        (update,) = attempt["resumed"]
        if update:  # 0: killed before the first save, so the relaunch started afresh too
            assert f"from {states / f'step_{update}'}, the newest usable state in {states}" in run.output
    assert "Training stopped: received SIGTERM; saved the training state to " in run.output
    assert (
        "exiting with code 143 after the end hooks so that torchrun restarts the job (3 restart(s) "
        "left), and the relaunch resumes from it"
    ) in run.output, message
    assert "(exitcode: 143)" in run.output  # torchrun saw the failure, and restarted
    for name, (each, _) in runs.items():  # an unshared store: no warning about the shared one
        assert "torchrun will restart this job after a failure" not in each.output, name
    assert "injected failure at update" in run.output
    # the relaunch after the kill inside a save took the folder and cleaned it
    hidden = f".step_{faults[-1]['step']}.incomplete"
    assert f"Removed the half-written states of killed saves in {states}: {hidden}" in run.output
