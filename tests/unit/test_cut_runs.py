"""A run cut mid-epoch by ``max_num_train_steps`` records where it really stopped, and a relaunch with a
larger limit continues from there, ending where one uninterrupted run with that limit ends (issue 30,
finding 9). Real one-process runs: 64 samples in batches of 4 (16 updates per epoch), a model with
dropout and a callback that draws from torch's RNG at every epoch end (so the RNG streams after the cut
matter), SGD with momentum, a step schedule that does not depend on the limit, an evaluation after
every epoch; the cut run is limited to 20 updates (4 batches into epoch 2).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from tests.helpers import make_regression_data, make_trainer, weights

CUT_AT = 20  # 16 updates of epoch 1, then 4 of epoch 2's 16
TRAIN, EVAL = make_regression_data(64), make_regression_data(12, seed=1)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))


class DrawsAtEpochEnd(TrainerCallback):
    """Draws from torch's RNG at every epoch end, as a callback that picks a random sample to show does."""

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        torch.rand(3)


def run(save_dir: Path, limit: int, resume_from: Path | None = None) -> Trainer:
    """A run of at most ``limit`` updates (10 epochs would be 160), saving ``final`` into ``save_dir``."""
    trainer = make_trainer(
        (DrawsAtEpochEnd(), SaveTrainingStateCallback(str(save_dir))),
        model=make_model(),
        lr=0.01,
        momentum=0.5,
    )
    trainer.train(
        TRAIN,
        num_epochs=10,
        eval_dataset=EVAL,
        per_device_batch_size=4,
        max_num_train_steps=limit,
        create_scheduler_fn=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=10, gamma=0.5),
        resume_from=resume_from,
    )
    return trainer


def largest_difference(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    return max(float((found[name] - expected[name]).abs().max()) for name in expected)


def history(trainer: Trainer) -> dict[str, Any]:
    names = ("train_loss_epoch", "eval_loss_epoch")
    return {name: trainer.run_history.get_metric_values(name) for name in names}


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of states of a run cut by max_num_train_steps=20."""
    folder = tmp_path_factory.mktemp("cut") / "states"
    trainer = run(folder, CUT_AT)
    assert (trainer.progress.global_step, trainer.run_history.current_epoch) == (CUT_AT, 3)
    return folder


def test_the_state_of_a_run_cut_mid_epoch_records_where_it_stopped_in_that_epoch(cut_run: Path) -> None:
    state = torch.load(cut_run / "final" / "trainer_state.pt", weights_only=True)
    # Epoch 2 (counted from 0: 1) trained 4 of its 16 batches; before, the state said epoch 2, batch 0.
    assert state["progress"] == {"epoch": 1, "global_step": 20, "batch_index": 4, "epoch_step": 4}
    assert state["run_history"]["current_epoch"] == 2


@pytest.mark.parametrize("larger_limit", [40, 28])
def test_a_relaunch_with_a_larger_limit_continues_the_cut_epoch_and_ends_as_the_uninterrupted_run(
    cut_run: Path, tmp_path: Path, larger_limit: int
) -> None:
    expected = run(tmp_path / "uninterrupted", larger_limit)
    trainer = run(tmp_path / "relaunched", larger_limit, resume_from=cut_run / "final")
    assert trainer.progress.global_step == expected.progress.global_step == larger_limit
    difference = largest_difference(weights(trainer.get_model()), weights(expected.get_model()))
    assert difference == 0.0, (
        f"the relaunched weights differ from the uninterrupted run's by up to {difference}"
    )
    # The cut epoch's metrics are those of the whole epoch, once: as in the uninterrupted run.
    assert history(trainer) == history(expected)


def test_a_relaunch_with_the_same_limit_says_the_limit_is_reached(
    cut_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainer = run(tmp_path / "again", CUT_AT, resume_from=cut_run / "final")
    assert re.search(
        r"Nothing to train: .* already completed 20 optimizer updates \(max_num_train_steps=20\)\. "
        r"Pass a larger max_num_train_steps to continue\.",
        capsys.readouterr().out,
    )
    assert trainer.progress.global_step == CUT_AT  # nothing was trained
