"""A small training run with the default callbacks; tests/integration/test_progress.py reads what it prints.

Not a test module (pytest does not collect it); the tests start it with its standard output a
pipe or a pseudo-terminal, as one process or with ``torchrun`` as two::

    python tests/integration/workers/progress_worker.py [--samples 44] [--epochs 2]

The run: a linear model, SGD with lr 0.01, batches of 4 (44 samples: 11 batches per epoch on
one process, 88 on two), an evaluation set, the default callbacks plus one that records a
tensor metric ``accuracy`` (``torch.tensor(0.198)``) after each training epoch and prints
``a line from a callback`` with ``trainer.print`` from ``on_train_step_end`` at update step 3.
Each process prints ``FINISHED rank R`` to stderr (with the built-in ``print``) when its run is
over.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback, get_default_callbacks

CALLBACK_LINE = "a line from a callback"


class PrintAndRecord(TrainerCallback):
    def on_train_step_end(self, trainer: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if is_update_step and trainer.progress.global_step == 3:
            trainer.print(CALLBACK_LINE)

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("accuracy", torch.tensor(0.198))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=44)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.samples, 3)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(*get_default_callbacks(), PrintAndRecord()))
    trainer.train(
        data, num_epochs=args.epochs, per_device_batch_size=4, eval_dataset=TensorDataset(x[:8], x[:8, :1])
    )
    print(f"FINISHED rank {os.environ.get('RANK', '0')}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
