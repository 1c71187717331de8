"""Rank 1 alone produces NaN training losses from a given optimizer update on, while both ranks
save training states every 2 updates and keep 2; one run per onset, in one launch.

Each rank writes, per onset, the step it stopped at; the states are left in
``OUT/states-<onset>`` for the test to read.
"""

from __future__ import annotations

from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, get_default_callbacks

ONSETS = tuple(
    range(1, 13)
)  # the update (counted from 1) whose loss is the first NaN: every update of the 12 of an epoch


class NaNOnRank1From(Trainer):
    def __init__(self, *args: Any, nan_from: int, **kwargs: Any) -> None:
        self.nan_from = nan_from
        super().__init__(*args, **kwargs)

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        if rank() == 1 and self.progress.global_step + 1 >= self.nan_from:
            output["loss"] = output["loss"] * float("nan")
        return output


def main() -> None:
    args = parse_args()
    result: dict[str, Any] = {}
    for onset in ONSETS:
        model = make_mlp(seed=0)
        saver = SaveTrainingStateCallback(
            args.out / f"states-{onset}", save_every_n_steps=2, max_checkpoints=2
        )
        trainer = NaNOnRank1From(
            model,
            nn.MSELoss(),
            torch.optim.SGD(model.parameters(), lr=0.01),
            callbacks=(*get_default_callbacks(progress_bar=False), saver),
            nan_from=onset,
        )
        trainer.train(RegressionDataset(48), num_epochs=2, per_device_batch_size=2)
        result[str(onset)] = {
            "global_step": trainer.progress.global_step,
            "num_processes": trainer.run_config.num_processes,
        }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
