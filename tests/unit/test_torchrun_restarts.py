"""A stop signal under torchrun's agent with restarts left: the run saves, runs its end hooks and
then exits non-zero (128 + signum), so that the agent restarts it; without restarts left, or
without an agent, ``train()`` returns as before. The warning about a store shared with the
agent, and the half-written states of killed saves, removed by the run that takes the folder
next. Real restarts: tests/distributed/test_torchrun_restarts.py."""

from __future__ import annotations

import os
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytorch_accelerated._internal.launch_checks import warn_if_restarts_share_the_agent_store
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.folder_lock import LOCK_NAME
from tests.helpers import make_regression_data, make_trainer


class TermAtStep2(TrainerCallback):
    """Sends SIGTERM after update 2; the saver, which runs after the other callbacks, saves step_2."""

    def __init__(self) -> None:
        self.ended = False

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.ended = True


def run_with_sigterm(tmp_path: Path) -> TermAtStep2:
    term = TermAtStep2()
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path), term))
    trainer.train(make_regression_data(8), num_epochs=3, per_device_batch_size=2)
    return term


def test_sigterm_under_torchrun_with_restarts_left_saves_ends_the_run_then_exits_143(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    term = TermAtStep2()
    with pytest.raises(SystemExit) as raised:
        trainer = make_trainer((SaveTrainingStateCallback(tmp_path), term))
        trainer.train(make_regression_data(8), num_epochs=3, per_device_batch_size=2)
    assert raised.value.code == 128 + signal.SIGTERM == 143
    assert term.ended  # the end hooks ran first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]  # saved; the lock released
    assert not (tmp_path / LOCK_NAME).exists()
    assert (
        f"Training stopped: received SIGTERM; saved the training state to {tmp_path / 'step_2'}; exiting "
        "with code 143 after the end hooks so that torchrun restarts the job (2 restart(s) left), and "
        "the relaunch resumes from it"
    ) in capsys.readouterr().out
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers put back


@pytest.mark.parametrize("restarts", [None, ("3", "3"), ("0", "0")], ids=["no agent", "last", "none"])
def test_sigterm_without_restarts_left_returns_from_train_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restarts: tuple[str, str] | None
) -> None:
    for name in ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"):
        monkeypatch.delenv(name, raising=False)
    if restarts is not None:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restarts[0])
        monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", restarts[1])
    assert run_with_sigterm(tmp_path).ended
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_2"]


def test_warns_when_restarts_would_form_the_group_on_the_agents_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = {
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": "0",
        "WORLD_SIZE": "2",
    }
    for name, value in agent.items():
        monkeypatch.setenv(name, value)
    with pytest.warns(UserWarning, match="torchrun will restart this job after a failure") as caught:
        warn_if_restarts_share_the_agent_store()
    assert "--rdzv-backend c10d --rdzv-endpoint HOST:PORT" in str(caught[0].message)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in str(caught[0].message)
    for name, value in (("TORCHELASTIC_USE_AGENT_STORE", "False"), ("TORCHELASTIC_MAX_RESTARTS", "0")):
        monkeypatch.setenv(name, value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            warn_if_restarts_share_the_agent_store()  # no store shared / no restarts: nothing to say
        monkeypatch.setenv(name, agent[name])


def test_the_run_that_takes_the_folder_removes_the_half_written_states_of_killed_saves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for leftover in (".step_50.incomplete", ".epoch_1.incomplete"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "model.pt").write_bytes(b"half")
    (tmp_path / ".cache").mkdir()  # not a save's: kept
    trainer = make_trainer((SaveTrainingStateCallback(tmp_path),))
    trainer.train(make_regression_data(8), num_epochs=1, per_device_batch_size=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cache", "final"]
    assert (
        f"Removed the half-written states of killed saves in {tmp_path}: .epoch_1.incomplete, "
        ".step_50.incomplete"
    ) in capsys.readouterr().out
