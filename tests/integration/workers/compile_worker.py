"""Run by tests/integration/test_compile.py under ``accelerate launch --dynamo_backend eager
--dynamo_use_regional_compilation``: the Trainer's accelerator compiles the plain model by
regions in ``prepare``. Prints one JSON line: what was compiled, how many graphs each epoch
added, and the keys of the checkpoint it saved to ``argv[1]``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import counters

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.linear(x))


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.blocks, self.head = (
            nn.Linear(3, 8),
            nn.ModuleList(Block() for _ in range(3)),
            nn.Linear(8, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CountGraphs(TrainerCallback):
    def __init__(self) -> None:
        self.per_epoch: list[int] = []

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.per_epoch.append(counters["stats"]["unique_graphs"])


def main() -> None:
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(16, 3, generator=generator), torch.randn(16, 1, generator=generator)
    )
    model, counter = Blocks(), CountGraphs()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(counter,))
    trainer.train(data, num_epochs=3, eval_dataset=data, per_device_batch_size=4)
    trainer.save_checkpoint(sys.argv[1])
    prepared = trainer.model
    result = {
        "compiled_blocks": [type(block).__name__ for block in prepared.blocks],
        "graphs_after_each_epoch": counter.per_epoch,
        "checkpoint_keys": sorted(torch.load(sys.argv[1], weights_only=True)["model_state_dict"]),
        "plain_keys": sorted(model.state_dict()),
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
