"""Search the learning rate, width and weight decay of the digits MLP with Optuna, pruning weak trials.

The digits job of examples/train_digits.py, searched: each trial trains a two-layer MLP of the
suggested width with SGD at the suggested learning rate and weight decay, reports the validation
loss after each epoch to the study (OptunaPruningCallback), and is pruned when Optuna's
MedianPruner finds it worse than the median of the trials before it at that epoch. The study lives
in a database, so a search can stop and go on, and several workers can share it:

    python examples/tune_digits.py                                  # SQLite: ./study.db, nothing to set up
    torchrun --nproc_per_node 2 examples/tune_digits.py             # each trial on 2 processes
    python examples/tune_digits.py --storage postgresql://user:password@dbhost/optuna --worker-id gpu-node-1
                                                                    # one per machine, one study

Each worker runs trials until the study holds ``--trials`` of them (every trial runs once, whichever
worker takes it). Each trial trains into its own folder of training states
(``--states-dir/trial_<number>``) with ``resume_from="auto"``: a worker that is killed (or stopped
with SIGTERM) mid-trial and launched again with the same ``--worker-id`` continues its unfinished
trial from its last state, keeping the trial's number and record in the study, then goes on with
the search. Suggestions come from a TPE sampler seeded per trial (``--seed`` and the trial's
number), so a search that was interrupted and resumed suggests what an uninterrupted one would.
Under torchrun only the main process talks to the study: it shares each trial's number and values
with the others, and every process trains.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import socket
import sys
import time
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
import torch
from accelerate import PartialState
from accelerate.utils import broadcast_object_list
from optuna.trial import TrialState
from torch import nn, optim

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    OptunaPruningCallback,
    SaveTrainingStateCallback,
    get_default_callbacks,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # train_digits.py beside this file
from train_digits import NUM_CLASSES, ClassificationMetricsCallback, load_digit_splits  # noqa: E402


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=12, help="trials in the study, over all its workers")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of a trial that is not pruned")
    parser.add_argument("--storage", default="sqlite:///study.db", help="the study's database URL")
    parser.add_argument("--study-name", default="digits-search")
    parser.add_argument("--worker-id", default=socket.gethostname(), help="one per worker of the study")
    parser.add_argument("--states-dir", type=Path, default=Path("tune_states"))
    parser.add_argument("--batch-size", type=int, default=32, help="samples per batch on each process")
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, the sampler")
    parser.add_argument("--startup-trials", type=int, default=3, help="trials never pruned (MedianPruner)")
    parser.add_argument("--warmup-epochs", type=int, default=1, help="epochs never pruned (MedianPruner)")
    return parser


class TrialSeededSampler(optuna.samplers.BaseSampler):
    """Optuna's TPE sampler, its random draws seeded by ``seed``, the trial's number and the
    parameter: a trial gets the same suggestion whichever worker asks and however often the worker
    was restarted (a sampler's own generator would start again from its seed at each launch)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def _tpe(self, trial: Any, name: str) -> optuna.samplers.TPESampler:
        return optuna.samplers.TPESampler(seed=zlib.crc32(f"{self.seed}/{trial.number}/{name}".encode()))

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {}  # each parameter on its own (TPE's default)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self._tpe(trial, name).sample_independent(study, trial, name, distribution)


def suggest(trial: optuna.trial.Trial) -> dict[str, Any]:
    """The trial's values (a resumed trial gets back the ones it was given)."""
    return {
        "lr": trial.suggest_float("lr", 1e-3, 1.0, log=True),
        "width": trial.suggest_int("width", 16, 256, log=True),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
    }


def open_study(args: argparse.Namespace, attempts: int = 5) -> optuna.Study:
    """The study, created by the first worker to get there. Workers started together against a new
    database race to create Optuna's tables: the ones that lose try again a moment later."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    create = functools.partial(
        optuna.create_study,
        study_name=args.study_name,
        storage=args.storage,
        direction="minimize",  # the validation loss
        sampler=TrialSeededSampler(args.seed),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=args.startup_trials, n_warmup_steps=args.warmup_epochs
        ),
        load_if_exists=True,
    )
    for attempt in range(attempts - 1):
        try:
            return create()
        except sqlalchemy.exc.SQLAlchemyError:
            time.sleep(1.0 + attempt)
    return create()


def next_trial(study: optuna.Study, args: argparse.Namespace) -> tuple[optuna.trial.Trial, bool] | None:
    """On the main process: this worker's unfinished trial (killed mid-way: it resumes), else a new
    one while the study has fewer than ``--trials``, else None. Returns the trial and whether it resumes."""
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if frozen.user_attrs.get("worker") == args.worker_id:
            storage = optuna.storages.RDBStorage(args.storage)
            study_id = storage.get_study_id_from_name(study.study_name)
            return optuna.trial.Trial(
                study, storage.get_trial_id_from_study_id_trial_number(study_id, frozen.number)
            ), True
    if len(study.get_trials(deepcopy=False)) >= args.trials:
        return None
    trial = study.ask()
    if trial.number >= args.trials:  # another worker asked at the same time and took the last one
        trial.set_user_attr("surplus", True)
        study.tell(trial, state=TrialState.FAIL)
        return None
    trial.set_user_attr("worker", args.worker_id)
    return trial, False


def from_main_process(value: Any) -> Any:
    """The main process's ``value``, on every process."""
    return broadcast_object_list([value])[0] if PartialState().num_processes > 1 else value


def make_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(64, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, NUM_CLASSES),
    )


def run_trial(args: argparse.Namespace, number: int, params: dict[str, Any], trial: Any) -> Trainer:
    """Train (or go on training) trial ``number``; raises ``optuna.TrialPruned`` when it is pruned."""
    torch.manual_seed(args.seed)  # the same initial weights on every process
    train_dataset, validation_dataset, _, _ = load_digit_splits(args.seed)
    model = make_model(params["width"])
    optimizer = optim.SGD(
        model.parameters(), lr=params["lr"], momentum=0.9, weight_decay=params["weight_decay"]
    )
    trainer = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optimizer,
        callbacks=(
            ClassificationMetricsCallback(NUM_CLASSES),
            # Before the saver: a state saved at an epoch's end always follows that epoch's report.
            OptunaPruningCallback(trial, monitor="eval_loss_epoch"),
            SaveTrainingStateCallback(
                str(args.states_dir / f"trial_{number}"), save_every_n_epochs=1, max_checkpoints=2
            ),
            *get_default_callbacks(progress_bar=False),
        ),
    )
    trainer.train(
        train_dataset=train_dataset,
        eval_dataset=validation_dataset,
        num_epochs=args.epochs,
        per_device_batch_size=args.batch_size,
        seed=args.seed,
        resume_from="auto",  # the trial's newest state, or a new run
    )
    return trainer


def stopped_by_signal(trainer: Trainer) -> int | None:
    saver = trainer.callback_handler.get_callback(SaveTrainingStateCallback)
    return saver.signal_received if saver is not None else None


def finish(study: optuna.Study, trial: Any, trainer: Trainer | None, epochs: int, seconds: float) -> None:
    """On the main process: tell the study how the trial ended (``trainer`` None: pruned)."""
    trial.set_user_attr("epochs", epochs)
    trial.set_user_attr("seconds", round(seconds, 3))
    if trainer is None:
        study.tell(trial, state=TrialState.PRUNED)
        print(f"TRIAL {trial.number} PRUNED after {epochs} epochs in {seconds:.1f} s", flush=True)
        return
    accuracy = trainer.run_history.get_latest_metric("accuracy")
    trial.set_user_attr("accuracy", accuracy)
    value = trainer.run_history.get_latest_metric("eval_loss_epoch")
    study.tell(trial, value)
    print(
        f"TRIAL {trial.number} COMPLETE after {epochs} epochs in {seconds:.1f} s: validation loss {value:.4f}, "
        f"accuracy {accuracy:.4f}",
        flush=True,
    )


def work(args: argparse.Namespace, study: optuna.Study | None) -> int:
    """Run trials until the study has enough; the exit code (128 + signal when stopped by one)."""
    state = PartialState()
    while True:
        chosen = next_trial(study, args) if study is not None else None
        trial, resumed = chosen if chosen is not None else (None, False)
        job = from_main_process(None if trial is None else (trial.number, suggest(trial), resumed))
        if job is None:
            return 0
        number, params, resumed = job
        if state.is_main_process:
            print(
                f"TRIAL {number} {'RESUMED' if resumed else 'STARTED'} on {args.worker_id}: {params}",
                flush=True,
            )
        start, trainer = time.perf_counter(), None
        try:
            trainer = run_trial(args, number, params, trial)
        except optuna.TrialPruned:
            pass
        if trainer is not None and (signum := stopped_by_signal(trainer)) is not None:
            return 128 + signum  # the trial stays running: the next launch with this worker id resumes it
        epochs = len(trainer.run_history.get_metric_values("eval_loss_epoch")) if trainer else None
        if study is not None:
            finish(study, trial, trainer, epochs or pruned_epochs(study, number), time.perf_counter() - start)
        if state.is_local_main_process:
            shutil.rmtree(args.states_dir / f"trial_{number}", ignore_errors=True)  # told: not resumed again
        state.wait_for_everyone()


def pruned_epochs(study: optuna.Study, number: int) -> int:
    """The epochs a pruned trial ran: one report per epoch."""
    return len(study.trials[number].intermediate_values)


def summary(study: optuna.Study, args: argparse.Namespace) -> None:
    trials = [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get("surplus")]
    done = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    complete = [t for t in done if t.state == TrialState.COMPLETE]
    pruned = [t for t in done if t.state == TrialState.PRUNED]
    print(
        f"STUDY {len(done)} of {args.trials} trials finished: {len(complete)} complete, {len(pruned)} pruned"
    )
    for t in done:
        print(
            f"  trial {t.number} {t.state.name.lower()}: {t.user_attrs.get('epochs')} epochs, "
            f"{t.user_attrs.get('seconds')} s, value {t.value:.4f}, {t.params}"
        )
    if complete:
        per_epoch = sum(t.user_attrs["seconds"] for t in complete) / sum(
            t.user_attrs["epochs"] for t in complete
        )
        saved = sum((args.epochs - t.user_attrs["epochs"]) * per_epoch for t in pruned)
        print(f"PRUNING saved {saved:.1f} s ({per_epoch:.2f} s per epoch of a complete trial)")
        best = study.best_trial
        print(
            f"BEST trial {best.number}: validation loss {best.value:.4f}, accuracy {best.user_attrs['accuracy']:.4f}, {best.params}"
        )
        print(f"FINAL best_validation_loss={best.value:.4f} best_accuracy={best.user_attrs['accuracy']:.4f}")


def main() -> None:
    args = parser().parse_args()
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # a tiny model: see train_digits.py
    # The process group, formed before the first trial: the main process shares each trial's values
    # through it, and every trial's Trainer uses it. (On a machine without an accelerator, gloo.)
    state = PartialState(cpu=not torch.accelerator.is_available(), timeout=timedelta(seconds=300))
    study = open_study(args) if state.is_main_process else None
    code = work(args, study)
    if study is not None and code == 0:
        summary(study, args)
    sys.exit(code)


if __name__ == "__main__":
    main()
