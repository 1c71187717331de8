"""The suite's forked launches (:mod:`tests.forked`) run a script as ``python script`` and a group as
``torchrun`` would: exit codes, streams, ``__main__``, arguments, folder, environment, ``atexit``,
a real gloo group on the agent-held store, timeouts and kills. The tests that use them rely on this."""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests import forked
from tests.helpers import subprocess_env

PROBE = """
import atexit, json, os, sys, tempfile
import sibling
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({
    "name": __name__, "argv": sys.argv[1:], "cwd": os.getcwd(), "tmp": tempfile.gettempdir(),
    "setting": os.environ.get("FORKED_SETTING"), "sibling": sibling.VALUE,
}))
print("to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise ValueError("boom")
if mode == "sigkill":
    os.kill(os.getpid(), 9)
"""


@pytest.fixture
def probe(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "sibling.py").write_text("VALUE = 'found beside the script'\n")
    script = tmp_path / "scripts" / "probe.py"
    script.write_text(PROBE)
    return script


def run_probe(probe: Path, tmp_path: Path, mode: str) -> subprocess.CompletedProcess[str]:
    env = {**subprocess_env(tmp_path), "FORKED_SETTING": "set"}
    return forked.run(probe, [mode, "--flag"], env=env, cwd=tmp_path, timeout=60)


@pytest.mark.parametrize(
    ("mode", "code"), [("ok", 0), ("exit3", 3), ("raise", 1), ("sigkill", -signal.SIGKILL)]
)
def test_a_forked_script_exits_as_python_would(probe: Path, tmp_path: Path, mode: str, code: int) -> None:
    done = run_probe(probe, tmp_path, mode)
    assert done.returncode == code, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("{") and '"name": "__main__"' in first, done.stdout
    assert f'"argv": ["{mode}", "--flag"]' in first and f'"cwd": "{tmp_path}"' in first
    assert f'"tmp": "{tmp_path}"' in first and '"setting": "set"' in first
    assert '"sibling": "found beside the script"' in first  # the script's folder is first on sys.path
    assert "to stderr" in done.stderr and "to stderr" not in done.stdout
    if mode == "raise":
        assert "Traceback (most recent call last)" in done.stderr and "ValueError: boom" in done.stderr
    # atexit handlers run at the end, as the interpreter runs them, but not after a SIGKILL
    assert ("atexit ran" in done.stdout) == (mode != "sigkill"), done.stdout


GROUP = """
import os, sys
import torch, torch.distributed as dist
from accelerate import PartialState
dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
state = PartialState(cpu=True)  # a group of CPU processes, as the Trainer forms one
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {total.item()}, accelerate sees "
      f"{state.num_processes} processes, agent store {os.environ['TORCHELASTIC_USE_AGENT_STORE']}")
dist.destroy_process_group()
"""


def test_two_forked_processes_form_a_gloo_group_as_under_torchrun(tmp_path: Path) -> None:
    script = tmp_path / "group.py"
    script.write_text(GROUP)
    done = forked.run(script, nproc=2, env=subprocess_env(tmp_path), cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        line = f"rank {rank} of 2: sum 3.0, accelerate sees 2 processes, agent store True"
        assert line in done.stdout.splitlines(), done.stdout + done.stderr


def test_a_launch_past_its_timeout_is_killed_and_raises(tmp_path: Path) -> None:
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        forked.run(script, env=subprocess_env(tmp_path), cwd=tmp_path, timeout=3)
    assert time.monotonic() - start < 20
    assert "started" in str(raised.value.output)


def test_kill_reaches_the_children_of_a_process_in_a_session_of_its_own(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, time
            child = subprocess.Popen(["sleep", "600"])
            open(sys.argv[1], "w").write(str(child.pid))
            time.sleep(600)
            """
        )
    )
    pid_file = tmp_path / "child.pid"
    launch = forked.start(
        script, [str(pid_file)], env=subprocess_env(tmp_path), cwd=tmp_path, new_session=True
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline and launch.poll() is None, launch.output()
        time.sleep(0.05)
    launch.kill()
    assert launch.wait(timeout=30) == -signal.SIGKILL
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the script's child outlived the kill of its process group"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its parent, the init process here) counts as gone
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
