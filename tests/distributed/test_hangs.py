"""Two processes, one of which stops taking part: no process waits for long.

A signal seen by one rank stops both at the same point; a rank whose peer died (its connections
left open) exits within a few seconds of torchrun's SIGTERM instead of being killed 30 s later;
a rank whose peer raised and lingers fails after the collective timeout, with a note that says
which rank and where. See workers/hangs.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.launch import launch_workers

GRACE_S = 2  # PT_ACC_SIGNAL_GRACE in these runs
TIMEOUT_S = 2  # PT_ACC_COLLECTIVE_TIMEOUT in these runs


def test_a_signal_on_one_rank_stops_both_at_the_same_point_and_saves_once(tmp_path: Path) -> None:
    run = launch_workers("hangs.py", tmp_path, "--mode", "signal", torchrun=True)
    for name, step, eval_losses in (("evaluation", 8, []), ("training", 3, [])):
        ranks = [result[name] for result in run.results]
        assert [r["global_step"] for r in ranks] == [step, step], name
        assert ranks[0]["states"] == [f"step_{step}"], name
        assert all(r["eval_losses"] == eval_losses for r in ranks), name  # no partial evaluation
        assert all(r["handler_restored"] and r["wakeup_fd"] == -1 for r in ranks), name
    assert all(r["failure"] == {"handler_restored": True, "wakeup_fd": -1} for r in run.results)
    assert "Training stopped: received SIGTERM; saved the training state to" in run.output
    assert "run no Python" not in run.output  # the watchdog left the healthy run alone


def test_a_rank_whose_peer_died_exits_within_seconds_of_torchruns_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_ACC_SIGNAL_GRACE", str(GRACE_S))
    run = launch_workers("hangs.py", tmp_path, "--mode", "peer_dies", expect_success=False, torchrun=True)
    ended_at = time.time()
    died_at = float((tmp_path / "died_at").read_text())
    assert run.returncode != 0
    # torchrun's SIGTERM comes right after rank 1's death; it would SIGKILL rank 0 30 s later.
    assert ended_at - died_at < 15, run.describe()
    assert (
        f"[rank 0] Received SIGTERM, but this process has run no Python for {GRACE_S} s: it is stuck, "
        f"probably in a collective operation that another process no longer takes part in"
    ) in run.output, run.describe()
    assert "It was after on_train_step_start of epoch 1 (training batch 5)." in run.output
    assert "exitcode  : 143" in run.output  # 128 + SIGTERM, as the signal itself would give


@pytest.mark.parametrize(
    ("mode", "where"),
    [
        ("raise_in_train", "after on_train_step_start of epoch 1 (training batch 3)"),
        ("raise_in_eval", "after on_eval_step_end of epoch 1 (training batch 8)"),
    ],
)
def test_a_collective_the_other_rank_never_reaches_fails_after_the_timeout_naming_rank_and_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, where: str
) -> None:
    monkeypatch.setenv("PT_ACC_COLLECTIVE_TIMEOUT", str(TIMEOUT_S))
    run = launch_workers(
        "hangs.py", tmp_path, "--mode", mode, expect_success=False, timeout_s=60, torchrun=True
    )
    assert run.returncode != 0
    # raise_in_train: rank 0 starts 2.5 timeouts late, and the group must still form (it failed
    # with torch's DistStoreError at formation when the timeout applied there too).
    assert run.elapsed_s < 35, run.describe()  # without the timeout: 30 minutes
    failed, lingering = run.results
    assert lingering["error"] == "ValueError('rank 1 failed on purpose')" and lingering["notes"][
        -1
    ].startswith("raised in callback Inject.")
    assert failed["error"].startswith("RuntimeError(") and "Timed out" in failed["error"]
    assert failed["failed_after_s"] < 20
    assert failed["notes"] == [late_note(where)], run.describe()


def late_note(where: str) -> str:
    return (
        f"rank 0 waited {TIMEOUT_S} s in a collective operation {where}, but rank 1 did not reach it "
        f"in that time: it is slow (a long callback, save or data loading on that process alone), "
        f"stuck, or has failed; its output above says which. If it is only slow, shorten that work "
        f"or raise PT_ACC_COLLECTIVE_TIMEOUT (now {TIMEOUT_S} seconds)."
    )


def test_a_rank_sleeping_in_a_callback_is_reported_as_late_not_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_ACC_COLLECTIVE_TIMEOUT", str(TIMEOUT_S))
    run = launch_workers(
        "hangs.py", tmp_path, "--mode", "sleep_in_callback", expect_success=False, timeout_s=60, torchrun=True
    )
    waiting, sleeping = run.results
    assert run.returncode != 0 and waiting is not None, run.describe()
    assert waiting["error"].startswith("RuntimeError(") and "Timed out" in waiting["error"]
    assert waiting["notes"] == [late_note("after on_train_step_start of epoch 1 (training batch 3)")]
    assert "failed" not in waiting["notes"][0].split(":")[0]  # what it says before the possible causes
    # torchrun ends the sleeping rank (SIGTERM) once rank 0 has failed; should it wake first, its
    # collective fails at once, with a note that its peer may have given up waiting for it.
    assert sleeping is None or "gave up waiting for this one" in sleeping["notes"][-1], run.describe()
