"""Train the same MLP in several configurations; each rank writes its final weights and counters.

Run with torchrun (2 processes, per-device batch B) and with plain python (1 process, batch 2B):
the tests compare the two, and both against a plain-PyTorch loop.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from common import RegressionDataset, make_mlp, parse_args, state_dict_to_lists, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import get_default_callbacks


def main() -> None:
    args = parse_args({"batch-size": 4, "configs": "[]", "num-samples": 64, "lr": 0.05, "momentum": 0.9})
    dataset = RegressionDataset(args.num_samples)
    runs = {}
    for config in json.loads(args.configs):
        model = make_mlp(seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
        trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=get_default_callbacks(progress_bar=False))
        trainer.train(
            dataset,
            num_epochs=config["num_epochs"],
            per_device_batch_size=args.batch_size,
            gradient_accumulation_steps=config["gradient_accumulation_steps"],
            max_num_train_steps=config["max_num_train_steps"],
            seed=42,
        )
        run_config = trainer.run_config
        runs[config["name"]] = {
            "num_processes": run_config.num_processes,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "num_update_steps_per_epoch": run_config.num_update_steps_per_epoch,
            "num_epochs": run_config.num_epochs,
            "global_step": trainer.progress.global_step,
            "train_loss_epoch": trainer.run_history.get_metric_values("train_loss_epoch"),
            "weights": state_dict_to_lists(trainer.get_model()),
        }
    write_result(args.out, runs)


if __name__ == "__main__":
    main()
