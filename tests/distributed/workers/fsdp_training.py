"""Training under FSDP2 on 2 CPU processes, against the same runs under plain DDP.

Phase 1 (DDP, the normal Trainer): 3 epochs with evaluation, ``max_grad_norm`` and gradient
accumulation 2 (a last window of 1 batch), ``save_checkpoint`` (``ddp.pt``), an evaluation, one
more epoch; then 1 epoch clipped by value. Phase 2 (FSDP2 through accelerate's FSDP code paths,
``fsdp_cpu.FSDPOnCPUTrainer``): the same runs (``fsdp.pt``); a fresh FSDP trainer with other
weights loads ``ddp.pt``, evaluates, saves it again (``reloaded.pt``) and trains the one more
epoch, and saves a per-node file as on 2 machines; a NaN put into process 1's shard only is
refused by ``save_checkpoint``; the EMA callback is refused at run start, and so is the
learning-rate range test. DDP runs first: the FSDP engine type, once set by hand, is the
process's (accelerate's state is shared). Rank 0 writes the losses; the test compares them.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import common
import torch
from accelerate.state import AcceleratorState, PartialState
from fsdp_cpu import FSDPOnCPUTrainer
from torch import nn
from torch.distributed.tensor import DTensor

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import ModelEmaCallback

TRAIN = common.RegressionDataset(72)  # 72 / (2 x 8) = 4.5: 5 batches a process, windows of 2, 2, 1
EVAL = common.RegressionDataset(40, seed=2)
ONE_SAMPLE = common.RegressionDataset(1, seed=2)
RUN = {"per_device_batch_size": 8, "gradient_accumulation_steps": 2}


def new_trainer(trainer_class: type[Trainer], seed: int = 0, **kwargs: Any) -> Trainer:
    model = common.make_mlp(seed)
    return trainer_class(
        model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=0.05), callbacks=(), **kwargs
    )


def losses(trainer: Trainer) -> dict[str, list[float]]:
    history = trainer.run_history
    return {name: history.get_metric_values(name) for name in ("train_loss_epoch", "eval_loss_epoch")}


def error_of(action: Callable[[], Any]) -> dict[str, str] | None:
    try:
        action()
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return None


def runs(trainer_class: type[Trainer], out: Path, name: str) -> dict[str, Any]:
    """The main run (3 epochs, saved to ``<name>.pt``) and the run clipped by value."""
    trainer = new_trainer(trainer_class)
    trainer.train(TRAIN, num_epochs=3, eval_dataset=EVAL, max_grad_norm=0.5, **RUN)
    result: dict[str, Any] = {"main": losses(trainer)}
    trainer.save_checkpoint(out / f"{name}.pt")
    result["evaluation"] = trainer.evaluate(EVAL)["evaluation_loss"]
    result["predictions"] = trainer.predict(EVAL).flatten().tolist()
    # 1 sample: process 1 runs the sharded model's forward on a padding batch of zero rows.
    result["one_sample"] = trainer.evaluate(ONE_SAMPLE, per_device_batch_size=1)["evaluation_loss"]
    result["one_sample_predictions"] = trainer.predict(ONE_SAMPLE).flatten().tolist()
    result["model"] = {
        "class": type(trainer.get_model()).__name__,
        "sharded": [
            isinstance(parameter, DTensor)
            for group in trainer.optimizer.param_groups
            for parameter in group["params"]
        ],
        "last_grad_norm": float(trainer.last_grad_norm),  # type: ignore[arg-type]
    }
    if name == "ddp":  # the epoch that the FSDP trainer continues with after loading ddp.pt
        trainer.train(TRAIN, num_epochs=1, **RUN)
        result["continued"] = losses(trainer)
    clipped = new_trainer(trainer_class)
    clipped.train(TRAIN, num_epochs=1, gradient_clip_value=0.05, **RUN)
    result["clipped_by_value"] = losses(clipped)
    return result


def load_into_fsdp(out: Path) -> dict[str, Any]:
    """A prepared (sharded) FSDP trainer with other weights loads the DDP run's checkpoint."""
    trainer = new_trainer(FSDPOnCPUTrainer, seed=7)
    before = trainer.evaluate(EVAL)["evaluation_loss"]  # prepares (shards) model and optimizer
    trainer.load_checkpoint(out / "ddp.pt")
    result: dict[str, Any] = {"before_load": before, "evaluation": trainer.evaluate(EVAL)["evaluation_loss"]}
    trainer.save_checkpoint(out / "reloaded.pt")
    with one_process_per_node():  # each node's writer needs the whole state, not only process 0
        trainer.save_checkpoint(out / f"node{common.rank()}" / "per_node.pt", save_per_node=True)
    trainer.train(TRAIN, num_epochs=1, **RUN)
    result["continued"] = losses(trainer)
    result["bad_file"] = error_of(lambda: trainer.load_checkpoint(out / "wrong_shapes.pt"))
    result["nan_on_process_1"] = nan_in_one_shard(trainer, out)
    return result


@contextmanager
def one_process_per_node() -> Iterator[None]:
    """As if each process ran on a machine of its own (``torchrun --nnodes 2 --nproc_per_node 1``):
    each is its node's main process, and writes a per-node file to its own folder."""
    states = (PartialState(), AcceleratorState())
    saved = [state.local_process_index for state in states]
    for state in states:
        state.local_process_index = 0
    try:
        yield
    finally:
        for state, index in zip(states, saved, strict=True):
            state.local_process_index = index


def nan_in_one_shard(trainer: Trainer, out: Path) -> dict[str, str] | None:
    weight = trainer.get_model()[0].weight  # type: ignore[index]
    assert isinstance(weight, DTensor)
    if common.rank() == 1:
        with torch.no_grad():
            weight.to_local()[0, 0] = math.nan
    return error_of(lambda: trainer.save_checkpoint(out / "nan.pt"))


def dropped_fsdp_warnings() -> list[str]:
    """What creating a normal Trainer says on this CPU group when FSDP is asked for."""
    os.environ["ACCELERATE_USE_FSDP"] = "true"  # as `accelerate launch --use_fsdp` sets it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new_trainer(Trainer)
    del os.environ["ACCELERATE_USE_FSDP"]
    return [str(warning.message) for warning in caught if "FSDP" in str(warning.message)]


def main() -> None:
    args = common.parse_args()
    out = args.out
    warned = dropped_fsdp_warnings()
    if common.rank() == 0:  # a file that does not fit the model: a first layer of 6 inputs
        torch.save(
            {"model_state_dict": {**common.make_mlp().state_dict(), "0.weight": torch.zeros(8, 6)}},
            out / "wrong_shapes.pt",
        )
    result: dict[str, Any] = {"dropped_fsdp_warnings": warned, "ddp": runs(Trainer, out, "ddp")}
    result["fsdp"] = runs(FSDPOnCPUTrainer, out, "fsdp")
    result["loaded"] = load_into_fsdp(out)
    ema = new_trainer(FSDPOnCPUTrainer)
    ema.callback_handler.add_callback(ModelEmaCallback(save_path=None))
    result["ema"] = error_of(lambda: ema.train(TRAIN, num_epochs=1, **RUN))
    result["range_test"] = error_of(lambda: new_trainer(FSDPOnCPUTrainer).find_learning_rate(TRAIN))
    ema.accelerator.wait_for_everyone()
    common.write_result(out, result)


if __name__ == "__main__":
    main()
