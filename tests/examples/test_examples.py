"""End-to-end runs of examples/train_digits.py: one process, and a real 2-process torchrun group
launched as the README says (every rank must exit 0).

Each run writes into a pytest temporary folder; the test reads the accuracy from the run's last
line (``FINAL test_accuracy=...``), then checks that the checkpoint loads safely into a fresh
model that really scores that accuracy, and that the plot (PlotRunCallback: losses, learning
rate and the metrics against update steps) and the step metrics' CSV file were written.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from types import ModuleType

import pytest
import torch
from PIL import Image

from tests import forked
from tests.helpers import REPO_ROOT, subprocess_env
from tests.launch import launcher

EXAMPLE = REPO_ROOT / "examples" / "train_digits.py"
TIMEOUT_S = 120
SEED = 42


def _run_example(nproc: int, tmp_path: Path, *, torchrun: bool = False) -> tuple[str, Path]:
    """Runs the example as ``python`` (forked, :mod:`tests.forked`) or, with ``torchrun``, as the README
    launches it on 2 processes (every rank must exit 0)."""
    out_dir = tmp_path / "outputs"
    args = [str(EXAMPLE), "--output-dir", str(out_dir), "--seed", str(SEED)]
    env = subprocess_env(tmp_path)
    if torchrun:
        command = [*launcher(nproc), *args]
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    else:
        result = forked.run(args[0], args[1:], nproc=nproc, cwd=tmp_path, env=env, timeout=TIMEOUT_S)
        command = result.args
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(command)} exited with {result.returncode}:\n{output}"
    return output, out_dir


def _final_accuracy(output: str) -> float:
    found = re.findall(r"^FINAL test_accuracy=([0-9.]+)$", output, flags=re.MULTILINE)
    assert len(found) == 1, (
        f"expected one FINAL line (printed by the main process only), got {found}:\n{output}"
    )
    return float(found[0])


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_digits", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _assert_outputs_hold_the_trained_model(out_dir: Path, accuracy: float, example: ModuleType) -> None:
    checkpoint = torch.load(out_dir / "digits_mlp.pt", weights_only=True)
    assert checkpoint["test_accuracy"] == pytest.approx(accuracy, abs=1e-4)
    assert isinstance(checkpoint["scaler_mean"], torch.Tensor) and checkpoint["scaler_mean"].shape == (64,)
    model = example.DigitsModel()
    model.load_state_dict(checkpoint["model_state_dict"])
    _, _, test_dataset, _ = example.load_digit_splits(SEED)
    inputs, targets = test_dataset.tensors
    with torch.no_grad():
        reloaded_accuracy = (model.eval()(inputs).argmax(dim=-1) == targets).float().mean().item()
    assert reloaded_accuracy == pytest.approx(accuracy, abs=1e-3)

    plot = out_dir / "training_curves.png"
    assert plot.is_file() and plot.stat().st_size > 1000
    assert plot.read_bytes().startswith(b"\x89PNG")
    with Image.open(plot) as image:
        panels = json.loads(image.text["Panels"])
    assert panels[:3] == ["loss", "learning rate", "accuracy"]
    assert {"precision", "recall", "samples_per_second"} <= set(panels)
    assert (out_dir / "runs" / "digits" / "metrics.csv").is_file()


def test_example_reaches_95_percent_on_one_process_and_saves_checkpoint_and_plot(tmp_path, example):
    output, out_dir = _run_example(1, tmp_path)

    assert "num_processes=1" in output
    accuracy = _final_accuracy(output)
    assert accuracy >= 0.95, output
    _assert_outputs_hold_the_trained_model(out_dir, accuracy, example)


@pytest.mark.distributed
def test_example_reaches_95_percent_on_two_torchrun_processes(tmp_path, example):
    output, out_dir = _run_example(2, tmp_path, torchrun=True)

    assert "num_processes=2" in output, output
    accuracy = _final_accuracy(output)
    assert accuracy >= 0.95, output
    _assert_outputs_hold_the_trained_model(out_dir, accuracy, example)
