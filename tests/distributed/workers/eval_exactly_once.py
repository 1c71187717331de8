"""Evaluate a fixed model on data sets that do not split evenly; record which samples each rank saw.

Each rank writes, per data set: the indices it evaluated (batch by batch), the indices gathered
from all ranks with ``gather_for_metrics``, and the ``evaluation_loss`` returned by
``evaluate()``. ``--grid`` adds ``[num_samples, batch_size]`` pairs, for which the gathered
predictions and which batches were padding are kept too. Then it checks ``trainer.gather`` on
tensors of a different length per rank.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback, get_default_callbacks


class RecordSampleIndices(TrainerCallback):
    """On every evaluation step, keep the indices this rank saw and those all ranks saw."""

    def __init__(self) -> None:
        self.local: list[list[int]] = []
        self.gathered: list[int] = []
        self.padding: list[bool] = []
        self.predictions: list[list[float]] = []

    def on_eval_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        self.local, self.gathered, self.padding, self.predictions = [], [], [], []

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        indices = batch[2]
        self.local.append(indices.tolist())
        self.padding.append(trainer.eval_batch_is_padding)
        self.gathered.extend(trainer.gather_for_metrics(indices).tolist())
        self.predictions.extend(trainer.gather_for_metrics(batch_output["model_outputs"]).tolist())

    def record(self) -> dict[str, Any]:
        return {"local_batches": self.local, "gathered": self.gathered}


def main() -> None:
    args = parse_args({"batch-size": 4, "sizes": "[]", "grid": "[]"})
    recorder = RecordSampleIndices()
    model = make_mlp(seed=0)
    # lr=0: the eval after a training epoch sees the same fixed model as evaluate() does.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = Trainer(
        model, nn.MSELoss(), optimizer, callbacks=(*get_default_callbacks(progress_bar=False), recorder)
    )
    result: dict[str, Any] = {}

    for num_samples in json.loads(args.sizes):
        dataset = RegressionDataset(num_samples, seed=2, with_index=True)
        metrics = trainer.evaluate(dataset, per_device_batch_size=args.batch_size)
        result[f"evaluate_{num_samples}"] = {
            **recorder.record(),
            "evaluation_loss": metrics["evaluation_loss"],
        }

    for num_samples, batch_size in json.loads(args.grid):
        dataset = RegressionDataset(num_samples, seed=2, with_index=True)
        metrics = trainer.evaluate(dataset, per_device_batch_size=batch_size)
        result[f"grid_{num_samples}_{batch_size}"] = {
            **recorder.record(),
            "padding": recorder.padding,
            "predictions": recorder.predictions,
            "evaluation_loss": metrics["evaluation_loss"],
        }

    # The evaluation run after a training epoch goes through the same loop.
    num_samples = json.loads(args.sizes)[0]
    eval_dataset = RegressionDataset(num_samples, seed=2, with_index=True)
    trainer.train(
        RegressionDataset(16), num_epochs=1, eval_dataset=eval_dataset, per_device_batch_size=args.batch_size
    )
    result["train_eval"] = {
        **recorder.record(),
        "eval_loss_epoch": trainer.run_history.get_latest_metric("eval_loss_epoch"),
        "num_processes": trainer.run_config.num_processes,
    }

    # A different number of rows on each rank: 3 on rank 0, 1 on rank 1.
    rows = 3 if rank() == 0 else 1
    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) + 100 * rank()
    result["gather"] = trainer.gather(tensor).tolist()
    result["gather_padded"] = trainer.gather(tensor, padding_value=-1).tolist()
    result["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    write_result(args.out, result)


if __name__ == "__main__":
    main()
