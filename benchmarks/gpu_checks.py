"""Checks that need a GPU, prepared on a CPU-only machine, to run when a GPU machine is lent.

Each check is a function registered in ``CHECKS`` (decorate it with ``@gpu_check``): it runs a
small real training, raises ``AssertionError`` with the numbers when the claim does not hold and
returns the numbers it measured. Without a CUDA device every check is reported as skipped
(exit status 0), so the script is safe to run anywhere. Run from the repository root::

    .venv/bin/python benchmarks/gpu_checks.py                      # every check
    .venv/bin/python benchmarks/gpu_checks.py --only fp16_overflow_skip_advances_no_counter
    .venv/bin/python benchmarks/gpu_checks.py --json-out gpu_checks.json
    .venv/bin/python benchmarks/gpu_checks.py --cpu-dry-run        # the checks' logic, on the CPU

``--cpu-dry-run`` runs the checks on the CPU with fp16 autocast and a CPU gradient scaler set on
the Accelerator by hand (accelerate declines fp16 on a CPU): it proves the script, not the GPU.
The last line is ``GPU_CHECKS passed=N failed=N skipped=N``.

Checks (what docs/recipes/precision.md says was proven on a GPU comes from here):

- ``fp16_matches_fp32_with_accumulation_and_clipping``: fp16 (autocast + GradScaler) with
  gradient accumulation 2 and ``max_grad_norm``: every epoch's losses within 5 % of fp32's.
- ``fp16_overflow_skip_advances_no_counter``: a scaler starting at 2**20 overflows and skips the
  first updates: ``global_step``, ``epoch_step`` and the scheduler count only applied updates,
  and no update step is announced twice.
- ``async_state_equals_sync_and_blocks_at_most_a_fifth``: a 100M-parameter model with AdamW on
  the GPU: a training state saved with ``asynchronous=True`` equals the synchronous one file by
  file, and blocks the loop at most 0.2x as long (docs/checkpoints.md, "Asynchronous training states").
- ``compiled_models_train_like_eager_without_recompiling``: a 6-block model compiled whole and by
  regions (inductor): no compilation after the first epoch, evaluation losses within 5 % of
  eager's, and the epoch times (docs/recipes/compile.md).
- ``fsdp2_on_a_gpu_trains_like_without_it_and_saves_full_states``: FSDP2 enabled by accelerate on
  the GPU (one process launched as by torchrun): sharded parameters, losses within 1e-4 of the
  run without FSDP, and a save_checkpoint file that loads into a plain model (docs/recipes/fsdp.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState  # noqa: E402
from accelerate.utils import FullyShardedDataParallelPlugin, GradScalerKwargs  # noqa: E402

from pytorch_accelerated import Trainer  # noqa: E402
from pytorch_accelerated.callbacks import TrainerCallback  # noqa: E402

CHECKS: dict[str, Callable[[], dict[str, Any]]] = {}
CPU_DRY_RUN = False  # set by --cpu-dry-run


def gpu_check(function: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CHECKS[function.__name__] = function
    return function


# ---------------------------------------------------------------- precision (issue 11, part 1)


def _accelerator(mixed_precision: str, init_scale: float = 2.0**16) -> Accelerator:
    """A fresh Accelerator with this precision (accelerate keeps the first one's otherwise)."""
    AcceleratorState._reset_state()
    if mixed_precision != "fp16" or not CPU_DRY_RUN:
        return Accelerator(
            mixed_precision=mixed_precision, kwargs_handlers=[GradScalerKwargs(init_scale=init_scale)]
        )
    accelerator = Accelerator(mixed_precision="fp16")
    accelerator.scaler, accelerator.native_amp = torch.amp.GradScaler("cpu", init_scale=init_scale), True
    return accelerator


class _PrecisionTrainer(Trainer):
    """Sets the precision in code (``_create_accelerator``) and counts the updates the scaler skipped."""

    mixed_precision, init_scale = "no", 2.0**16

    def _create_accelerator(self) -> Accelerator:
        self.skipped_updates = 0
        return _accelerator(self.mixed_precision, self.init_scale)

    def optimizer_step(self) -> None:
        super().optimizer_step()
        self.skipped_updates += int(self.accelerator.optimizer_step_was_skipped)


def _trainer(mixed_precision: str, callbacks: Any = (), init_scale: float = 2.0**16) -> _PrecisionTrainer:
    settings = {"mixed_precision": mixed_precision, "init_scale": init_scale}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return type("PrecisionTrainer", (_PrecisionTrainer,), settings)(
        model, nn.MSELoss(), optimizer, callbacks=callbacks
    )


def _data(num_samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(num_samples, 32, generator=generator)
    return TensorDataset(features, torch.sin(features[:, :4]).sum(dim=1, keepdim=True))


class _UpdateRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.announced: list[tuple[int, int]] = []  # (global_step, epoch_step) at each announced update

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:
            self.announced.append((trainer.progress.global_step, trainer.progress.epoch_step))


@gpu_check
def fp16_matches_fp32_with_accumulation_and_clipping() -> dict[str, Any]:
    losses: dict[str, list[float]] = {}
    for precision in ("no", "fp16"):
        trainer = _trainer(precision)
        trainer.train(
            _data(2048, 0),
            num_epochs=3,
            eval_dataset=_data(512, 1),
            per_device_batch_size=64,
            gradient_accumulation_steps=2,
            max_grad_norm=1.0,
        )
        history = trainer.run_history
        losses[precision] = history.get_metric_values("train_loss_epoch") + history.get_metric_values(
            "eval_loss_epoch"
        )
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses["fp16"], losses["no"], strict=True))
    assert worst <= 0.05, (
        f"fp16 losses {losses['fp16']} differ from fp32's {losses['no']} by up to {worst:.1%}"
    )
    assert losses["fp16"][2] < losses["fp16"][0], f"fp16 did not train: {losses['fp16']}"
    return {"losses": losses, "worst_relative_difference": worst}


@gpu_check
def fp16_overflow_skip_advances_no_counter() -> dict[str, Any]:
    recorder = _UpdateRecorder()
    trainer = _trainer("fp16", callbacks=[recorder], init_scale=2.0**20)
    trainer.train(
        _data(512, 0),
        num_epochs=1,
        per_device_batch_size=16,
        gradient_accumulation_steps=2,
        max_grad_norm=1.0,
        create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
    )
    skipped = trainer.skipped_updates
    windows = math.ceil(512 / 16 / 2)
    progress, scheduler = trainer.progress, trainer.scheduler
    numbers = {
        "windows": windows,
        "skipped": skipped,
        "global_step": progress.global_step,
        "scheduler_steps": scheduler.last_epoch,
        "final_scale": trainer.accelerator.scaler.get_scale(),
    }
    assert 1 <= skipped < windows, f"the scaler skipped no update, or every one: {numbers}"
    assert progress.global_step == windows - skipped == scheduler.last_epoch, (
        f"a skipped update was counted: {numbers}"
    )
    expected = [(step, step) for step in range(1, progress.global_step + 1)]  # each once, epoch_step alike
    assert recorder.announced == expected, f"update steps announced: {recorder.announced}"
    return numbers


# ---------------------------------------------------------------- asynchronous training states (issue 11, part 4)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


@gpu_check
def async_state_equals_sync_and_blocks_at_most_a_fifth() -> dict[str, Any]:
    """A 100M-parameter model with AdamW on the GPU: the state saved with ``asynchronous=True``
    equals the synchronous one file by file, and blocks the loop at most 0.2x as long."""
    import tempfile

    from pytorch_accelerated.checkpoints.torch_files import safe_torch_load

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(4096, 4096) for _ in range(6)))
    trainer = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-5), callbacks=())
    trainer.train(
        TensorDataset(torch.randn(16, 4096), torch.randn(16, 4096)), num_epochs=1, per_device_batch_size=4
    )
    blocked: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("sync", "async"):
            start = time.perf_counter()
            trainer.save_training_state(f"{folder}/{mode}", asynchronous=mode == "async")
            blocked[mode] = time.perf_counter() - start
        trainer.wait_for_training_state()
        names = sorted(path.name for path in Path(folder, "sync").iterdir() if path.suffix == ".pt")
        different = [
            name
            for name in names
            if not _same(
                safe_torch_load(Path(folder, "sync", name)), safe_torch_load(Path(folder, "async", name))
            )
        ]
    ratio = blocked["async"] / blocked["sync"]
    numbers = {"blocked_s": blocked, "ratio": ratio, "files": names}
    assert not different, f"the asynchronous state differs from the synchronous one in {different}: {numbers}"
    assert ratio <= 0.2, (
        f"an asynchronous save blocked the loop {ratio:.2f}x as long as a synchronous one: {numbers}"
    )
    return numbers


# ---------------------------------------------------------------- torch.compile (issue 11, part 6)


class _Blocks(nn.Module):
    """Repeated blocks (what regional compilation compiles once) between two layers."""

    def __init__(self, width: int = 1024, depth: int = 6) -> None:
        super().__init__()
        self.embed, self.head = nn.Linear(64, width), nn.Linear(width, 1)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _compiled_run(how: str) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    from pytorch_accelerated.utils import compile_regions

    torch._dynamo.reset()
    torch.manual_seed(0)
    plain = _Blocks(width=64, depth=3) if CPU_DRY_RUN else _Blocks()
    model = {"eager": plain, "whole": torch.compile(plain), "regions": compile_regions(plain)}[how]
    trainer = Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-4), callbacks=())
    num_samples = 256 if CPU_DRY_RUN else 2048
    data = TensorDataset(torch.randn(num_samples, 64), torch.randn(num_samples, 1))
    start = time.perf_counter()
    trainer.train(data, num_epochs=1, eval_dataset=data, per_device_batch_size=256)
    first_epoch_s, graphs = time.perf_counter() - start, counters["stats"]["unique_graphs"]
    start = time.perf_counter()
    trainer.train(data, num_epochs=2, eval_dataset=data, per_device_batch_size=256)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return {
        "first_epoch_s": round(first_epoch_s, 3),
        "later_epoch_s": round((time.perf_counter() - start) / 2, 3),
        "graphs_after_epoch_1": graphs,
        "graphs_added_later": counters["stats"]["unique_graphs"] - graphs,
        "eval_loss": trainer.run_history.get_latest_metric("eval_loss_epoch"),
    }


@gpu_check
def compiled_models_train_like_eager_without_recompiling() -> dict[str, Any]:
    """A 6-block model on the GPU, eager, compiled whole and by regions (inductor): no graph is
    compiled after the first epoch (training and evaluation switch each epoch), and the final
    evaluation losses are within 5 % of eager's. Reports the time of the first and later epochs."""
    runs = {how: _compiled_run(how) for how in ("eager", "whole", "regions")}
    for how in ("whole", "regions"):
        assert runs[how]["graphs_added_later"] == 0, f"{how}: recompiled after the first epoch: {runs}"
        assert math.isclose(runs[how]["eval_loss"], runs["eager"]["eval_loss"], rel_tol=0.05), (
            f"{how}: loss differs: {runs}"
        )
    return runs


# ---------------------------------------------------------------- FSDP2 (issue 11, part 2)


def _fsdp_trainer(fsdp: bool) -> Trainer:
    """The precision checks' model and AdamW, under FSDP2 (enabled by accelerate itself) or not."""

    class FSDPTrainer(Trainer):
        def _create_accelerator(self) -> Accelerator:
            AcceleratorState._reset_state(reset_partial_state=True)
            plugin = (
                FullyShardedDataParallelPlugin(fsdp_version=2, cpu_ram_efficient_loading=False)
                if fsdp
                else None
            )
            return Accelerator(fsdp_plugin=plugin)

    model = _fsdp_model()
    return FSDPTrainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-3), callbacks=())


def _fsdp_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1))


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _fsdp_run(fsdp: bool, save_path: Path) -> dict[str, Any]:
    trainer = _fsdp_trainer(fsdp)
    trainer.train(
        _data(2048, 0), num_epochs=2, eval_dataset=_data(512, 1), per_device_batch_size=64,
        gradient_accumulation_steps=2, max_grad_norm=1.0,
    )  # fmt: skip
    trainer.save_checkpoint(save_path)
    history = trainer.run_history
    engine = str(trainer.accelerator.distributed_type)
    sharded = [type(p.data).__name__ for group in trainer.optimizer.param_groups for p in group["params"]]  # type: ignore[union-attr]
    return {
        "engine": engine,
        "sharded": sharded,
        "losses": history.get_metric_values("train_loss_epoch")
        + history.get_metric_values("eval_loss_epoch"),
    }


@gpu_check
def fsdp2_on_a_gpu_trains_like_without_it_and_saves_full_states() -> dict[str, Any]:
    """One process launched as ``torchrun --nproc_per_node 1`` would (so accelerate enables FSDP
    on the GPU itself): FSDP2 shards the parameters (DTensors), its losses (accumulation 2,
    max_grad_norm) are within 1e-4 of the same run without FSDP, and save_checkpoint's file
    loads into a plain model and AdamW with the same weights. Not run by --cpu-dry-run:
    accelerate enables FSDP only on GPUs (tests/distributed/test_fsdp_training.py runs FSDP2 on CPUs)."""
    if CPU_DRY_RUN:
        return {"note": "not run on the CPU: accelerate enables FSDP only on GPUs"}
    folder = Path(tempfile.mkdtemp())
    plain = _fsdp_run(False, folder / "plain.pt")
    launched = {
        "LOCAL_RANK": "0",
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": _free_port(),
    }
    os.environ.update(launched)
    try:
        sharded = _fsdp_run(True, folder / "fsdp.pt")
    finally:
        for name in launched:
            del os.environ[name]
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
    assert sharded["engine"].endswith("FSDP") and set(sharded["sharded"]) == {"DTensor"}, sharded
    worst = max(abs(a - b) for a, b in zip(sharded["losses"], plain["losses"], strict=True))
    assert worst <= 1e-4, f"FSDP2 losses {sharded['losses']} differ from {plain['losses']} by up to {worst}"
    files = {name: torch.load(folder / f"{name}.pt", weights_only=True) for name in ("plain", "fsdp")}
    for name in ("plain", "fsdp"):  # each loads into a plain model and optimizer
        model = _fsdp_model()
        model.load_state_dict(files[name]["model_state_dict"])
        torch.optim.AdamW(model.parameters()).load_state_dict(files[name]["optimizer_state_dict"])
    for key, value in files["plain"]["model_state_dict"].items():
        torch.testing.assert_close(
            files["fsdp"]["model_state_dict"][key].cpu(), value.cpu(), rtol=1e-4, atol=1e-4
        )
    return {"plain": plain, "fsdp2": sharded, "worst_loss_difference": worst}


# ---------------------------------------------------------------- running them


def run_checks(names: list[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        if not torch.cuda.is_available() and not CPU_DRY_RUN:
            results[name] = {"status": "skipped", "reason": "no CUDA device"}
        else:
            start = time.perf_counter()
            try:
                results[name] = {"status": "passed", **CHECKS[name]()}
            except Exception as error:  # noqa: BLE001 - reported, and the exit status says so
                results[name] = {
                    "status": "failed",
                    "error": f"{type(error).__name__}: {error}",
                    "trace": traceback.format_exc(),
                }
            results[name]["seconds"] = round(time.perf_counter() - start, 2)
        print(f"{name}: {json.dumps(results[name], default=str)}", flush=True)
    return results


def main() -> int:
    global CPU_DRY_RUN
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), default=sorted(CHECKS))
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--cpu-dry-run", action="store_true", help="run the checks' logic on the CPU")
    args = parser.parse_args()
    CPU_DRY_RUN = args.cpu_dry_run
    results = run_checks(args.only)
    if args.json_out:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        args.json_out.write_text(
            json.dumps(
                {"device": device, "torch": torch.__version__, "results": results}, indent=2, default=str
            )
        )
    counts = {
        status: sum(r["status"] == status for r in results.values())
        for status in ("passed", "failed", "skipped")
    }
    print(f"GPU_CHECKS passed={counts['passed']} failed={counts['failed']} skipped={counts['skipped']}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
