"""The epoch's training loss over a stream, on 1 or more processes: each case trains one epoch
with a learning rate of 0, so ``train_loss_epoch`` is a plain mean of per-sample losses of the
initial model, and the test can tell which samples it counted.

Cases: a stream of 12 samples (fills every round of 2 processes x batch 2), a stream of 13 (the
last round is completed by accelerate with the stream's first sample), the same with
``drop_last=True``, a map-style set of 13.
"""

from __future__ import annotations

from typing import Any

import torch
from common import NUM_FEATURES, RegressionDataset, make_mlp, parse_args, write_result
from torch import nn
from torch.utils.data import IterableDataset

from pytorch_accelerated import Trainer


class Stream(IterableDataset):
    def __init__(self, num_samples: int) -> None:
        self.data = RegressionDataset(num_samples)

    def __iter__(self) -> Any:
        for index in range(len(self.data)):
            yield self.data[index]


def main() -> None:
    args = parse_args()
    result: dict[str, Any] = {}
    cases = (
        ("stream12", Stream(12), {}),
        ("stream13", Stream(13), {}),
        ("stream13_drop_last", Stream(13), {"drop_last": True}),
        ("map13", RegressionDataset(13), {}),
    )
    for name, dataset, kwargs in cases:
        model = make_mlp()
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.0), callbacks=())
        trainer.train(dataset, num_epochs=1, per_device_batch_size=2, train_dataloader_kwargs=kwargs)
        result[name] = trainer.run_history.get_latest_metric("train_loss_epoch")
    for size in (12, 13):
        data = RegressionDataset(size)
        assert data.x.shape[1] == NUM_FEATURES
        with torch.no_grad():
            losses = nn.MSELoss(reduction="none")(make_mlp()(data.x), data.y).mean(dim=1)
        result[f"per_sample{size}"] = losses.double().tolist()
    result["num_processes"] = trainer.run_config.num_processes
    write_result(args.out, result)


if __name__ == "__main__":
    main()
