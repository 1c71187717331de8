"""One run per folder, on real processes: two runs started at once into one folder never mix their
states; a folder whose holder was killed is resumable at once; a second ``train()`` call that keeps
the run history never replaces the first call's states, and a folder resume after a SIGKILL in it
ends bitwise equal to the uninterrupted script; a run that is process 1 of a pid namespace (a
container), SIGKILLed and started again in a new namespace (``unshare --pid --fork --mount-proc``),
takes its own lock over once its heartbeat has stood still, and ends bitwise equal.

The runs are ``tests/integration/workers/one_run_worker.py`` (see there).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.checkpoints.directories import read_manifest
from pytorch_accelerated.checkpoints.folder_lock import HEARTBEAT_TIMEOUT_S, LOCK_NAME
from pytorch_accelerated.checkpoints.torch_files import safe_torch_load
from tests import forked
from tests.helpers import subprocess_env
from tests.launch import WORKERS_DIR

WORKER = Path(__file__).parent / "workers" / "one_run_worker.py"
TRIALS = 20
GONE_PID = 2**22 + 7  # above Linux's largest process id: no such process
TIMEOUT_S = 300


def start(out: Path, *args: str) -> forked.ForkedLaunch:
    out.mkdir(parents=True, exist_ok=True)
    log = out / f"worker_{'_'.join(args[:3])}.log"
    return forked.start(WORKER, [*args, "--out", str(out)], env=subprocess_env(out), cwd=out, log=log)


def finish(process: forked.ForkedLaunch, out: Path) -> int:
    return process.wait(timeout=TIMEOUT_S)


def logs(out: Path) -> str:
    return "\n".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(out.glob("*.log")))


def state_matches(directory: Path, saved: dict[str, Any] | None) -> bool:
    """Whether every file of the published state ``directory`` holds what its run recorded saving there."""
    try:
        return saved is not None and _state_matches(directory, saved)
    except (OSError, KeyError, TypeError, ValueError):  # a file missing or unreadable: not that run's state
        return False


def _state_matches(directory: Path, saved: dict[str, Any]) -> bool:
    model = safe_torch_load(directory / "model.pt")
    optimizer = safe_torch_load(directory / "optimizer.pt")["state"]
    trainer_state = safe_torch_load(directory / "trainer_state.pt")
    rng = safe_torch_load(directory / "rng_state_0.pt")["rng"]["torch"]
    return (
        read_manifest(directory)["run_id"] == saved["run_id"] == trainer_state["run_id"]
        and [t.flatten().tolist() for t in model.values()] == saved["weights"]
        and [optimizer[k]["momentum_buffer"].flatten().tolist() for k in sorted(optimizer)]
        == saved["momentum"]
        and rng.tolist() == saved["rng"]
    )


def test_two_runs_started_at_once_into_one_folder_never_mix_their_states(tmp_path: Path) -> None:
    """20 trials: runs A and B (other seeds: other weights, momenta and RNG states) start together
    into one folder; the one that does not get the folder fails before training, naming the holder.
    In every other trial the folder holds the lock of a killed run: both race to take it over."""
    for trial in range(0, TRIALS, 2):
        stale = {"host": socket.gethostname(), "pid": GONE_PID, "run_id": "killed", "token": "stale"}
        stale["pid_namespace"] = os.readlink("/proc/self/ns/pid")
        (tmp_path / f"trial_{trial}" / "states").mkdir(parents=True)
        (tmp_path / f"trial_{trial}" / "states" / LOCK_NAME).write_text(json.dumps(stale))
    first = start(
        tmp_path, "concurrent", "--name", "A", "--peer", "B", "--seed", "1", "--trials", str(TRIALS)
    )
    second = start(
        tmp_path, "concurrent", "--name", "B", "--peer", "A", "--seed", "2", "--trials", str(TRIALS)
    )
    assert (finish(first, tmp_path), finish(second, tmp_path)) == (0, 0), logs(tmp_path)
    runs = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in "AB"}
    mixed, states, locks_left = [], 0, 0
    for trial in range(TRIALS):
        by_id = {runs[name][trial]["run_id"]: runs[name][trial] for name in "AB"}
        for directory in sorted((tmp_path / f"trial_{trial}" / "states").iterdir()):
            if directory.name.startswith("."):
                continue
            states += 1
            run = by_id.get((read_manifest(directory) or {}).get("run_id"))
            if run is None or not state_matches(directory, run["saved"].get(directory.name)):
                mixed.append(f"trial {trial}: {directory.name}")
        locks_left += (tmp_path / f"trial_{trial}" / "states" / LOCK_NAME).exists()  # released at the end?
    outcomes = [sorted((runs[name][trial]["outcome"], name) for name in "AB") for trial in range(TRIALS)]
    refused = sum(first != "ok" for (first, _), _ in outcomes)
    print(f"concurrent trials: {TRIALS}, states checked: {states}, mixed: {len(mixed)}, refused: {refused}")
    assert mixed == []
    for trial, ((first, loser), (second, holder)) in enumerate(outcomes):
        assert second == "ok", outcomes[trial]
        if first != "ok":  # the other run held the folder: refused before any save, naming it
            assert first.startswith("FolderInUseError: "), first
            assert f"run {runs[holder][trial]['run_id']}, process " in first, first
            assert f"on host {socket.gethostname()}, since " in first, first
            assert "Save this run's states into another folder" in first, first
            assert runs[loser][trial]["saved"] == {}
    assert refused > 0  # the runs did overlap (else the test proved nothing)
    assert locks_left == 0


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("uninterrupted")
    assert finish(start(out, "two-calls"), out) == 0, logs(out)
    return {"out": out, "result": torch.load(out / "result.pt")}


def test_a_second_train_call_keeping_the_history_never_replaces_the_first_calls_states(
    uninterrupted: dict[str, Any],
) -> None:
    states = uninterrupted["out"] / "states"
    # 9 updates per epoch: the first call's 18 (states at 4, 8, 12, 16), then the second call's 27
    # counted on from 18 (at 18 + 4, 18 + 8, ... 18 + 24); final at 45 replaced the first call's final.
    steps = [4, 8, 12, 16, *(18 + n for n in range(4, 27, 4))]
    names = sorted(p.name for p in states.iterdir() if not p.name.startswith("."))
    assert names == sorted(["final", *(f"step_{n}" for n in steps)])
    manifests = {name: read_manifest(states / name) for name in names}
    assert sorted(m["run_step"] for m in manifests.values()) == [*steps, 45]
    assert len({m["run_id"] for m in manifests.values()}) == 1  # one run, over both calls
    assert safe_torch_load(states / "step_30" / "trainer_state.pt")["checkpoint_kwargs"] == {
        "global_step": 30
    }
    assert len(uninterrupted["result"]["eval_loss"]) == 5


def test_killed_in_the_second_call_the_folder_resumes_at_once_to_the_uninterrupted_result(
    tmp_path: Path, uninterrupted: dict[str, Any]
) -> None:
    killed = start(tmp_path, "two-calls", "--kill-at-second-call-step", "14")
    assert finish(killed, tmp_path) == -signal.SIGKILL, logs(tmp_path)
    states = tmp_path / "states"
    # The killed run's lock is still there (nothing released it); its first call's final is at 18,
    # its second call's newest state at 18 + 12 = 30.
    assert json.loads((states / LOCK_NAME).read_text())["pid"] == killed.pid
    assert read_manifest(states / "final")["run_step"] == 18
    assert read_manifest(states / "step_30")["global_step"] == 12
    assert finish(start(tmp_path, "two-calls", "--resume"), tmp_path) == 0, logs(tmp_path)
    result, expected = torch.load(tmp_path / "result.pt"), uninterrupted["result"]
    assert result["eval_loss"] == expected["eval_loss"]
    assert result["train_loss"] == expected["train_loss"]
    assert result["epoch"] == expected["epoch"]
    for name, tensor in expected["weights"].items():
        assert torch.equal(result["weights"][name], tensor), name
    assert not (states / LOCK_NAME).exists()


# ----------------------------------------------------------------- a container restarted


UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")


def in_new_pid_namespace(out: Path, *args: str) -> subprocess.Popen[str]:
    """workers/auto_resume.py as process 1 of a new pid namespace of this host: a pod's container."""
    out.mkdir(parents=True)
    script = WORKERS_DIR / "auto_resume.py"
    return subprocess.Popen(
        [*UNSHARE, sys.executable, str(script), "--out", str(out), *args],
        cwd=out,
        env=subprocess_env(out),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def namespace_init(unshare: subprocess.Popen[str]) -> int:
    """The host's process id of the namespace's process 1 (unshare's child)."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    deadline = time.monotonic() + 30
    while not children.read_text().split():
        assert time.monotonic() < deadline, "unshare started no process"
        time.sleep(0.05)
    return int(children.read_text().split()[0])


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root (as in CI)"
)
def test_a_container_restarted_in_a_new_pid_namespace_takes_over_its_own_lock_within_the_heartbeat_timeout(
    tmp_path: Path,
) -> None:
    """The pod's ``restartPolicy: OnFailure``: the run is process 1 of its pid namespace, SIGKILLed
    (by its container runtime, from outside), and started again in a new namespace on the same host,
    where it is process 1 again; its lock names process 1 of the old namespace."""
    folder = tmp_path / "states"
    plain = tmp_path / "plain"
    plain.mkdir()
    done = forked.run(
        WORKERS_DIR / "auto_resume.py", ["--out", str(plain), "--save-dir", str(tmp_path / "plain_states")],
        env=subprocess_env(plain), cwd=plain, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout
    first = in_new_pid_namespace(tmp_path / "first", "--save-dir", str(folder), "--update-sleep", "0.3")
    deadline = time.monotonic() + TIMEOUT_S
    while not (folder / "step_4" / "manifest.json").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
        time.sleep(0.1)
    os.kill(namespace_init(first), signal.SIGKILL)
    killed_at = time.monotonic()
    assert first.wait(timeout=30) != 0
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == 1  # left behind by process 1
    second = in_new_pid_namespace(tmp_path / "second", "--save-dir", str(folder))
    output = second.communicate(timeout=TIMEOUT_S)[0]
    relaunched_in = time.monotonic() - killed_at
    assert second.returncode == 0, output
    assert (
        f"Took over the lock of {folder} from run {read_manifest(folder / 'final')['run_id']}, process 1 on host "
        f"{socket.gethostname()}, since "
    ) in output, output
    # The new namespace is another one (its process 1 is judged by the lock's heartbeat), or the
    # kernel gave it the number of the dead one (then process 1 is judged by its start time).
    judged = re.search(
        r": (it ran in another pid namespace of this host, and its heartbeat stood still for (\d+) s|"
        r"process 1 on this host started after the lock was taken \(its id was reused\))\.\n",
        output,
    )
    assert judged is not None, output
    assert judged[2] in (None, f"{HEARTBEAT_TIMEOUT_S:g}"), output
    assert f"the newest usable state in {folder} (epoch " in output
    resumed = json.loads((tmp_path / "second" / "rank0.json").read_text())
    assert resumed["weights"] == json.loads((plain / "rank0.json").read_text())["weights"]
    assert not (folder / LOCK_NAME).exists()
    print(
        f"container restart: {judged[1]}; the relaunched run done {relaunched_in:.1f} s after the kill "
        f"(load {os.getloadavg()})"
    )
