"""Changed settings on resume: each is refused before anything changes, naming the saved and the
new value and the fix, or applied with a one-line notice (docs/checkpoints.md, "Changed
settings"); and the line a resume prints. Real runs of a small linear model, in this process.

The batch settings and the number of processes are covered by tests/integration/test_resume.py
and tests/distributed/test_resume_other_process_count.py.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback
from pytorch_accelerated.checkpoints import changed_settings
from tests.helpers import EventRecorder, make_linear_model, make_regression_data, make_trainer

NUM_SAMPLES = 208
BATCH = 16  # 13 batches per epoch, for 208, 200 and 196 samples alike


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """States of an Adam run over 208 samples: ``step_4`` (mid-epoch) and ``epoch_1``."""
    folder = tmp_path_factory.mktemp("settings") / "states"
    model = make_linear_model()
    trainer = make_trainer(
        (SaveTrainingStateCallback(str(folder), save_every_n_steps=4, save_every_n_epochs=1),),
        model=model,
        optimizer=torch.optim.Adam(model.parameters(), lr=0.01),
    )
    trainer.train(make_regression_data(NUM_SAMPLES), num_epochs=1, per_device_batch_size=BATCH)
    return {"folder": folder, "mid": folder / "step_4", "boundary": folder / "epoch_1"}


def adam_trainer(log: list[str] | None = None, **optimizer_kwargs: Any) -> Trainer:
    model = make_linear_model()
    optimizer = torch.optim.Adam(model.parameters(), **{"lr": 0.01, **optimizer_kwargs})
    return make_trainer((EventRecorder(log),) if log is not None else (), model=model, optimizer=optimizer)


def resume(trainer: Trainer, state: Path, num_samples: int = NUM_SAMPLES, **kwargs: Any) -> None:
    trainer.train(
        make_regression_data(num_samples),
        num_epochs=2,
        per_device_batch_size=BATCH,
        resume_from=state,
        **kwargs,
    )


def assert_refused_before_anything_changed(trainer: Trainer, log: list[str], weights: dict[str, Any]) -> None:
    assert log == ["on_init_end"], "an event fired: training had started"
    now = trainer.get_model().state_dict()
    assert all(torch.equal(now[name], weights[name]) for name in weights), "weights were loaded"
    assert trainer.optimizer.state_dict()["state"] == {}, "the optimizer state was loaded"
    assert trainer.progress.global_step == 0


def refused(make: Any, state: Path, match: str, **kwargs: Any) -> None:
    log: list[str] = []
    trainer = make(log)
    weights = {name: value.clone() for name, value in trainer.get_model().state_dict().items()}
    with pytest.raises(ValueError, match=match):
        resume(trainer, state, **kwargs)
    assert_refused_before_anything_changed(trainer, log, weights)


# ---------------------------------------------------------------------------- refused


@pytest.mark.parametrize("num_samples", [200, 196])
def test_mid_epoch_state_of_another_training_set_length_is_refused_naming_both(
    states: dict[str, Path], num_samples: int
) -> None:
    match = f"saved mid-epoch over a training set of 208 samples, but this run's has {num_samples}.*Resume with the same"
    refused(adam_trainer, states["mid"], match, num_samples=num_samples)


def sgd_momentum(log: list[str]) -> Trainer:
    model = make_linear_model()
    return make_trainer(
        (EventRecorder(log),), model=model, optimizer=torch.optim.SGD(model.parameters(), 0.01, 0.9)
    )


def adamw(log: list[str]) -> Trainer:
    model = make_linear_model()
    return make_trainer(
        (EventRecorder(log),), model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=0.01)
    )


@pytest.mark.parametrize(
    "make, name", [(sgd_momentum, "sgd.SGD"), (adamw, "adamw.AdamW")], ids=["SGD", "AdamW"]
)
def test_state_of_another_optimizer_class_is_refused_naming_both(
    states: dict[str, Path], make: Any, name: str
) -> None:
    match = (
        rf"holds the state of a torch.optim.adam.Adam optimizer, but this run's optimizer is a torch.optim.{name}"
        r".*Resume with the optimizer the state was saved with, or start a new run from its weights only"
    )
    refused(make, states["mid"], match)


def test_state_of_parameters_in_other_groups_is_refused_naming_the_shapes(states: dict[str, Path]) -> None:
    def regrouped(log: list[str]) -> Trainer:
        model = make_linear_model()
        groups = [{"params": [model.bias]}, {"params": [model.weight]}]  # the saved run had one group of both
        return make_trainer((EventRecorder(log),), model=model, optimizer=torch.optim.Adam(groups, lr=0.01))

    # One group saved, two now: the groups' count is checked first (as for any load).
    with pytest.raises(Exception, match=r"1 parameter group\(s\) of \[2\] parameters, the optimizer has 2"):
        resume(regrouped([]), states["mid"])

    def swapped(log: list[str]) -> Trainer:
        model = make_linear_model()
        params = [model.bias, model.weight]  # the saved run's order: weight, bias
        return make_trainer((EventRecorder(log),), model=model, optimizer=torch.optim.Adam(params, lr=0.01))

    refused(
        swapped,
        states["mid"],
        r"parameters of shapes group 0: \[\(1, 3\), \(1,\)\] per group.*has group 0: \[\(1,\), \(1, 3\)\]",
    )


def test_an_older_state_without_the_class_is_refused_where_its_groups_lack_a_setting() -> None:
    # A state that records no optimizer class (older versions): the saved groups' keys decide.
    model = make_linear_model()
    saved = torch.optim.Adam(model.parameters()).state_dict()
    objects = SimpleNamespace(optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with pytest.raises(
        ValueError, match=r"parameter groups lack \['dampening', 'momentum'\], which this run's"
    ):
        changed_settings.check_optimizer(objects, Path("old"), {}, saved)  # type: ignore[arg-type]
    # Settings that torch fills in on load (added by newer versions) are no reason to refuse.
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9).state_dict()
    for key in ("nesterov", "maximize", "foreach", "differentiable", "fused"):
        del sgd["param_groups"][0][key]
    changed_settings.check_optimizer(objects, Path("old"), {}, sgd)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- applied, with a notice


def resumed_with_notice(state: Path, trainer: Trainer | None = None, **kwargs: Any) -> tuple[Trainer, str]:
    trainer = trainer or adam_trainer()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(trainer, state, **kwargs)
    notices = [str(w.message) for w in caught if str(w.message).startswith(f"Resuming {state}: ")]
    assert len(notices) == 1, [str(w.message) for w in caught]
    return trainer, notices[0]


def test_epoch_boundary_state_resumes_on_another_training_set_length_with_a_notice(
    states: dict[str, Path],
) -> None:
    trainer, notice = resumed_with_notice(states["boundary"], num_samples=200)
    assert (
        "the training set has 200 samples, not the 208 it was saved with (the next epochs use the new set)"
        in notice
    )
    assert trainer.progress.global_step == 13 + 13


def test_another_seed_is_announced_and_the_saved_one_kept(states: dict[str, Path]) -> None:
    trainer, notice = resumed_with_notice(states["mid"], seed=7)
    assert "seed=7 is not used: the saved seed 42 orders the epochs" in notice
    assert trainer.loaders.train_sampler.seed == 42


def test_another_learning_rate_is_announced_and_the_saved_one_wins(states: dict[str, Path]) -> None:
    trainer, notice = resumed_with_notice(states["mid"], trainer=adam_trainer(lr=0.1, weight_decay=0.5))
    assert (
        "the optimizer continues with its saved settings: lr 0.01, not this run's 0.1; "
        "weight_decay 0, not this run's 0.5 (docs: 'Changed settings')"
    ) in notice
    assert trainer.optimizer.param_groups[0]["lr"] == 0.01


def test_the_documented_override_trains_on_with_the_new_learning_rate(states: dict[str, Path]) -> None:
    class NewLearningRate(Trainer):
        def load_training_state(self, input_dir: Any) -> dict[str, Any]:
            loaded = super().load_training_state(input_dir)
            for group in self.optimizer.param_groups:
                group["lr"] = 0.1
            return loaded

    model = make_linear_model()
    trainer = make_trainer(
        model=model, optimizer=torch.optim.Adam(model.parameters(), lr=0.1), trainer_class=NewLearningRate
    )
    resumed_with_notice(states["mid"], trainer=trainer)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.1


def test_the_same_settings_resume_without_a_notice(states: dict[str, Path]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resume(adam_trainer(), states["mid"])
    assert not [w for w in caught if str(w.message).startswith("Resuming")]


@pytest.mark.parametrize("optimizer_class", [torch.optim.SGD, torch.optim.Adam])
def test_a_momentum_that_the_scheduler_cycles_is_not_announced_as_a_changed_setting(
    tmp_path: Path, optimizer_class: type[torch.optim.Optimizer]
) -> None:
    """OneCycleLR cycles SGD's momentum (Adam's first beta): a state saved mid-cycle holds another
    momentum than a new run's optimizer, which is the schedule, not a change of settings. A changed
    setting of the schedule itself (its ``max_momentum``) is still announced."""

    def run(state: Path | None, max_momentum: float = 0.95) -> list[str]:
        model = make_linear_model()
        kwargs: dict[str, Any] = {"momentum": 0.9} if optimizer_class is torch.optim.SGD else {}
        trainer = make_trainer(
            (SaveTrainingStateCallback(str(tmp_path / "states"), save_every_n_steps=4),),
            model=model,
            optimizer=optimizer_class(model.parameters(), lr=0.01, **kwargs),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train(
                make_regression_data(NUM_SAMPLES),
                num_epochs=1,
                per_device_batch_size=BATCH,
                resume_from=state,
                create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(
                    optimizer, max_lr=0.05, total_steps=13, max_momentum=max_momentum
                ),
            )
        return [str(w.message) for w in caught if str(w.message).startswith("Resuming")]

    assert run(None) == []
    assert run(tmp_path / "states" / "step_8") == []
    (notice,) = run(tmp_path / "states" / "step_8", max_momentum=0.99)
    assert "max_momentum 0.95, not this run's 0.99" in notice


# ---------------------------------------------------------------------------- the resume line


def test_a_resume_says_which_state_where_and_what_it_skips(states: dict[str, Path], capsys: Any) -> None:
    resume(adam_trainer(), states["mid"])
    expected = (
        f"Resumed from {states['mid']} (epoch 1, update 4; skipping 4 batches already trained this epoch)"
    )
    assert expected in capsys.readouterr().out.splitlines()


def test_a_folder_resume_names_the_state_it_chose(states: dict[str, Path], capsys: Any) -> None:
    resume(adam_trainer(), states["folder"])
    chosen = states["folder"] / "final"
    expected = f"Resumed from {chosen}, the newest usable state in {states['folder']} (update 13; training continues with epoch 2)"
    assert expected in capsys.readouterr().out.splitlines()
