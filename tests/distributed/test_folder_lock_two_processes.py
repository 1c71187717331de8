"""One run per folder on 2 processes (workers/folder_lock.py): a folder held by another live run
fails both ranks before training, with the same message naming the holder; a free folder is held
by the main process during the run and released at its end; the run id is the same on both ranks
and is the one the states record."""

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
