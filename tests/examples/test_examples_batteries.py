"""End-to-end runs of the examples of the opt-in batteries, each in a process of its own on one CPU
(forked from the suite's one interpreter that has imported torch: :mod:`tests.forked`).

- ``finetune_timm_gradual_unfreezing.py``: ``ModelFreezer`` stages on a timm ResNet;
- ``train_cosine_ema.py``: ``CosineLrScheduler`` with warm-up and ``ModelEmaCallback``;
- ``early_stopping_save_best.py``: ``EarlyStoppingCallback`` with ``SaveBestModelCallback``.

Each test reads the machine-readable lines the script prints last, then checks the files it wrote
by loading them (``weights_only=True``) into a fresh model and scoring it. The accuracy floors
leave a wide margin below what the settings reach (noted beside each), so that other seeds and
builds of torch pass too.
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

EXAMPLES = REPO_ROOT / "examples"
TIMEOUT_S = 180


def _run(script: str, args: list[str], tmp_path: Path) -> str:
    result = forked.run(
        EXAMPLES / script, args, cwd=tmp_path, env=subprocess_env(tmp_path), timeout=TIMEOUT_S
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(result.args)} exited with {result.returncode}:\n{output}"
    return output


def _line(pattern: str, output: str) -> re.Match[str]:
    found = list(re.finditer(pattern, output, flags=re.MULTILINE))
    assert len(found) == 1, f"expected one line matching {pattern!r}, found {len(found)}:\n{output}"
    return found[0]


def _load_example(script: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(script).stem, EXAMPLES / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _accuracy(model: torch.nn.Module, dataset: torch.utils.data.TensorDataset) -> float:
    inputs, targets = dataset.tensors
    with torch.no_grad():
        return (model.eval()(inputs).argmax(dim=-1) == targets).float().mean().item()


def test_gradual_unfreezing_example_trains_three_growing_stages_in_one_history(tmp_path):
    output = _run(
        "finetune_timm_gradual_unfreezing.py", ["--epochs-per-stage", "1", "--train-samples", "600"], tmp_path
    )

    stages = re.findall(
        r"^STAGE=(\d) epochs_so_far=(\d+) trainable_params=(\d+) param_groups=(\d+) .*eval_accuracy=([0-9.]+)$",
        output,
        flags=re.MULTILINE,
    )
    assert [stage[0] for stage in stages] == ["1", "2", "3"], output
    # reset_run_history=False after stage 1: the epochs of all stages are in one history.
    assert [int(stage[1]) for stage in stages] == [1, 2, 3]
    trainable = [int(stage[2]) for stage in stages]
    assert trainable[0] < trainable[1] < trainable[2], trainable
    # Head; + layer4; + one group each for layer3, layer2, layer1 and conv1.
    assert [int(stage[3]) for stage in stages] == [1, 2, 6]
    # Measured 0.94 to 0.97 over five seeds.
    assert float(_line(r"^FINAL test_accuracy=([0-9.]+)$", output)[1]) >= 0.8, output


def test_cosine_ema_example_ends_on_lr_min_and_saves_ema_weights_that_score_as_printed(tmp_path):
    out_dir = tmp_path / "outputs"
    args = ["--epochs", "4", "--warmup-epochs", "1", "--lr-min", "0.002", "--output-dir", str(out_dir)]
    output = _run("train_cosine_ema.py", args, tmp_path)

    final_lr = _line(r"^FINAL_LR=(\S+) LR_MIN=(\S+) equal=(\w+)$", output)
    assert float(final_lr[1]) == float(final_lr[2]) == 0.002 and final_lr[3] == "True", final_lr[0]
    # LogMetricsCallback prints the EMA's loss after each of the 4 epochs.
    assert len(re.findall(r"ema_model_eval_loss_epoch: [0-9.]+", output)) == 4, output
    final = _line(r"^FINAL test_accuracy=([0-9.]+) ema_test_accuracy=([0-9.]+)$", output)
    # Measured 0.959 and 0.952.
    assert float(final[1]) >= 0.9 and float(final[2]) >= 0.9, final[0]

    checkpoint = torch.load(out_dir / "ema_model.pt", weights_only=True)
    assert 1 <= checkpoint["epoch"] <= 4 and checkpoint["ema_decay"] == pytest.approx(0.98)
    example = _load_example("train_cosine_ema.py")
    model = example.create_model()
    model.load_state_dict(checkpoint["model_state_dict"])
    _, _, test_dataset = example.load_digit_splits(42)
    assert _accuracy(model, test_dataset) == pytest.approx(float(final[2]), abs=1e-3)


def test_early_stopping_example_stops_before_max_epochs_and_ends_with_the_best_weights(tmp_path):
    out_dir = tmp_path / "outputs"
    output = _run("early_stopping_save_best.py", ["--epochs", "50", "--output-dir", str(out_dir)], tmp_path)

    stop = _line(r"^STOPPED_AT_EPOCH=(\d+) BEST_EPOCH=(\d+) MAX_EPOCHS=50$", output)
    stopped_at, best_epoch = int(stop[1]), int(stop[2])
    assert best_epoch <= stopped_at < 50, stop[0]  # measured: stopped at 7, best 5
    assert "Training stopped: early stopping" in output
    test_accuracy = float(_line(r"^FINAL test_accuracy=([0-9.]+)$", output)[1])
    assert test_accuracy >= 0.9, output  # measured 0.967

    # After the run the model scores the best epoch's validation loss again, not the last epoch's.
    after = _line(
        r"^validation loss of the model after the run: ([0-9.]+) \(best epoch \d+: ([0-9.]+);", output
    )
    assert after[1] == after[2], after[0]

    checkpoint = torch.load(out_dir / "best_model.pt", weights_only=True)
    assert checkpoint["epoch"] == best_epoch
    assert checkpoint["eval_loss_epoch"] == pytest.approx(float(after[2]), abs=1e-4)
    example = _load_example("early_stopping_save_best.py")
    model = example.create_model()
    model.load_state_dict(checkpoint["model_state_dict"])
    _, _, test_dataset = example.load_digit_splits(42)
    # The script's final model scored what the best checkpoint scores: the best weights were reloaded.
    assert _accuracy(model, test_dataset) == pytest.approx(test_accuracy, abs=1e-3)
