"""What a training state holds beyond the weights, across a real kill and resume.

The runs are ``tests/integration/workers/state_edges_worker.py``'s (4 epochs of 9 updates, a state
every 4 updates and after each epoch): a gradual unfreezing whose callback unfreezes the backbone
when epoch 2 starts, and an EMA callback listed after or before ``SaveTrainingStateCallback``.
Each is killed with SIGKILL in epoch 3 (after update 25, its newest state ``step_24``), resumed
here by a fresh Trainer from its folder, and must end bitwise equal to the uninterrupted run.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from pytorch_accelerated.checkpoints.discovery import resolve_state_dir
from tests.followed_runs import FollowedRun
from tests.integration.workers import state_edges_worker as sew

WORKER = Path(sew.__file__).resolve()
KILLED_AFTER_STEP = 25  # in epoch 3; the newest state then is step_24


def weights_of(trainer: Any) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in trainer.get_model().state_dict().items()}


def largest_difference(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    assert found.keys() == expected.keys()
    return max(float((found[name] - expected[name]).abs().max()) for name in expected)


def requires_grad_of(trainer: Any) -> dict[str, bool]:
    return {name: param.requires_grad for name, param in trainer.get_model().named_parameters()}


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each run of the worker, killed with SIGKILL after update 25: its folder of states."""
    root = tmp_path_factory.mktemp("state_edges")
    runs = {
        name: FollowedRun(WORKER, root / name, "--run", name, "--pause-at-step", str(KILLED_AFTER_STEP))
        for name in sew.RUNS
    }
    try:
        for run in runs.values():
            run.wait_for_line("PAUSED")
            run.kill()
            assert run.process.returncode == -signal.SIGKILL, run.describe()
    finally:
        for run in runs.values():
            run.kill()
    return {name: run.out / "states" for name, run in runs.items()}


def uninterrupted(name: str) -> Any:
    trainer = sew.make_trainer(name)
    sew.train(trainer)
    return trainer


def resumed(name: str, states: Path) -> Any:
    assert resolve_state_dir(states).name == "step_24"
    trainer = sew.make_trainer(name)
    sew.train(trainer, resume_from=states)
    return trainer


def test_gradual_unfreezing_killed_after_the_unfreezing_resumes_with_the_backbone_trainable_bitwise(
    killed: dict[str, Path],
) -> None:
    expected = uninterrupted("unfreeze")
    assert all(requires_grad_of(expected).values())  # the callback unfroze everything in epoch 2
    with pytest.warns(UserWarning, match=r"requires_grad") as caught:
        trainer = resumed("unfreeze", killed["unfreeze"])
    message = next(str(w.message) for w in caught if "requires_grad" in str(w.message))
    # The script froze the backbone again; the state (saved in epoch 3) had it trainable.
    assert "step_24" in message and "0.weight" in message and "2.bias" in message
    assert "4.weight" not in message  # the head was never frozen
    assert requires_grad_of(trainer) == requires_grad_of(expected)
    difference = largest_difference(weights_of(trainer), weights_of(expected))
    assert difference == 0.0, f"the resumed weights differ from the uninterrupted run's by up to {difference}"


@pytest.mark.parametrize("name", ["ema-then-save", "save-then-ema"])
def test_ema_resumed_after_a_kill_equals_the_uninterrupted_ema_whichever_callback_is_listed_first(
    killed: dict[str, Path], name: str
) -> None:
    expected = uninterrupted(name)
    trainer = resumed(name, killed[name])
    assert largest_difference(weights_of(trainer), weights_of(expected)) == 0.0
    difference = largest_difference(sew.ema_weights(trainer), sew.ema_weights(expected))
    assert difference == 0.0, f"the resumed EMA differs from the uninterrupted run's by up to {difference}"
