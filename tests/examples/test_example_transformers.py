"""``examples/train_transformers_classifier.py``: a config-built BERT classifier with its own loss,
dict batches and ``num_items_in_batch`` under gradient accumulation, on 1 process and on 2
(a gloo group forked as :mod:`tests.forked` launches one, marked ``distributed``), with tiny settings (a few seconds each).

The accuracy floors leave a wide margin below what the settings reach (noted beside each).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests import forked
from tests.helpers import REPO_ROOT, subprocess_env

SCRIPT = REPO_ROOT / "examples" / "train_transformers_classifier.py"
TINY = ["--train-samples", "512", "--eval-samples", "128", "--batch-size", "16", "--accumulation", "2"]


def _run(tmp_path: Path, nproc: int, epochs: int) -> re.Match[str]:
    args = [*TINY, "--epochs", str(epochs)]
    result = forked.run(SCRIPT, args, nproc=nproc, cwd=tmp_path, env=subprocess_env(tmp_path), timeout=120)
    command, output = result.args, result.stdout + result.stderr
    final = re.search(
        r"^FINAL processes=(\d+) eval_loss=([0-9.]+) eval_accuracy=([0-9.]+)$", output, re.MULTILINE
    )
    assert result.returncode == 0 and final is not None, (
        f"{' '.join(command)} exited with {result.returncode}:\n{output}"
    )
    losses = [float(v) for v in re.search(r"^TRAIN_LOSSES=(.*)$", output, re.MULTILINE).group(1).split()]
    assert len(losses) == epochs and losses[-1] < losses[0] / 2, losses
    return final


def _load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_transformers_classifier", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batch_loss_is_the_models_mean_over_labelled_reviews_and_counts_them():
    example = _load_example()
    reviews = example.generate_reviews(8, seed=3)
    reviews = [
        (text, example.IGNORE_INDEX if i in (1, 4, 5) else label) for i, (text, label) in enumerate(reviews)
    ]
    batch = example.collate_reviews([example.ReviewDataset(reviews)[i] for i in range(8)])
    torch.manual_seed(0)
    model = example.create_model(hidden_size=16, num_layers=1)
    trainer = example.TransformersTrainer(model, loss_func=None, optimizer=None)
    output = trainer.calculate_train_batch_loss(batch)

    assert int(output["num_items_in_batch"]) == 5 and output["batch_size"] == 8
    labelled = batch["labels"] != example.IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(output["model_outputs"][labelled], batch["labels"][labelled])
    assert torch.allclose(output["loss"], expected)
    assert batch["input_ids"].shape[1] == max(
        len(text.split()) + 1 for text, _ in reviews
    )  # padded to the longest


def test_transformers_example_learns_on_one_process(tmp_path):
    final = _run(tmp_path, nproc=1, epochs=4)
    assert final.group(1) == "1"
    assert float(final.group(3)) >= 0.8  # measured 0.98


@pytest.mark.distributed
def test_transformers_example_learns_on_two_processes(tmp_path):
    final = _run(tmp_path, nproc=2, epochs=6)
    assert final.group(1) == "2"
    assert float(final.group(3)) >= 0.7  # measured 0.88
