"""Save a training state mid-epoch on some number of processes, or resume one on another.

The run: a small MLP, AdamW, per-device batch 2, no accumulation, 28 samples that return their
index, seed 7, 2 epochs. Each rank writes to ``rank{RANK}.json``:

``--phase save``: the state is saved into ``--state-dir`` after batch ``--save-at`` of the
first epoch, then the run stops. Recorded: the sample indices this rank trained on before the
save, the weights and optimizer state saved, this rank's share of the epoch's loss, and the
first number its torch RNG draws after the save.

``--phase resume``: ``train(resume_from=--state-dir)``. Recorded right after the state is
loaded (before training): weights, optimizer state, position, this rank's share of the loss;
the first number its torch RNG draws once the RNGs are restored; then, by epoch, the sample
indices it trained on, and the final position.
"""

from __future__ import annotations

from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, state_dict_to_lists, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import StopTrainingError, TrainerCallback

NUM_SAMPLES = 28
BATCH_SIZE = 2


def optimizer_lists(optimizer: Any) -> dict[str, Any]:
    state = optimizer.state_dict()["state"]
    return {
        f"{param}.{key}": value.double().flatten().tolist()
        for param, values in sorted(state.items())
        for key, value in sorted(values.items())
    }


def loss_share(trainer: Any) -> list[float]:
    loss = trainer.loop_state.train_loss
    return [float(loss.running_total), float(loss.count)]


class Record(TrainerCallback):
    """Records what each phase checks (see the module docstring)."""

    def __init__(self, phase: str, save_at: int, state_dir: str) -> None:
        self.phase, self.save_at, self.state_dir = phase, save_at, state_dir
        self.result: dict[str, Any] = {"seen": {}}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.phase == "resume":  # the state is loaded; RNGs and callbacks are restored after this event
            self.result["loaded"] = {
                "weights": state_dict_to_lists(trainer.get_model()),
                "optimizer": optimizer_lists(trainer.optimizer),
                "progress": trainer.progress.state_dict(),
                "loss_share": loss_share(trainer),
            }

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.phase == "resume" and "first_draw" not in self.result:
            self.result["first_draw"] = torch.rand(1).item()

    def on_train_step_end(self, trainer: Any, batch: Any, **kwargs: Any) -> None:
        epoch = str(trainer.progress.epoch)
        self.result["seen"].setdefault(epoch, []).extend(batch[2].tolist())
        if self.phase == "save" and trainer.progress.batch_index == self.save_at:
            trainer.save_training_state(self.state_dir)
            self.result["saved"] = {
                "weights": state_dict_to_lists(trainer.get_model()),
                "optimizer": optimizer_lists(trainer.optimizer),
                "progress": trainer.progress.state_dict(),
                "loss_share": loss_share(trainer),
            }
            self.result["first_draw"] = torch.rand(1).item()
            raise StopTrainingError("saved")


def main() -> None:
    args = parse_args({"phase": "save", "state-dir": "", "save-at": 3})
    model = make_mlp(seed=0)
    recorder = Record(args.phase, args.save_at, args.state_dir)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-2), callbacks=(recorder,)
    )
    trainer.train(
        RegressionDataset(NUM_SAMPLES, seed=1, with_index=True),
        num_epochs=2,
        per_device_batch_size=BATCH_SIZE,
        resume_from=args.state_dir if args.phase == "resume" else None,
        seed=7,
    )
    config = trainer.run_config
    write_result(
        args.out,
        {
            **recorder.result,
            "num_processes": config.num_processes,
            "final_progress": trainer.progress.state_dict(),
        },
    )


if __name__ == "__main__":
    main()
