"""Two machines that share no file system: two launches over loopback, ``torchrun --nnodes 2
--node_rank {0,1} --nproc_per_node 1``, each in its own working directory with its own
``checkpoints/`` folder (the worker is ``workers/several_machines.py``).

Two pairs of launches in the same directories: ``first``, then ``relaunch``.

- The plain ``SaveTrainingStateCallback`` finds, when the run starts, that node 1 cannot see the
  main process's folder, says so once per node, and saves a whole state on each node (its
  asynchronous saves synchronously, said once; ``max_checkpoints`` rotating on each node); a state
  saved by hand finds it at its first save. A folder both nodes see is saved once, with no line.
- The relaunch (``resume_from="auto"`` in both phases) resumes each node from the same state in
  its own folder, mid-epoch 2, and ends with the very weights of the uninterrupted run.
- With ``save_on_each_node`` set by an override, each node's directory holds a whole state (less
  the other node's RNG file), and a fresh Trainer on each node resumes from its own directory,
  mid-epoch, to the very weights of the uninterrupted run; a state saved asynchronously is
  refused on both, before anything is written (its background publication needs a shared folder).
- ``save_checkpoint(save_per_node=True)`` writes the file on both nodes, ``False`` on node 0 only;
  the per-node file loads on each node.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port, subprocess_env
from tests.launch import WORKERS_DIR, launcher

TIMEOUT_S = 120.0


def launch_node(
    node_rank: int, port: int, node_dir: Path, phase: str, shared: Path
) -> subprocess.Popen[bytes]:
    """Start one node's launcher, in ``node_dir`` (its own working directory and file system)."""
    tmp_dir, out = node_dir / "tmp" / phase, node_dir / phase
    tmp_dir.mkdir(parents=True)
    out.mkdir()
    command = [
        *launcher(1, nnodes=2, node_rank=node_rank, master_port=port),
        str(WORKERS_DIR / "several_machines.py"), "--out", str(out), "--phase", phase, "--shared", str(shared),
    ]  # fmt: skip
    with open(out / "output.txt", "w") as output:  # a file, so neither node blocks on a full pipe
        return subprocess.Popen(
            command, cwd=node_dir, env=subprocess_env(tmp_dir), stdout=output, stderr=subprocess.STDOUT
        )


def launch_both(root: Path, phase: str) -> list[dict[str, Any]]:
    """Each node's result (in node order), after both launches of ``phase`` finished."""
    port, dirs = free_port(), [root / f"node{rank}" for rank in (0, 1)]
    launches = [
        launch_node(rank, port, node_dir, phase, root / "shared") for rank, node_dir in enumerate(dirs)
    ]
    for launch in launches:
        try:
            launch.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in launches:  # SIGTERM makes torchrun stop its workers; SIGKILL if it does not
                other.terminate()
                try:
                    other.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    other.kill()
            pytest.fail(
                f"The 2-node run ({phase}) did not finish within {TIMEOUT_S:.0f} s (a hang?); outputs in {root}."
            )
    results = []
    for rank, (launch, node_dir) in enumerate(zip(launches, dirs, strict=True)):
        path, output = node_dir / phase / f"rank{rank}.json", (node_dir / phase / "output.txt").read_text()
        assert launch.returncode == 0 and path.exists(), (
            f"node {rank} failed (exit code {launch.returncode}):\n{output}"
        )
        result = json.loads(path.read_text())
        result.update(dir=node_dir / "checkpoints", output=output)
        results.append(result)
    return results


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each phase's results per node: the first launch, then the relaunch in the same directories."""
    root = tmp_path_factory.mktemp("several_machines").resolve()  # as the workers' getcwd()
    first = launch_both(root, "first")
    return {"first": first, "relaunch": launch_both(root, "relaunch")}


NOTICE = "Saving training states on each machine: "


def test_the_plain_callback_finds_the_folder_not_shared_and_saves_a_whole_state_on_each_node(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    for rank, node in enumerate(nodes["first"]):
        folder = node["dir"] / "states"
        notices = [line for line in node["output"].splitlines() if line.startswith(NOTICE)]
        assert notices[0] == (
            f"{NOTICE}{folder} is not shared (node 1 of 2 cannot see what the main process writes there), so "
            f"each machine keeps its own copy of every state in its own folder; resume each machine from its "
            f"own folder (the same resume_from on each)."
        )
        assert len([line for line in notices if str(folder) in line]) == 1  # once per run
        # asynchronous=True: written synchronously on each node, said once per node
        assert node["output"].count("later asynchronous training states synchronously") == 2  # 2 trainers
        # max_checkpoints=1 rotates on each node: step_3 deleted, step_6 (mid-epoch 2) kept
        states = [name for name in node["files"] if name.startswith("states/") and "lock" not in name]
        assert states == [f"states/step_6/{name}" for name in sorted([*SHARED, f"rng_state_{rank}.pt"])]
        manifest = json.loads((folder / "step_6" / "manifest.json").read_text())
        assert manifest["files"] == sorted([*SHARED[1:], f"rng_state_{rank}.pt"])  # what this node holds
        assert (manifest["num_processes"], manifest["batch_index"]) == (2, 2)
        assert not list(folder.glob(".*"))  # no hidden temporary directory, and the lock released


def test_a_state_saved_by_hand_finds_it_at_its_first_save_and_is_whole_on_each_node(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    for rank, node in enumerate(nodes["first"]):
        folder = node["dir"] / "by-hand"
        assert f"{NOTICE}{folder} is not shared (node 1 of 2" in node["output"]
        state = sorted(name.split("/", 2)[2] for name in node["files"] if name.startswith("by-hand/state/"))
        assert state == sorted([*SHARED, f"rng_state_{rank}.pt"])
        assert not list(folder.glob(".*"))


def test_a_folder_that_both_nodes_see_is_saved_once_and_nothing_is_said(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    for node in nodes["first"]:
        shared_part = (
            node["output"].split("-- the shared folder --")[1].split("-- the shared folder: done --")[0]
        )
        assert "each machine" not in shared_part and "synchronously" not in shared_part
        # node 1 may list the folder before node 0 has released its lock there
        assert [name for name in node["shared_files"] if name != ".run.lock"] == [
            f"final/{name}" for name in sorted([*SHARED, "rng_state_0.pt", "rng_state_1.pt"])
        ]


def test_a_relaunch_resumes_each_node_from_its_own_folder_to_the_uninterrupted_weights(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    for rank, node in enumerate(nodes["relaunch"]):
        assert node["equal_to_uninterrupted"], f"node {rank}"
        assert (node["resumed_at_step"], node["final_step"]) == (6, 8)
        assert [name for name in node["files"] if name.startswith("states/") and "lock" not in name] == [
            f"states/step_6/{name}" for name in sorted([*SHARED, f"rng_state_{rank}.pt"])
        ]
        assert NOTICE in node["output"]  # the relaunch finds it again
    started = 'resume_from="auto": no training state in checkpoints/states, starting a new run'
    assert started in nodes["first"][0]["output"]  # said by the main process
    resumed = (
        r'resume_from="auto": resuming run \S+ from checkpoints/states/step_6, the newest usable state in '
        r"checkpoints/states \(epoch 2, update 6; skipping 2 batches"
    )
    assert re.search(resumed, nodes["relaunch"][0]["output"])


SHARED = ["manifest.json", "model.pt", "optimizer.pt", "trainer_state.pt"]


def test_with_save_on_each_node_set_by_hand_each_node_holds_a_whole_state_and_resumes_from_it(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    shared = SHARED
    for rank, node in enumerate(nodes["first"]):
        state = sorted(
            name.split("/", 1)[1] for name in node["files"] if name.startswith("state-mid-epoch-2/")
        )
        assert state == sorted([*shared, f"rng_state_{rank}.pt"])
        manifest = json.loads((node["dir"] / "state-mid-epoch-2" / "manifest.json").read_text())
        assert manifest["files"] == sorted([*shared[1:], f"rng_state_{rank}.pt"])  # what this node holds
        assert (manifest["num_processes"], manifest["batch_index"]) == (2, 2)  # mid-epoch 2
        assert node["resumed_equal"] and node["resumed_global_step"] == 8


def test_save_per_node_writes_the_checkpoint_on_every_node(nodes: dict[str, list[dict[str, Any]]]) -> None:
    node0, node1 = nodes["first"]
    assert "per-node.pt" in node0["files"] and "per-node.pt" in node1["files"]
    assert "main-only.pt" in node0["files"] and "main-only.pt" not in node1["files"]
    assert node0["loaded_equal"] and node1["loaded_equal"]


def test_an_asynchronous_state_with_save_on_each_node_set_by_hand_is_refused_before_anything_is_written(
    nodes: dict[str, list[dict[str, Any]]],
) -> None:
    for node in nodes["first"]:
        assert (
            "Cannot save checkpoints/state-async asynchronously with accelerate's save_on_each_node"
            in node["asynchronous_save_error"]
        )
        assert "asynchronous=False" in node["asynchronous_save_error"]
        assert not any("state-async" in name for name in node["files"])
