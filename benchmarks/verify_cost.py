"""What checking every byte of a training state costs when it is loaded.

A stack of ``--layers`` ``Linear(2048, 2048)`` layers (24 by default: 100.7M parameters, a
403 MB ``model.pt`` and an 806 MB ``optimizer.pt`` after one Adam step) is saved once with
``save_training_state``. A copy of the state gets the manifest that versions without checksums
wrote (version 1: no CRC-32s), so the same files load unchecked. Then, ``--repeats`` times in
alternating order, a fresh Trainer's ``load_training_state`` loads each copy (the time to read,
check and load every file into the model and optimizer; the files stay in the page cache, as
when a run resumes right after it saved), and the median times are compared::

    VERIFY_COST_RATIO load_training_state checked/unchecked = X.XX

The checksum (zlib's CRC-32) is computed in a second thread while ``torch.load`` reads the same
file, so on a machine with a free core it costs little wall time. The CPU time of the load (every
thread) is compared too: with no free core, that is what the wall time grows by::

    VERIFY_CPU_RATIO load_training_state checked/unchecked = X.XX

Run from the repository root::

    .venv/bin/python benchmarks/verify_cost.py
    .venv/bin/python benchmarks/verify_cost.py --layers 24 --repeats 7 --json-out verify_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Measure the checkout this script lives in, whether or not the package is installed.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch  # noqa: E402
from torch import nn  # noqa: E402

from pytorch_accelerated import Trainer  # noqa: E402
from pytorch_accelerated.checkpoints.directories import MANIFEST  # noqa: E402
from pytorch_accelerated.checkpoints.torch_files import file_crc32  # noqa: E402

WIDTH = 2048


def make_trainer(layers: int) -> Trainer:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    return Trainer(model, nn.MSELoss(), torch.optim.Adam(model.parameters(), lr=1e-4), callbacks=())


def save_state(layers: int, folder: Path) -> tuple[Path, Path, int]:
    """The state saved with checksums, its copy with a version-1 manifest, and its number of bytes."""
    trainer = make_trainer(layers)
    model, optimizer = trainer.model, trainer.optimizer
    model(torch.randn(2, WIDTH)).square().mean().backward()
    optimizer.step()  # Adam's two moments: the optimizer state is twice the model's
    optimizer.zero_grad()
    checked = folder / "checked"
    trainer.save_training_state(checked)
    unchecked = Path(shutil.copytree(checked, folder / "unchecked"))
    manifest = json.loads((checked / MANIFEST).read_text())
    old = {key: value for key, value in manifest.items() if key not in ("crc32", "manifest_crc32")}
    (unchecked / MANIFEST).write_text(json.dumps({**old, "version": 1}, indent=2, sort_keys=True))
    size = sum(path.stat().st_size for path in checked.iterdir())
    return checked, unchecked, size


def time_load(state: Path, layers: int) -> tuple[float, float]:
    """Wall and CPU seconds (every thread of this process) of ``load_training_state(state)``."""
    trainer = make_trainer(layers)
    start, start_cpu = time.perf_counter(), time.process_time()
    trainer.load_training_state(state)
    return time.perf_counter() - start, time.process_time() - start_cpu


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--layers", type=int, default=24, help="Linear(2048, 2048) layers (24: 100.7M parameters)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="verify_cost_") as folder:
        checked, unchecked, size = save_state(args.layers, Path(folder))
        parameters = args.layers * (WIDTH * WIDTH + WIDTH)
        print(f"state: {parameters / 1e6:.1f}M parameters, {size / 1e6:.0f} MB in {checked}")
        start = time.process_time()
        for path in checked.iterdir():
            file_crc32(path)
        crc_cpu_s = time.process_time() - start
        time_load(checked, args.layers)  # warm-up: the page cache, the allocator
        times: dict[str, list[float]] = {"checked": [], "unchecked": []}
        cpu: dict[str, list[float]] = {"checked": [], "unchecked": []}
        for repeat in range(args.repeats):
            order = ["checked", "unchecked"] if repeat % 2 == 0 else ["unchecked", "checked"]
            for name in order:
                wall, cpu_s = time_load(checked if name == "checked" else unchecked, args.layers)
                times[name].append(wall)
                cpu[name].append(cpu_s)
        medians = {name: statistics.median(values) for name, values in times.items()}
        cpu_medians = {name: statistics.median(values) for name, values in cpu.items()}

    for name, values in times.items():
        print(
            f"load_training_state {name:9s} median {medians[name]:.3f} s  ({', '.join(f'{v:.3f}' for v in values)}); "
            f"CPU median {cpu_medians[name]:.3f} s"
        )
    print(f"CRC-32 of every file alone: {crc_cpu_s:.3f} s of CPU ({size / 1e9 / crc_cpu_s:.2f} GB/s)")
    ratio = medians["checked"] / medians["unchecked"]
    print(f"VERIFY_COST_RATIO load_training_state checked/unchecked = {ratio:.2f}")
    # With no free core the checksum's CPU time adds to the wall time: the worst case.
    cpu_ratio = cpu_medians["checked"] / cpu_medians["unchecked"]
    print(f"VERIFY_CPU_RATIO load_training_state checked/unchecked = {cpu_ratio:.2f}")
    if args.json_out is not None:
        result: dict[str, Any] = {
            "parameters": parameters,
            "bytes": size,
            "times_s": times,
            "medians_s": medians,
            "cpu_s": cpu,
            "cpu_ratio": cpu_ratio,
            "crc_cpu_s": crc_cpu_s,
            "ratio": ratio,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__},
        }
        args.json_out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
