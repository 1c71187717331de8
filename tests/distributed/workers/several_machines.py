"""Worker: one node of a 2-machine run (``torchrun --nnodes 2 --node_rank R --nproc_per_node 1``)
in which the nodes share no file system: each node runs in its own working directory and saves
into its own ``checkpoints/`` folder there (``--shared`` names one folder both nodes see).

``--phase first``: a run with the plain ``SaveTrainingStateCallback`` (asynchronous, keeping 1
state) that finds the folder not shared when it starts, saves on each node, and stops after
update 7 (its newest state: ``step_6``, mid-epoch 2); a state saved by hand
(``save_training_state``, asynchronous) that finds it at its first save; a run into the shared
folder (nothing changes there); then the ``save_on_each_node`` override: a per-node state
mid-epoch 2 resumed by a fresh Trainer, ``save_checkpoint`` with ``save_per_node`` True and
False, and an asynchronous per-node state (refused).

Both phases call ``train(..., resume_from="auto")``. ``--phase relaunch``: the same script
launched again in the same working directories resumes every node from its own folder and
trains to the end; so does an uninterrupted run (the oracle).

Each node reports its files and whether the weights equal those they must.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    STATE_SAVES_ORDER,
    SaveTrainingStateCallback,
    StopTrainingError,
    TrainerCallback,
)

DATA = RegressionDataset(32)  # 2 nodes x batches of 4: 4 updates per epoch
STATE = Path("checkpoints/state-mid-epoch-2")
STATES = Path("checkpoints/states")  # the plain callback's folder, on each node


class PerNodeTrainer(Trainer):
    """Saves training states on every node, set by hand (docs/launching.md, "Several machines")."""

    def _create_accelerator(self) -> Accelerator:
        accelerator = super()._create_accelerator()
        accelerator.project_configuration.save_on_each_node = True
        return accelerator


class SaveMidEpoch(TrainerCallback):
    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == 6 and not STATE.exists():  # the 2nd update of epoch 2
            trainer.save_training_state(STATE)


class StopAfter(TrainerCallback):
    """Ends the run after update ``step`` (as a job that is stopped would), on every process."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == self.step:
            raise StopTrainingError(f"stopped after update {self.step}")


class StartStep(TrainerCallback):
    """Notes the update the run starts at (after a resume: the state's)."""

    step = -1

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.step < 0:
            self.step = trainer.progress.global_step


def new_trainer(cls: type[Trainer], seed: int, callbacks: tuple[Any, ...] = ()) -> Trainer:
    model = make_mlp(seed)
    return cls(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), callbacks=callbacks
    )


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def files_in(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())


def saving_states(*callbacks: Any) -> tuple[Any, ...]:
    """The plain callback, as a user writes it: no setting for machines without a shared folder."""
    return (
        SaveTrainingStateCallback(
            STATES, save_every_n_steps=3, save_at_end=False, max_checkpoints=1, asynchronous=True
        ),
        *callbacks,
    )


def first(shared: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    stopped = new_trainer(Trainer, seed=0, callbacks=saving_states(StopAfter(7)))
    stopped.train(DATA, num_epochs=2, per_device_batch_size=4, resume_from="auto")
    by_hand = new_trainer(Trainer, seed=0)
    by_hand.train(DATA, num_epochs=1, per_device_batch_size=4)
    by_hand.save_training_state("checkpoints/by-hand/state", asynchronous=True)
    by_hand.wait_for_training_state()
    print("-- the shared folder --", flush=True)
    in_shared = new_trainer(Trainer, seed=0, callbacks=(SaveTrainingStateCallback(shared, save_at_end=True),))
    in_shared.train(DATA, num_epochs=1, per_device_batch_size=4)
    print("-- the shared folder: done --", flush=True)
    result["shared_files"] = files_in(shared)

    trained = new_trainer(PerNodeTrainer, seed=0, callbacks=(SaveMidEpoch(),))
    trained.train(DATA, num_epochs=2, per_device_batch_size=4)
    trained.save_checkpoint("checkpoints/per-node.pt", save_per_node=True)
    trained.save_checkpoint("checkpoints/main-only.pt", save_per_node=False)
    try:
        trained.save_training_state("checkpoints/state-async", asynchronous=True)
        result["asynchronous_save_error"] = ""
    except ValueError as error:
        result["asynchronous_save_error"] = str(error)
    resumed = new_trainer(PerNodeTrainer, seed=5)
    resumed.train(DATA, num_epochs=2, per_device_batch_size=4, resume_from=STATE)
    loaded = new_trainer(Trainer, seed=7)
    loaded.load_checkpoint("checkpoints/per-node.pt")
    result.update(
        resumed_equal=same_weights(resumed.get_model(), trained.get_model()),
        resumed_global_step=resumed.progress.global_step,
        loaded_equal=same_weights(loaded.get_model(), trained.get_model()),
    )
    return result


def relaunch() -> dict[str, Any]:
    start = StartStep()
    resumed = new_trainer(Trainer, seed=3, callbacks=saving_states(start))
    resumed.train(DATA, num_epochs=2, per_device_batch_size=4, resume_from="auto")
    oracle = new_trainer(Trainer, seed=0)  # the uninterrupted run
    oracle.train(DATA, num_epochs=2, per_device_batch_size=4)
    return {
        "resumed_at_step": start.step,
        "final_step": resumed.progress.global_step,
        "equal_to_uninterrupted": same_weights(resumed.get_model(), oracle.get_model()),
    }


def main() -> None:
    args = parse_args({"phase": "first", "shared": ""})
    result = first(Path(args.shared)) if args.phase == "first" else relaunch()
    result["files"] = files_in(Path("checkpoints"))
    write_result(args.out, result)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
