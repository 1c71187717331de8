"""ConvertSyncBatchNormCallback on a group of CPU processes (or one process).

Each rank writes which batch-norm layers its Trainer's model holds before and after accelerate
wraps it, the evaluation loss of the untrained model, and where a short training run ended.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from accelerate import PartialState
from common import NUM_FEATURES, NUM_OUTPUTS, RegressionDataset, make_data, parse_args, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks.sync_batchnorm import ConvertSyncBatchNormCallback

NUM_EVAL_SAMPLES = 22  # uneven over 2 processes and batches of 4


def make_bn_model(seed: int = 0) -> nn.Module:
    """A small MLP with one BatchNorm1d layer, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, NUM_OUTPUTS))


def batch_norm_kinds(model: nn.Module) -> list[str]:
    return [type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def oracle_eval_loss() -> float:
    """Plain PyTorch: the same untrained model in eval mode over the whole evaluation set."""
    model = make_bn_model().eval()
    x, y = make_data(NUM_EVAL_SAMPLES)
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()


def main() -> None:
    args = parse_args()
    model = make_bn_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    callback = ConvertSyncBatchNormCallback()
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(callback,))
    result: dict[str, Any] = {
        "num_processes": PartialState().num_processes,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "kinds_after_init": batch_norm_kinds(trainer.model),
        "model_is_the_given_one": trainer.model is model,
        "converted": callback.converted,
    }

    metrics = trainer.evaluate(RegressionDataset(NUM_EVAL_SAMPLES), per_device_batch_size=4)
    wrapped = trainer.model
    inner = getattr(wrapped, "module", wrapped)
    result.update(
        wrapper=type(wrapped).__name__,
        kinds_in_wrapped_model=batch_norm_kinds(inner),
        evaluation_loss=metrics["evaluation_loss"],
        oracle_eval_loss=oracle_eval_loss(),
    )
    trainer.train(RegressionDataset(16), num_epochs=2, per_device_batch_size=4)
    result.update(device=trainer.device.type, global_step=trainer.progress.global_step)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
