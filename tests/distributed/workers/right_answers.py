"""Right answers on several processes, one launch for every case (each launch costs seconds).

- ``items_<kind>``: training where each batch's loss is the mean over its "tokens" and
  ``num_items_in_batch`` (as an ``int``, a 0-d or a 1-element tensor) differs between processes;
- ``stream`` / ``stream_max_steps``: the same training over an ``IterableDataset`` without
  ``__len__`` (until the stream ends; then with ``max_num_train_steps`` over two passes);
- ``eval_stream_<n>``: evaluating a stream of ``n`` samples, indices and predictions gathered;
- ``split_error`` / ``length_error`` / ``evaluate_error``: data sets that differ across processes.

Each rank writes what it saw; the test compares it with a plain-PyTorch oracle.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from common import RegressionDataset, make_data, make_mlp, parse_args, rank, state_dict_to_lists, write_result
from torch import nn
from torch.utils.data import IterableDataset, random_split

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback, get_default_callbacks

LR = 0.5


class TokenTrainer(Trainer):
    """Sample ``i`` holds ``1 + i % 4`` tokens; a batch's loss is the mean over its tokens of
    the per-sample MSE, and ``num_items_in_batch`` its token count, as ``kind`` says."""

    kind = "int"

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        x, y, index = batch
        counts = (1 + index % 4).float()
        per_sample = ((self.model(x) - y) ** 2).mean(dim=1)
        items = counts.sum()
        count: Any = {"int": int(items.item()), "0d": items, "1element": items.reshape(1)}[self.kind]
        return {
            "loss": (per_sample * counts).sum() / items,
            "model_outputs": None,
            "batch_size": len(x),
            "num_items_in_batch": count,
        }


class IndexStream(IterableDataset):
    """``RegressionDataset(n, seed, with_index=True)`` as a stream without ``__len__``."""

    def __init__(self, num_samples: int, seed: int = 1) -> None:
        self.x, self.y = make_data(num_samples, seed)

    def __iter__(self) -> Any:
        for index in range(len(self.x)):
            yield self.x[index], self.y[index], index


class Gathered(TrainerCallback):
    """Every evaluation step: the indices and predictions gathered from all ranks."""

    def on_eval_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        self.indices: list[int] = []
        self.predictions: list[list[float]] = []

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        self.indices += trainer.gather_for_metrics(batch[2]).tolist()
        self.predictions += trainer.gather_for_metrics(batch_output["model_outputs"]).tolist()


def train_tokens(kind: str, dataset: Any, accumulation: int, **train_kwargs: Any) -> dict[str, Any]:
    model = make_mlp(seed=0)
    trainer = TokenTrainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=LR), callbacks=())
    trainer.kind = kind
    trainer.train(
        dataset,
        per_device_batch_size=2,
        gradient_accumulation_steps=accumulation,
        train_dataloader_kwargs={"shuffle": False},
        **{"num_epochs": 1, **train_kwargs},
    )
    return {
        "weights": state_dict_to_lists(trainer.get_model()),
        "global_step": trainer.progress.global_step,
        "epochs": len(trainer.run_history.get_metric_values("train_loss_epoch")),
        "steps_per_epoch": trainer.run_config.num_update_steps_per_epoch,
    }


def error_of(call: Any) -> str | None:
    try:
        call()
    except ValueError as error:
        return str(error)
    return None


def main() -> None:
    args = parse_args()
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    # Every update covers 8 samples in order, whatever the number of processes.
    accumulation = 4 // processes
    result: dict[str, Any] = {}
    for kind in ("int", "0d", "1element"):
        result[f"items_{kind}"] = train_tokens(kind, RegressionDataset(20, with_index=True), accumulation)
    result["stream"] = train_tokens("int", IndexStream(20), accumulation)
    result["stream_max_steps"] = train_tokens("int", IndexStream(20), accumulation, max_num_train_steps=5)

    gathered = Gathered()
    model = make_mlp(seed=0)
    trainer = Trainer(
        model, nn.MSELoss(), None, callbacks=(*get_default_callbacks(progress_bar=True), gathered)
    )
    for num_samples in (1, 3, 33):
        loss = trainer.evaluate(IndexStream(num_samples, seed=2), per_device_batch_size=4)["evaluation_loss"]
        result[f"eval_stream_{num_samples}"] = {
            "loss": loss,
            "indices": gathered.indices,
            "predictions": gathered.predictions,
        }

    # An unseeded split draws differently on each process (here: a different seed per rank).
    torch.manual_seed(1000 + rank())
    train_part, eval_part = random_split(RegressionDataset(40), [30, 10])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    result["split_error"] = error_of(lambda: trainer.train(train_part, num_epochs=1, eval_dataset=eval_part))
    different = RegressionDataset(16 + rank())
    result["length_error"] = error_of(lambda: trainer.train(different, num_epochs=1))
    result["evaluate_error"] = error_of(lambda: trainer.evaluate(different))
    seeded = random_split(RegressionDataset(40), [30, 10], generator=torch.Generator().manual_seed(0))
    result["seeded_split_error"] = error_of(
        lambda: trainer.train(seeded[0], num_epochs=1, eval_dataset=seeded[1])
    )
    result["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    write_result(args.out, result)


if __name__ == "__main__":
    main()
