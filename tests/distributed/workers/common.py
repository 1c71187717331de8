"""What the worker scripts share: argument parsing, result files, and deterministic models and data.

Only plain torch here (no accelerate, no pytorch_accelerated), so the tests can import it to
build plain-PyTorch oracles from the very same model and data.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

NUM_FEATURES = 5
NUM_OUTPUTS = 2


def parse_args(extra: dict[str, Any] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    for name, default in (extra or {}).items():
        parser.add_argument(f"--{name}", type=type(default), default=default)
    return parser.parse_args()


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_result(out_dir: Path, result: dict[str, Any]) -> None:
    """Write this rank's ``rank{RANK}.json`` (to a temporary name first, so a crash leaves none)."""
    path = out_dir / f"rank{rank()}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)


def make_mlp(seed: int = 0) -> nn.Module:
    """A small MLP with no dropout, its weights fixed by ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 8), nn.Tanh(), nn.Linear(8, NUM_OUTPUTS))


def make_data(num_samples: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, NUM_FEATURES, generator=generator)
    y = torch.randn(num_samples, NUM_OUTPUTS, generator=generator)
    return x, y


def linear_targets_dataset(num_samples: int, seed: int = 1) -> TensorDataset:
    """``(x, x @ W)`` for a fixed ``W``: data a linear model can fit, so that its loss falls."""
    x, _ = make_data(num_samples, seed)
    weight = torch.linspace(-1.0, 1.0, NUM_FEATURES * NUM_OUTPUTS).reshape(NUM_FEATURES, NUM_OUTPUTS)
    return TensorDataset(x, x @ weight)


class RegressionDataset(Dataset):
    """``(x, y)`` pairs, or ``(x, y, index)`` with ``with_index``, so a batch shows its samples."""

    def __init__(self, num_samples: int, seed: int = 1, with_index: bool = False) -> None:
        self.x, self.y = make_data(num_samples, seed)
        self.with_index = with_index

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        if self.with_index:
            return self.x[index], self.y[index], index
        return self.x[index], self.y[index]


def state_dict_to_lists(model: nn.Module) -> dict[str, Any]:
    return {name: value.detach().cpu().double().tolist() for name, value in model.state_dict().items()}
