"""Runs in a process of their own: importing the package in a fresh interpreter, a real
``accelerate launch --mixed_precision bf16`` (both started as new interpreters), and the CPU dry run
of the prepared GPU checks (forked: :mod:`tests.forked`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from tests import forked
from tests.helpers import REPO_ROOT, subprocess_env


def test_importing_the_package_does_not_touch_the_global_rng() -> None:
    code = (
        "import torch, random, numpy as np\n"
        "t, r, n = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()\n"
        "import pytorch_accelerated, pytorch_accelerated.callbacks, pytorch_accelerated.utils\n"
        "assert torch.equal(t, torch.get_rng_state()) and r == random.getstate()\n"
        "assert (n == np.random.get_state()[1]).all()\n"
        "print('untouched')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "untouched", result.stderr


def test_accelerate_launch_mixed_precision_bf16_reaches_the_trainer(tmp_path: Path) -> None:
    # The first way: `accelerate launch --mixed_precision bf16`, for real (it sets
    # ACCELERATE_MIXED_PRECISION for the script), with the Trainer's default _create_accelerator.
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from pytorch_accelerated import Trainer

        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        seen = set()
        model[0].register_forward_hook(lambda module, inputs, output: seen.add(output.dtype))
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=())
        trainer.train(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), num_epochs=1, per_device_batch_size=8)
        print("RESULT", trainer.run_config.mixed_precision, sorted(str(dtype) for dtype in seen))
        """
        )
    )
    launcher = Path(sys.executable).with_name("accelerate")
    command = [
        str(launcher),
        "launch",
        "--cpu",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--dynamo_backend",
        "no",
        "--mixed_precision",
        "bf16",
        str(script),
    ]
    result = subprocess.run(
        command, env=subprocess_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESULT bf16 ['torch.bfloat16']" in result.stdout, result.stdout + result.stderr


def test_the_prepared_gpu_check_of_skipped_updates_passes_as_a_cpu_dry_run(tmp_path: Path) -> None:
    # benchmarks/gpu_checks.py runs on a lent GPU; here its logic runs on the CPU, so it does not rot.
    args = ["--cpu-dry-run", "--only", "fp16_overflow_skip_advances_no_counter"]
    script = REPO_ROOT / "benchmarks" / "gpu_checks.py"
    result = forked.run(script, args, env=subprocess_env(tmp_path), cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "GPU_CHECKS passed=1 failed=0" in result.stdout, (
        result.stdout + result.stderr
    )
