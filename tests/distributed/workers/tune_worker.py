"""The range test and Optuna's pruning on a group of processes.

1. ``find_learning_rate`` on a linear model at ``--batch`` samples per process (the test runs the
   same global batch on one process and compares);
2. a ``train()`` after the range test against a ``train()`` of a second Trainer without it;
3. a trial of an Optuna study held by rank 0 alone (rank 1 passes ``trial=None``), pruned after
   the second epoch's evaluation by a ``ThresholdPruner``: every rank must raise ``TrialPruned``
   after the same evaluation; then a trial that is not pruned.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import torch
from common import (
    NUM_FEATURES,
    NUM_OUTPUTS,
    RegressionDataset,
    linear_targets_dataset,
    make_mlp,
    parse_args,
    rank,
    state_dict_to_lists,
    write_result,
)
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import OptunaPruningCallback, SaveTrainingStateCallback

RANGE = {"start_lr": 1e-3, "end_lr": 100.0, "num_steps": 40}


def linear_trainer() -> Trainer:
    torch.manual_seed(0)
    model = nn.Linear(NUM_FEATURES, NUM_OUTPUTS)
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=())


def range_test(batch: int) -> dict:
    result = linear_trainer().find_learning_rate(
        linear_targets_dataset(256), per_device_batch_size=batch, **RANGE
    )
    return {
        "losses": result.losses,
        "learning_rates": result.learning_rates,
        "suggestion": result.suggestion,
        "diverged": result.diverged,
    }


def train_after(range_test_first: bool) -> dict:
    model = make_mlp(seed=0)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), callbacks=()
    )
    data = RegressionDataset(64)
    if range_test_first:
        trainer.find_learning_rate(data, per_device_batch_size=4, start_lr=1e-3, end_lr=1.0, num_steps=12)
    trainer.train(data, num_epochs=2, per_device_batch_size=4)
    return state_dict_to_lists(trainer.get_model())


def trial_run(pruner: optuna.pruners.BasePruner, states: Path | None = None) -> dict:
    """A trial; ``states``: saved there with ``resume_from="auto"``."""
    study = optuna.create_study(pruner=pruner) if rank() == 0 else None
    trial = study.ask() if study is not None else None
    model = make_mlp(seed=0)
    saves = () if states is None else (SaveTrainingStateCallback(states),)
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.SGD(model.parameters(), lr=0.05),
        callbacks=(OptunaPruningCallback(trial), *saves),
    )
    outcome = "completed"
    try:
        trainer.train(
            RegressionDataset(64),
            num_epochs=5,
            eval_dataset=RegressionDataset(24, seed=2),
            per_device_batch_size=4,
            resume_from=None if states is None else "auto",
        )
    except optuna.TrialPruned:
        outcome = "pruned"
    except Exception as error:  # noqa: BLE001 (a launch held back is the result)
        outcome = type(error).__name__
    reported = study.trials[0].intermediate_values if study is not None else None
    return {
        "outcome": outcome,
        "global_step": trainer.progress.global_step,
        "eval_losses": trainer.run_history.get_metric_values("eval_loss_epoch"),
        "reported": None if reported is None else {str(step): value for step, value in reported.items()},
    }


def main() -> None:
    args = parse_args({"batch": 8})
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.ThresholdPruner(upper=0.0, n_warmup_steps=1)
    result = {
        "range_test": range_test(args.batch),
        "after_range_test": train_after(True),
        "without_range_test": train_after(False),
        "pruned": trial_run(pruner),
        "not_pruned": trial_run(optuna.pruners.NopPruner()),
        "auto_pruned": [trial_run(pruner, args.out / "trial")["outcome"] for _ in range(3)],
        "records_left": (args.out / "trial" / ".failures").exists(),
    }
    write_result(args.out, result)
    torch.distributed.barrier()  # both results are written before either process tears the group down


if __name__ == "__main__":
    main()
