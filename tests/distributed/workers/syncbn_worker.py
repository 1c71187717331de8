"""ConvertSyncBatchNormCallback on a group of CPU processes (or one process).

Each rank writes which batch-norm layers its Trainer's model holds before and after accelerate
wraps it, the evaluation loss (evaluation works on CPU: it uses the running statistics) and
what happens when it tries to train (torch cannot synchronise batch norm on CPU tensors).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from common import NUM_FEATURES, NUM_OUTPUTS, RegressionDataset, parse_args, write_result
from torch import nn

NUM_EVAL_SAMPLES = 22  # uneven over 2 processes and batches of 4


def make_bn_model(seed: int = 0) -> nn.Module:
    """A small MLP with one BatchNorm1d layer, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, NUM_OUTPUTS))


def batch_norm_kinds(model: nn.Module) -> list[str]:
    return [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def main() -> None:
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks.sync_batchnorm import ConvertSyncBatchNormCallback

    args = parse_args()
    model = make_bn_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callback = ConvertSyncBatchNormCallback()
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(callback,))
    result: dict[str, Any] = {
        "num_processes": trainer._accelerator.num_processes,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "kinds_after_init": batch_norm_kinds(trainer.model),
        "model_is_the_given_one": trainer.model is model,
        "converted": callback.converted,
    }
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    result["optimizer_holds_every_parameter"] = all(id(p) in optimized for p in trainer.model.parameters())

    metrics = trainer.evaluate(RegressionDataset(NUM_EVAL_SAMPLES), per_device_batch_size=4)
    wrapped = trainer.model
    inner = getattr(wrapped, "module", wrapped)
    result.update(
        wrapper=type(wrapped).__name__,
        kinds_in_wrapped_model=batch_norm_kinds(inner),
        evaluation_loss=metrics["evaluation_loss"],
    )
    try:
        trainer.train(RegressionDataset(16), num_epochs=1, per_device_batch_size=4)
        result["train_error"] = None
    except RuntimeError as error:
        result["train_error"] = str(error)
    result["device"] = trainer.device.type
    write_result(args.out, result)


if __name__ == "__main__":
    main()
