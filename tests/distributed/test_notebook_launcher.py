"""``notebook_launcher(train_fn, num_processes=2)`` (accelerate's, re-exported by the package)
on a machine with no GPU: the function runs in 2 forked processes that form a CPU gloo group and
train as one (docs/launching.md). The script is what a notebook cell would hold.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import free_port, subprocess_env

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pytorch_accelerated import notebook_launcher

    def train_fn(out):
        import torch
        from torch import nn
        from torch.utils.data import TensorDataset
        from pytorch_accelerated import Trainer

        generator = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32, 3, generator=generator), torch.randn(32, 1, generator=generator))
        torch.manual_seed(0)
        model = nn.Linear(3, 1)
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
        trainer.train(data, num_epochs=2, per_device_batch_size=4)
        result = {"num_processes": trainer.accelerator.num_processes, "backend": trainer.accelerator.state.backend,
                  "global_step": trainer.progress.global_step, "weight": model.weight.tolist()}
        with open(f"{out}/rank{trainer.accelerator.process_index}.json", "w") as file:
            json.dump(result, file)

    notebook_launcher(train_fn, args=(sys.argv[1],), num_processes=2, master_addr="127.0.0.1", use_port=sys.argv[2])
    """
)


def test_notebook_launcher_trains_in_two_cpu_processes(tmp_path: Path) -> None:
    script = tmp_path / "notebook_cell.py"
    script.write_text(SCRIPT)
    command = [sys.executable, str(script), str(tmp_path), str(free_port())]
    done = subprocess.run(
        command, env=subprocess_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    results = [tmp_path / f"rank{rank}.json" for rank in (0, 1)]
    assert all(path.exists() for path in results), f"exit code {done.returncode}\n{done.stdout}{done.stderr}"
    first, second = (json.loads(path.read_text()) for path in results)
    assert (first["num_processes"], first["backend"]) == (2, "gloo")
    assert (
        first["global_step"] == 8
    )  # 32 samples / (2 processes x 4) per epoch, 2 epochs: one process would take 16
    assert first["weight"] == second["weight"]  # the processes trained one model
