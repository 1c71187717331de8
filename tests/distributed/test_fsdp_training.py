"""Training and single-file checkpoints under FSDP2, on 2 real CPU processes (gloo).

What is proven here, and how: accelerate 1.16 enables FSDP only on GPUs (or other accelerator
devices), so ``workers/fsdp_cpu.py``'s ``FSDPOnCPUTrainer`` sets accelerate's engine type to FSDP
by hand on a CPU group; everything else is accelerate's and torch's real FSDP2 code (``prepare``
shards the model with ``fully_shard``, parameters are ``DTensor``s, ``clip_grad_norm_``,
``get_state_dict``). FSDP1 and GPUs are not run here (see docs/recipes/fsdp.md).

One launch (``workers/fsdp_training.py``) trains the same runs under plain DDP and under FSDP2,
saves, loads and refuses; the oracle is the DDP run, and a plain model and ``torch.optim.AdamW``
in this process for the checkpoint files.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch import nn

from pytorch_accelerated import Trainer
from tests.launch import WorkerRun, launch_workers

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> WorkerRun:
    return launch_workers("fsdp_training.py", tmp_path_factory.mktemp("fsdp_training"))


def assert_close(found: Any, expected: Any) -> None:
    """Equal within ``TOLERANCE``: numbers, lists of them, or dicts of those (loss histories)."""
    if isinstance(expected, dict):
        assert found.keys() == expected.keys()
        for key in expected:
            assert_close(found[key], expected[key])
    else:
        assert found == pytest.approx(expected, rel=TOLERANCE, abs=TOLERANCE)


def test_training_under_fsdp2_gives_the_losses_of_ddp(run: WorkerRun) -> None:
    for result in run.results:
        ddp, fsdp = result["ddp"], result["fsdp"]
        # Sharded for real: the optimizer holds DTensor shards of FSDP's module; under DDP, plain tensors.
        assert fsdp["model"]["class"] == "FSDPSequential" and all(fsdp["model"]["sharded"])
        assert ddp["model"]["class"] == "Sequential" and not any(ddp["model"]["sharded"])
        # 3 epochs, accumulation 2 with a last window of 1 batch, clipped to max_grad_norm=0.5
        # (the last update's norm was above it), each evaluated: equal to DDP's; so are evaluate()
        # and predict() afterwards.
        assert len(fsdp["main"]["train_loss_epoch"]) == len(fsdp["main"]["eval_loss_epoch"]) == 3
        assert_close(fsdp["main"], ddp["main"])
        assert fsdp["model"]["last_grad_norm"] > 0.5
        assert_close(fsdp["model"]["last_grad_norm"], ddp["model"]["last_grad_norm"])
        assert_close(fsdp["evaluation"], ddp["evaluation"])
        assert len(fsdp["predictions"]) == 40 * 2  # every sample's 2 outputs, in data-set order
        assert_close(fsdp["predictions"], ddp["predictions"])
        # 1 sample on 2 processes: process 1's forward (FSDP's all-gathers) runs on zero rows.
        assert_close(fsdp["one_sample"], ddp["one_sample"])
        assert_close(fsdp["one_sample_predictions"], ddp["one_sample_predictions"])
        assert len(fsdp["one_sample_predictions"]) == 2
        # Clipping by value works on the sharded gradients (elementwise): DDP's losses, which it changed.
        assert_close(fsdp["clipped_by_value"], ddp["clipped_by_value"])
        assert not math.isclose(
            ddp["clipped_by_value"]["train_loss_epoch"][0], ddp["main"]["train_loss_epoch"][0]
        )


def plain_model_and_optimizer(
    worker_common: ModuleType, path: Path
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A plain, unwrapped model and AdamW, loaded from a file written by save_checkpoint."""
    checkpoint = torch.load(path, weights_only=True)
    model = worker_common.make_mlp(seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model.load_state_dict(checkpoint["model_state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    return model, optimizer


def assert_same_states(
    model: nn.Module, optimizer: torch.optim.Optimizer, other: nn.Module, other_optimizer: Any
) -> None:
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, other.state_dict()[name], rtol=TOLERANCE, atol=TOLERANCE)
    state, other_state = optimizer.state_dict(), other_optimizer.state_dict()
    assert state["param_groups"] == other_state["param_groups"]
    assert sorted(state["state"]) == sorted(other_state["state"]) == [0, 1, 2, 3]
    for number, values in state["state"].items():
        for key, value in values.items():
            torch.testing.assert_close(
                value, other_state["state"][number][key], rtol=TOLERANCE, atol=TOLERANCE
            )


def test_save_checkpoint_under_fsdp2_writes_full_states_that_load_into_a_plain_model(
    run: WorkerRun, worker_common: ModuleType
) -> None:
    ddp = plain_model_and_optimizer(worker_common, run.out_dir / "ddp.pt")
    fsdp = plain_model_and_optimizer(worker_common, run.out_dir / "fsdp.pt")
    assert_same_states(*fsdp, *ddp)
    assert all(state["step"] == 9 for state in fsdp[1].state_dict()["state"].values())  # 3 epochs x 3 updates


def test_an_fsdp2_trainer_loads_a_full_checkpoint_and_goes_on_as_ddp_would(
    run: WorkerRun, worker_common: ModuleType
) -> None:
    for result in run.results:
        loaded, ddp = result["loaded"], result["ddp"]
        assert not math.isclose(loaded["before_load"], ddp["evaluation"])  # other weights before loading
        assert_close(loaded["evaluation"], ddp["evaluation"])
        # The optimizer state was loaded too: the next epoch's updates are DDP's.
        assert_close(loaded["continued"], ddp["continued"])
        assert loaded["bad_file"]["type"] == "StateMismatchError"
        assert (
            "size mismatch for 0.weight: (8, 6) in the file, (8, 5) in the model"
            in loaded["bad_file"]["message"]
        )
    # Saved again from the sharded trainer: the very states it loaded.
    assert_same_states(
        *plain_model_and_optimizer(worker_common, run.out_dir / "reloaded.pt"),
        *plain_model_and_optimizer(worker_common, run.out_dir / "ddp.pt"),
    )


def test_save_checkpoint_per_node_gives_each_node_the_full_states(
    run: WorkerRun, worker_common: ModuleType
) -> None:
    # As on 2 machines that share no file system: each node's main process writes the whole file.
    reloaded = plain_model_and_optimizer(worker_common, run.out_dir / "reloaded.pt")
    for node in (0, 1):
        assert_same_states(
            *plain_model_and_optimizer(worker_common, run.out_dir / f"node{node}" / "per_node.pt"), *reloaded
        )


def test_nan_in_one_process_shard_is_refused_on_every_process(run: WorkerRun) -> None:
    for result in run.results:
        error = result["loaded"]["nan_on_process_1"]
        assert error["type"] == "NonFiniteStateError"
        assert "the weights hold NaN or infinity (on process 1); nothing was written" in error["message"]
    assert not (run.out_dir / "nan.pt").exists()


def test_the_ema_callback_is_refused_under_fsdp_at_run_start(run: WorkerRun) -> None:
    for result in run.results:
        assert result["ema"] == {
            "type": "ValueError",
            "message": "ModelEmaCallback cannot run under FSDP: it keeps a whole copy of the model on each "
            "process, and FSDP's model is sharded across the processes. Remove it from the callbacks, or "
            "train without FSDP.",
        }


def test_the_learning_rate_range_test_is_refused_under_fsdp_before_it_runs(run: WorkerRun) -> None:
    for result in run.results:
        assert result["range_test"] == {
            "type": "ValueError",
            "message": "find_learning_rate cannot run under FSDP: its engine holds the model's and the optimizer's "
            "state, which the range test must put back afterwards. Run the range test without FSDP (e.g. on one "
            "process), then train under it.",
        }


DROPPED_ON_TWO_CPU_PROCESSES = (
    "FSDP was requested (ACCELERATE_USE_FSDP=true, from `accelerate launch --use_fsdp`, the accelerate config or "
    "an fsdp_plugin), but accelerate runs plain data parallelism (DDP over gloo) on 2 CPU processes, each holding "
    "the whole model and optimizer state: it enables FSDP only for a group of processes on GPUs (or other "
    "accelerator devices), so nothing is sharded here."
)


def test_fsdp_asked_for_on_a_cpu_group_warns_that_ddp_runs_instead(run: WorkerRun) -> None:
    first, second = (result["dropped_fsdp_warnings"] for result in run.results)
    assert len(first) == 1 and first[0].startswith(DROPPED_ON_TWO_CPU_PROCESSES)
    assert "To shard, launch on GPUs (`accelerate launch --use_fsdp --fsdp_version 2" in first[0]
    assert second == []  # once per machine


class PluginTrainer(Trainer):
    """Asks for FSDP in code: an FSDP2 plugin given to the Accelerator."""

    def _create_accelerator(self) -> Accelerator:
        return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))


@pytest.mark.parametrize("asked_by", ["launcher", "plugin"])
def test_fsdp_asked_for_in_one_cpu_process_warns_that_it_runs_unsharded(
    asked_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As `accelerate launch --use_fsdp` sets it; the Accelerator sets it too when given a plugin
    # (monkeypatch restores the variable's absence afterwards, for the tests that follow).
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    if asked_by == "plugin":
        monkeypatch.delenv("ACCELERATE_USE_FSDP")
    model = nn.Linear(3, 1)
    trainer_class = PluginTrainer if asked_by == "plugin" else Trainer
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer_class(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    dropped = [warning for warning in caught if "FSDP" in str(warning.message)]
    assert len(dropped) == 1, [str(warning.message) for warning in caught]
    assert str(dropped[0].message).startswith(
        "FSDP was requested (ACCELERATE_USE_FSDP=true, from `accelerate launch --use_fsdp`, the accelerate config "
        "or an fsdp_plugin), but accelerate runs a single process that holds the whole model and optimizer state"
    )
    assert dropped[0].filename == __file__  # points at the line that created the Trainer


class FSDP1ReportingAccelerator(Accelerator):
    """A real one-process CPU Accelerator that reports FSDP version 1 once created (FSDP1 does
    not run on the CPU: torch refuses its CPU device)."""

    reporting = False

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.FSDP if self.reporting else super().distributed_type

    @property
    def is_fsdp2(self) -> bool:
        return False


class FSDP1Trainer(Trainer):
    def _create_accelerator(self) -> Accelerator:
        accelerator = FSDP1ReportingAccelerator(cpu=True)
        accelerator.reporting = True
        return accelerator


def test_whole_optimizer_states_under_fsdp1_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    model = nn.Linear(3, 1)
    trainer = FSDP1Trainer(model, nn.MSELoss(), torch.optim.AdamW(model.parameters()), callbacks=())
    fix = r"Use FSDP2 \(FullyShardedDataParallelPlugin\(fsdp_version=2\), or `accelerate launch --use_fsdp --fsdp_version 2`\)"
    with pytest.raises(
        ValueError,
        match=rf"^save_checkpoint cannot move the whole optimizer state under FSDP version 1 .*{fix}, or pass save_checkpoint\(..., save_optimizer=False\)",
    ):
        trainer.save_checkpoint(tmp_path / "model.pt")
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "plain.pt"
    state = {"model_state_dict": model.state_dict(), "optimizer_state_dict": trainer.optimizer.state_dict()}  # type: ignore[union-attr]
    torch.save(state, path)
    with pytest.raises(
        ValueError, match=r"^load_checkpoint cannot .* or pass load_checkpoint\(..., load_optimizer=False\)"
    ):
        trainer.load_checkpoint(path)
    assert "model_state_dict" in trainer.load_checkpoint(path, load_optimizer=False)
