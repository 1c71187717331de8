"""Two machines that share no file system: two launches over loopback, ``torchrun --nnodes 2
--node_rank {0,1} --nproc_per_node 1``, each in its own working directory with its own
``checkpoints/`` folder (the worker is ``workers/several_machines.py``).

- A training state saved the default way (by the main process only) cannot work there: it fails
  on both nodes, node 1 saying that it cannot see the main process's directory and how to save on
  each node; nothing is left behind.
- With ``save_on_each_node``, each node's directory holds a whole state (less the other node's
  RNG file), and a fresh Trainer on each node resumes from its own directory, mid-epoch, to the
  very weights of the uninterrupted run.
- ``save_checkpoint(save_per_node=True)`` writes the file on both nodes, ``False`` on node 0 only;
  the per-node file loads on each node.
- The same in the background (``asynchronous=True``) fails at once the same way, rather than
  waiting for node 1's files until the collective timeout.
- A state saved asynchronously on each node is refused on both, before anything is written (its
  background publication needs a shared folder).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import finished_but_aborted_at_teardown, free_port, subprocess_env
from tests.launch import WORKERS_DIR, launcher

TIMEOUT_S = 120.0


def launch_node(node_rank: int, port: int, node_dir: Path) -> subprocess.Popen[bytes]:
    """Start one node's launcher, in ``node_dir`` (its own working directory and file system)."""
    tmp_dir = node_dir / "tmp"
    tmp_dir.mkdir(parents=True)
    command = [
        *launcher(1, nnodes=2, node_rank=node_rank, master_port=port),
        str(WORKERS_DIR / "several_machines.py"), "--out", str(node_dir),
    ]  # fmt: skip
    with open(node_dir / "output.txt", "w") as output:  # a file, so neither node blocks on a full pipe
        return subprocess.Popen(
            command, cwd=node_dir, env=subprocess_env(tmp_dir), stdout=output, stderr=subprocess.STDOUT
        )


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each node's result (in node order), after both launches finished."""
    root, port = tmp_path_factory.mktemp("several_machines"), free_port()
    dirs = [root / f"node{rank}" for rank in (0, 1)]
    launches = [launch_node(rank, port, node_dir) for rank, node_dir in enumerate(dirs)]
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
                f"The 2-node run did not finish within {TIMEOUT_S:.0f} s (a hang?); outputs in {root}."
            )
    results = []
    for rank, (launch, node_dir) in enumerate(zip(launches, dirs, strict=True)):
        path, output = node_dir / f"rank{rank}.json", (node_dir / "output.txt").read_text()
        finished = path.exists()
        ok = launch.returncode == 0 or finished_but_aborted_at_teardown(launch.returncode, output, finished)
        assert ok and finished, f"node {rank} failed (exit code {launch.returncode}):\n{output}"
        result = json.loads(path.read_text())
        result["dir"] = node_dir / "checkpoints"
        results.append(result)
    return results


def test_a_state_saved_by_the_main_process_only_fails_on_both_nodes_and_says_how_to_fix_it(
    nodes: list[dict[str, Any]],
) -> None:
    node0, node1 = (node["default_save_error"] for node in nodes)
    assert "process 1 failed to write it" in node0
    assert "process 1 cannot see the directory" in node1 and "save_on_each_node = True" in node1
    for node in nodes:
        assert not any("state-main-only" in name for name in node["files"])  # nothing left behind
        assert not list(node["dir"].glob(".*"))  # no hidden temporary directory either


def test_an_asynchronous_state_saved_by_the_main_process_only_fails_at_once_on_both_nodes(
    nodes: list[dict[str, Any]],
) -> None:
    node0, node1 = (node["default_asynchronous_save_error"] for node in nodes)
    assert "process 1 failed to write it" in node0
    assert "process 1 cannot see the directory" in node1 and "save_on_each_node = True" in node1
    for node in nodes:
        assert not any("state-main-only-async" in name for name in node["files"])
        assert not list(node["dir"].glob(".*"))


def test_each_node_holds_a_whole_state_and_resumes_from_its_own_directory(
    nodes: list[dict[str, Any]],
) -> None:
    shared = ["manifest.json", "model.pt", "optimizer.pt", "trainer_state.pt"]
    for rank, node in enumerate(nodes):
        state = sorted(
            name.split("/", 1)[1] for name in node["files"] if name.startswith("state-mid-epoch-2/")
        )
        assert state == sorted([*shared, f"rng_state_{rank}.pt"])
        manifest = json.loads((node["dir"] / "state-mid-epoch-2" / "manifest.json").read_text())
        assert manifest["files"] == sorted([*shared[1:], f"rng_state_{rank}.pt"])  # what this node holds
        assert (manifest["num_processes"], manifest["batch_index"]) == (2, 2)  # mid-epoch 2
        assert node["resumed_equal"] and node["resumed_global_step"] == 8


def test_save_per_node_writes_the_checkpoint_on_every_node(nodes: list[dict[str, Any]]) -> None:
    assert "per-node.pt" in nodes[0]["files"] and "per-node.pt" in nodes[1]["files"]
    assert "main-only.pt" in nodes[0]["files"] and "main-only.pt" not in nodes[1]["files"]
    assert all(node["loaded_equal"] for node in nodes)


def test_an_asynchronous_state_on_each_node_is_refused_on_every_node_before_anything_is_written(
    nodes: list[dict[str, Any]],
) -> None:
    for node in nodes:
        assert (
            "Cannot save checkpoints/state-async asynchronously with accelerate's save_on_each_node"
            in node["asynchronous_save_error"]
        )
        assert "asynchronous=False" in node["asynchronous_save_error"]
        assert not any("state-async" in name for name in node["files"])
