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


class MeanSquaredErrorMetric(TrainerCallback):
    """The original library's metric-callback pattern (docs/migration.md): a torchmetrics
    metric updated with gathered outputs, computed and printed on the world main process only."""

    def __init__(self) -> None:
        import torchmetrics

        # Updated with gathered rows, so torchmetrics must not sync them again in compute().
        self.metric = torchmetrics.MeanSquaredError(sync_on_compute=False)
        self.computed: list[float] = []
        self.is_world_process_zero: list[bool] = []

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        predictions = trainer.gather_for_metrics(batch_output["model_outputs"])
        targets = trainer.gather_for_metrics(batch[1])
        self.metric.update(predictions.cpu(), targets.cpu())

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.computed.append(self.metric.compute().item())
        self.is_world_process_zero.append(trainer.run_config.is_world_process_zero)
        if trainer.run_config.is_world_process_zero:
            print(f"mse: {self.computed[-1]}")
        self.metric.reset()


def main() -> None:
    args = parse_args({"batch-size": 4, "sizes": "[]", "grid": "[]"})
    recorder, mse = RecordSampleIndices(), MeanSquaredErrorMetric()
    model = make_mlp(seed=0)
    # lr=0: the eval after a training epoch sees the same fixed model as evaluate() does.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    trainer = Trainer(
        model, nn.MSELoss(), optimizer, callbacks=(*get_default_callbacks(progress_bar=False), recorder, mse)
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
    compat_rows = [[1, 2], [3, 4]] if rank() == 0 else [[5, 6]]  # docs/migration.md's gather example
    result["gather_compat"] = trainer.gather(torch.tensor(compat_rows), padding_value=-1).tolist()
    result["mse"] = {"computed": mse.computed, "is_world_process_zero": mse.is_world_process_zero}
    result.update(eval_batch_size_run(trainer))
    result["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    write_result(args.out, result)


def eval_batch_size_run(trainer: Trainer) -> dict[str, Any]:
    """The eval batch size example of docs/migration.md: an eval ``batch_size`` kwarg wins over 16."""
    sizes: list[int] = []

    class RecordEvalBatchSizes(TrainerCallback):
        def on_eval_step_end(self, trainer: Any, batch: Any, **kwargs: Any) -> None:
            sizes.append(len(batch[0]))

    trainer.callback_handler.add_callback(RecordEvalBatchSizes())
    trainer.train(
        RegressionDataset(16),
        num_epochs=1,
        eval_dataset=RegressionDataset(128, seed=3, with_index=True),
        per_device_batch_size=16,
        eval_dataloader_kwargs={"batch_size": 64},
    )
    config = trainer.run_config
    return {
        "eval_batch_sizes": sizes,
        "eval_per_device_batch_size": config.eval_per_device_batch_size,
        "eval_total_batch_size": config.eval_total_batch_size,
    }


if __name__ == "__main__":
    main()
