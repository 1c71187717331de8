"""``trainer.predict`` on data sets that do not split evenly over the processes.

Each rank writes the predictions it got for every case of :data:`CASES`: a model with nested
outputs on 13 samples in batches of 4, per-token outputs of sequences padded to the longest of
their batch (so their length differs between batches and processes), the same on 3 samples
in batches of 1 (the first process takes samples 0 and 2 in one batch), 1 sample (the second
process has only a padding batch of zero rows), and predictions after training. The factories only need torch and pytorch_accelerated, so the
test imports this file to make the same predictions in one process.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from pytorch_accelerated import Trainer

BATCH_SIZE = 4
PADDING_VALUE = -100


class NestedOutputs(nn.Module):
    """A small MLP returning ``{"logits": (B, 2), "extra": ((B,) int64 argmax, [(B, 1)])}``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        logits = self.net(x)
        return {"logits": logits, "extra": (logits.argmax(dim=1), [logits.sum(dim=1, keepdim=True)])}


class PerToken(nn.Module):
    """``2 * token + 1`` for each token of a padded batch, ``PADDING_VALUE`` for its padding (0).

    The 2 is a frozen parameter: a model with nothing to train, which DDP refuses to wrap, so
    the Trainer only places it on the device.
    """

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.where(tokens != 0, tokens * self.scale + 1, float(PADDING_VALUE))


class Sequences(Dataset):
    """Sample ``i`` is the tokens ``i + 1, ..., i + length(i)``, of length 1 to 5."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.arange(index + 1, index + 1 + sequence_length(index))


def sequence_length(index: int) -> int:
    return 1 + (index * 3) % 5


def pad_batch(sequences: list[torch.Tensor]) -> tuple[torch.Tensor]:
    """Pad with 0 to the longest sequence of the batch."""
    return (nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=0),)


def make_case(name: str) -> tuple[Trainer, Any, dict[str, Any]]:
    """The Trainer, data set and ``predict`` keywords of a case."""
    if name.startswith("ragged"):
        trainer = Trainer(PerToken(), loss_func=None, optimizer=None, callbacks=())
        kwargs = {
            "collate_fn": pad_batch,
            "padding_value": PADDING_VALUE,
            "per_device_batch_size": BATCH_SIZE,
        }
        if name == "ragged_padding":  # process 0 pads sample 0 (1 token) to sample 2's 2; 1 has 4
            return trainer, Sequences(3), {**kwargs, "per_device_batch_size": 1}
        return trainer, Sequences(13), kwargs
    num_samples = 1 if name == "one_sample" else 13
    x = torch.randn(num_samples, 5, generator=torch.Generator().manual_seed(1))
    trainer = Trainer(NestedOutputs(), loss_func=None, optimizer=None, callbacks=())
    return trainer, TensorDataset(x), {"per_device_batch_size": BATCH_SIZE}


CASES = ("nested", "ragged", "ragged_padding", "one_sample")


def to_lists(outputs: Any) -> Any:
    """``outputs`` with each tensor as nested lists (and tuples as lists), for JSON."""
    if isinstance(outputs, torch.Tensor):
        return outputs.tolist()
    if isinstance(outputs, dict):
        return {key: to_lists(value) for key, value in outputs.items()}
    return [to_lists(value) for value in outputs]


def main() -> None:
    import torch.distributed as dist
    from common import parse_args, write_result

    args = parse_args()
    result: dict[str, Any] = {}
    for name in CASES:
        trainer, dataset, kwargs = make_case(name)
        outputs = trainer.predict(dataset, **kwargs)
        result[name] = to_lists(outputs)
        result[f"{name}_on_cpu"] = all(t.device.type == "cpu" for t in _tensors(outputs))
    result["world_size"] = dist.get_world_size() if dist.is_initialized() else 1
    result["after_train"] = predict_after_training()
    write_result(args.out, result)


def predict_after_training() -> dict[str, Any]:
    """Train a linear model for an epoch (wrapped in DDP), then predict 13 samples with it; keep
    the predictions, the model's own outputs for them, and whether the run's eval set was kept."""
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    generator = torch.Generator().manual_seed(3)
    train_data = TensorDataset(
        torch.randn(16, 5, generator=generator), torch.randn(16, 2, generator=generator)
    )
    x = torch.randn(13, 5, generator=generator)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(train_data, num_epochs=1, eval_dataset=train_data, per_device_batch_size=4)
    predictions = trainer.predict(TensorDataset(x), per_device_batch_size=BATCH_SIZE)
    with torch.no_grad():
        by_hand = trainer.get_model()(x)
    return {
        "predictions": predictions.tolist(),
        "by_hand": by_hand.tolist(),
        "eval_dataset_kept": trainer.eval_dataset is train_data,
    }


def _tensors(outputs: Any) -> list[torch.Tensor]:
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    values = outputs.values() if isinstance(outputs, dict) else outputs
    return [tensor for value in values for tensor in _tensors(value)]


if __name__ == "__main__":
    main()
