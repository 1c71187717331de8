"""Worker: one node of a 2-machine run (``torchrun --nnodes 2 --node_rank R --nproc_per_node 1``)
in which the nodes share no file system: each node runs in its own working directory and saves
into its own ``checkpoints/`` folder there.

It tries a training state saved the default way (by the main process only, which cannot work
here), then trains 2 epochs saving a per-node training state mid-epoch 2 and two
``save_checkpoint`` files (``save_per_node`` True and False), tries an asynchronous per-node state
(refused), resumes a fresh Trainer from the
state in its own directory, and loads the per-node checkpoint into a fresh model. It reports the
files on its node and whether the resumed and loaded weights equal the trained ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from common import RegressionDataset, make_mlp, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback

DATA = RegressionDataset(32)  # 2 nodes x batches of 4: 4 updates per epoch
STATE = Path("checkpoints/state-mid-epoch-2")


class PerNodeTrainer(Trainer):
    """Saves training states on every node (docs/launching.md, "Several machines")."""

    def _create_accelerator(self) -> Accelerator:
        accelerator = super()._create_accelerator()
        accelerator.project_configuration.save_on_each_node = True
        return accelerator


class SaveMidEpoch(TrainerCallback):
    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == 6 and not STATE.exists():  # the 2nd update of epoch 2
            trainer.save_training_state(STATE)


def new_trainer(cls: type[Trainer], seed: int, callbacks: tuple[Any, ...] = ()) -> Trainer:
    model = make_mlp(seed)
    return cls(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), callbacks=callbacks
    )


def same_weights(a: nn.Module, b: nn.Module) -> bool:
    return all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )


def default_save_error() -> str:
    """The error of a training state saved by the main process only, on nodes that share nothing."""
    trainer = new_trainer(Trainer, seed=0)
    trainer.train(DATA, num_epochs=1, per_device_batch_size=4)
    try:
        trainer.save_training_state("checkpoints/state-main-only")
    except OSError as error:
        return str(error)
    return ""


def default_asynchronous_save_error() -> str:
    """The error of a state saved in the background by the main process only, on nodes that
    share nothing: it must fail at once, not wait for files that never arrive."""
    trainer = new_trainer(Trainer, seed=0)
    trainer.train(DATA, num_epochs=1, per_device_batch_size=4)
    try:
        trainer.save_training_state("checkpoints/state-main-only-async", asynchronous=True)
        trainer.wait_for_training_state()
    except OSError as error:
        return str(error)
    return ""


def asynchronous_save_error(trainer: Trainer) -> str:
    """The error of a state saved in the background on each node (refused: it needs a shared folder)."""
    try:
        trainer.save_training_state("checkpoints/state-async", asynchronous=True)
    except ValueError as error:
        return str(error)
    return ""


def main() -> None:
    args = parse_args()
    result: dict[str, Any] = {"default_save_error": default_save_error()}
    result["default_asynchronous_save_error"] = default_asynchronous_save_error()
    trained = new_trainer(PerNodeTrainer, seed=0, callbacks=(SaveMidEpoch(),))
    trained.train(DATA, num_epochs=2, per_device_batch_size=4)
    trained.save_checkpoint("checkpoints/per-node.pt", save_per_node=True)
    trained.save_checkpoint("checkpoints/main-only.pt", save_per_node=False)
    result["asynchronous_save_error"] = asynchronous_save_error(trained)
    resumed = new_trainer(PerNodeTrainer, seed=5)
    resumed.train(DATA, num_epochs=2, per_device_batch_size=4, resume_from=STATE)
    loaded = new_trainer(Trainer, seed=7)
    loaded.load_checkpoint("checkpoints/per-node.pt")
    result.update(
        node_rank=trained.accelerator.state.process_index,
        files=sorted(
            str(path.relative_to("checkpoints")) for path in Path("checkpoints").rglob("*") if path.is_file()
        ),
        resumed_equal=same_weights(resumed.get_model(), trained.get_model()),
        resumed_global_step=resumed.progress.global_step,
        loaded_equal=same_weights(loaded.get_model(), trained.get_model()),
    )
    write_result(args.out, result)


if __name__ == "__main__":
    main()
