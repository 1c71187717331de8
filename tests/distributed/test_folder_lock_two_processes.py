"""One run per folder on 2 processes (workers/folder_lock.py): a folder held by another live run
fails both ranks before training, with the same message naming the holder; a free folder is held
by the main process during the run and released at its end; the run id is the same on both ranks
and is the one the states record, and nothing is said about machines; a folder that is each
process's own on one machine is refused on both ranks before training."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from pytorch_accelerated.checkpoints.directories import read_manifest
from tests.launch import launch_workers


def test_two_processes_fail_together_on_a_held_folder_and_share_one_run_id(tmp_path: Path) -> None:
    (tmp_path / "held").mkdir()
    lock = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": "the-test",
        "since": "now",
        "token": "t",
    }
    (tmp_path / "held" / ".run.lock").write_text(json.dumps(lock))
    run = launch_workers("folder_lock.py", tmp_path, timeout_s=120)
    held = [result["held"] for result in run.results]
    assert [h["error"]["type"] for h in held] == ["FolderInUseError"] * 2, run.describe()
    assert held[0]["error"]["message"] == held[1]["error"]["message"]
    assert (
        f"run the-test, process {os.getpid()} on host {socket.gethostname()}, since now"
        in (held[0]["error"]["message"])
    )
    assert [h["updates"] for h in held] == [0, 0]
    assert json.loads((tmp_path / "held" / ".run.lock").read_text()) == lock  # not taken, not removed
    free = [result["free"] for result in run.results]
    assert [f["error"] for f in free] == [None, None], run.describe()
    assert free[0]["run_id"] == free[1]["run_id"] == read_manifest(tmp_path / "free" / "final")["run_id"]
    assert free[0]["lock_seen"] == [True] * 2 and free[0]["updates"] == 2  # 16 samples / (2 x 4)
    assert not (tmp_path / "free" / ".run.lock").exists()
    assert "on each machine" not in run.output
    own = [result["own"] for result in run.results]
    assert [o["error"]["type"] for o in own] == ["ValueError"] * 2 and [o["updates"] for o in own] == [0, 0]
    for rank, result in enumerate(own):  # each names its own folder
        assert result["error"]["message"] == (
            f"The folder {tmp_path / f'own-{rank}'} is seen by some processes of this run and not by others: "
            f"process 1 (node 0) cannot see what the main process writes there, though processes on node 0 "
            f"can. Give every machine the same shared folder, or each machine a folder of its own that all "
            f"its processes see (training states are then saved on each machine)."
        )
    assert list((tmp_path / "own-0").iterdir()) == []  # the lock released
    assert not (tmp_path / "own-1").exists()
