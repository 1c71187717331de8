"""A stop signal under torchrun's agent with restarts left: the run saves, runs its end hooks and
then exits non-zero (128 + signum), so that the agent restarts it; without restarts left, or
without an agent, ``train()`` returns as before. The process group formed on the agent's store
in a namespace of its own per attempt (the token every process of an attempt agrees on, whatever
an earlier attempt left in the store), and the warning for a group formed there without one. The
half-written states of killed saves, removed by the run that takes the folder next. Real
restarts: tests/distributed/test_torchrun_restarts.py."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated._internal import agent_store as agent_store_module
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


# ------------------------------------------------ a group formed on the agent's store, per attempt


@pytest.fixture
def agent_store() -> Iterator[torch.distributed.TCPStore]:
    """A real TCP store, as torchrun's agent holds it (the processes are threads here)."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield server


def client(server: torch.distributed.TCPStore) -> torch.distributed.TCPStore:
    return torch.distributed.TCPStore(
        "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30)
    )


def form(server: torch.distributed.TCPStore, world_size: int, order: list[int]) -> dict[int, str]:
    """Each rank's token, the ranks started in ``order`` (0.1 s apart)."""
    tokens: dict[int, str] = {}
    timeout = timedelta(seconds=30)

    def rank_process(rank: int) -> None:
        store = client(server)
        if rank == 0:
            tokens[rank] = agent_store_module.hand_out_token(store, world_size, timeout)
        else:
            tokens[rank] = agent_store_module.ask_for_token(store, rank, timeout)

    threads = [threading.Thread(target=rank_process, args=(rank,)) for rank in order]
    for thread in threads:
        thread.start()
        time.sleep(0.1)
    for thread in threads:
        thread.join(60)
    return tokens


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0]], ids=["process 0 first", "process 0 last"])
def test_every_attempt_agrees_on_a_new_token_whatever_an_earlier_attempt_left_in_the_store(
    agent_store: torch.distributed.TCPStore, order: list[int]
) -> None:
    first = form(agent_store, 3, order)
    assert len(set(first.values())) == 1 and len(first) == 3
    # Attempt 1 killed half-way: process 2 asked again (its nonce never answered), process 1 did not.
    client(agent_store).set("pytorch_accelerated/attempt/ask/2", "a-nonce-of-a-dead-process")
    second = form(agent_store, 3, order)
    assert len(set(second.values())) == 1 and len(second) == 3
    assert second[0] != first[0]  # a namespace of its own: no key of the first attempt is read


def test_a_process_whose_process_0_never_comes_says_so_within_its_timeout(
    agent_store: torch.distributed.TCPStore,
) -> None:
    form(agent_store, 2, [0, 1])  # an earlier attempt answered process 1 then
    started = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        agent_store_module.ask_for_token(client(agent_store), 1, timedelta(seconds=1))
    assert time.monotonic() - started < 10
    assert str(raised.value) == (
        f"RANK=1 waited 1 s for process 0 (RANK=0) to form the process group on torchrun's store at "
        f"MASTER_ADDR:MASTER_PORT={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}, and it "
        f"did not come: it failed or is still busy before creating the Trainer (see its output)."
    )


def test_process_0_whose_others_never_come_says_how_many_came(
    agent_store: torch.distributed.TCPStore,
) -> None:
    client(agent_store).set("pytorch_accelerated/attempt/ask/1", "a-nonce-of-a-dead-process")  # stale
    with pytest.raises(RuntimeError) as raised:
        agent_store_module.hand_out_token(client(agent_store), 3, timedelta(seconds=1))
    assert str(raised.value) == (
        "Process 0 (RANK=0) waited 1 s for the other processes of this launch to form the process group "
        "on torchrun's store, and 0 of 2 came: the others failed or are still busy before creating the "
        "Trainer (see their output)."
    )


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """This process as rank 0 of 2 under torchrun with 3 restarts left and a store shared with the agent."""
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    agent = {
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(server.port),
    }
    for name, value in agent.items():
        monkeypatch.setenv(name, value)
    yield monkeypatch
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_group_formed_on_the_agents_store_without_a_namespace_warns_that_restarts_may_not_form_it(
    agent_env: pytest.MonkeyPatch,
) -> None:
    # A group of 1 for the test (WORLD_SIZE says 2), formed as accelerate does by default: env://.
    torch.distributed.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    with pytest.warns(UserWarning, match="torchrun will restart this job after a failure") as caught:
        agent_store_module.warn_if_restarts_reuse_the_agent_store()
    assert "an override of _create_accelerator" in str(caught[0].message)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in str(caught[0].message)
    for name, value in (("TORCHELASTIC_USE_AGENT_STORE", "False"), ("TORCHELASTIC_MAX_RESTARTS", "0")):
        agent_env.setenv(name, value)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            agent_store_module.warn_if_restarts_reuse_the_agent_store()  # no store shared / no restarts
        agent_env.setenv(name, "3" if name.endswith("RESTARTS") else "True")


def test_the_trainers_own_group_forms_in_a_namespace_of_its_own_and_does_not_warn(
    agent_env: pytest.MonkeyPatch,
) -> None:
    init_method = agent_store_module.init_method()
    assert init_method == "pytorch-accelerated-attempt://"
    torch.distributed.init_process_group("gloo", init_method=init_method, rank=0, world_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent_store_module.warn_if_restarts_reuse_the_agent_store()
    assert agent_store_module.init_method() is None  # a group exists: torch's own rules


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
