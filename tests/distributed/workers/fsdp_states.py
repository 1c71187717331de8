"""Training states under FSDP2 on CPU processes (gloo), saved sharded and resumed in a new launch.

The run: the MLP of ``common``, AdamW, a cosine schedule with warm-up, 40 samples, per-device
batch 4 (5 batches per process and epoch on 2 processes), 3 epochs, an evaluation set,
``max_grad_norm``, and ``SaveTrainingStateCallback`` saving every 4 updates (``step_8`` is
mid-epoch 2). ``--engine fsdp`` trains under FSDP2 (``fsdp_cpu.FSDPOnCPUTrainer``, the engine
type set by hand since accelerate enables FSDP only on accelerator devices), ``--engine ddp``
with the plain Trainer (DDP), the oracle.

Each rank writes its per-epoch losses and, on rank 0, the full (gathered) weights at the end,
when the run starts its first epoch (after a resume: what was loaded) and right after update 8
(what ``step_8`` holds), with the whole optimizer state. Run alone (plain ``python``), it joins a
process group of one (FSDP needs a group). ``--try-async``: after the run, ``save_training_state(...,
asynchronous=True)`` must be refused before anything is written; then a save that fails
inside DCP on process 1 (a file-size limit) must raise on both and leave nothing behind; then the
model's first layer is frozen, a state saved by hand into ``<save-dir>_frozen/state``, every
parameter made trainable again and the state loaded back (result ``frozen``).
``--then-resume-from STATE``: then a new Trainer in the same launch resumes from ``STATE``
(result ``then``). ``--flipped-states FOLDER``: then, in the same launch, a new Trainer tries to
resume from each state in ``FOLDER`` (result ``flips``: what each attempt raised, None when it
trained). ``--state-dict-type`` sets the FSDP plugin's (``SHARDED_STATE_DICT`` by default).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from fsdp_cpu import FSDPOnCPUTrainer
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback, get_default_callbacks
from pytorch_accelerated.schedulers import CosineLrScheduler

SAVED_STEP = 8


def full_weights(trainer: Trainer) -> dict[str, Any]:
    """The whole model's weights (gathered from the shards under FSDP: every process calls this)."""
    state = trainer.accelerator.get_state_dict(trainer.model)
    return {name: value.detach().double().tolist() for name, value in state.items()}


def full_optimizer_state(trainer: Trainer) -> dict[str, Any]:
    """The whole optimizer state by parameter name (gathered on process 0; every process calls this)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    state = get_optimizer_state_dict(
        trainer.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    return {
        name: {key: value.double().tolist() for key, value in values.items()}
        for name, values in state.get("state", {}).items()
    }


def one_process_group() -> None:
    """Run alone (plain ``python``), join a group of one, as torchrun would set it up: FSDP needs one."""
    if "RANK" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )


class WatchWeights(TrainerCallback):
    """Records the full weights when the run's first epoch starts and after update ``SAVED_STEP``."""

    def __init__(self) -> None:
        self.at_start: dict[str, Any] | None = None
        self.at_saved_step: dict[str, Any] | None = None

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.at_start is None:
            # Only once it has state: torch's get_optimizer_state_dict steps an optimizer without any (lr 0).
            optimizer = full_optimizer_state(trainer) if trainer.progress.global_step else None
            self.at_start = {"weights": full_weights(trainer), "optimizer": optimizer}

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if trainer.progress.global_step == SAVED_STEP and self.at_saved_step is None:
            self.at_saved_step = {
                "weights": full_weights(trainer),
                "optimizer": full_optimizer_state(trainer),
            }


def try_async_save(trainer: Trainer, target: Path) -> dict[str, Any]:
    try:
        trainer.save_training_state(target, asynchronous=True)
    except ValueError as error:
        return {
            "message": str(error),
            "written": target.exists() or target.parent.joinpath(f".{target.name}.incomplete").exists(),
        }
    return {"message": None, "written": target.exists()}


def try_failing_save(trainer: Trainer, save_dir: Path) -> dict[str, Any]:
    """Save ``failed`` with process 1 under a file-size limit (SIGXFSZ ignored: writes fail with
    EFBIG) that its RNG file and model shard fit under and its optimizer shard does not (sizes
    from ``step_8``), so the failure comes from inside DCP's collective save of the optimizer."""
    saved = save_dir / "step_8"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if rank() == 1:
        fits = max(
            (saved / "rng_state_1.pt").stat().st_size,
            (saved / "pytorch_model_fsdp_0" / "__1_0.distcp").stat().st_size,
        )
        limit = fits + 1024
        assert (saved / "optimizer_0" / "__1_0.distcp").stat().st_size > limit, (
            "the optimizer shard must not fit"
        )
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        trainer.save_training_state(save_dir / "failed")
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error), "errno": getattr(error, "errno", None)}
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return {"type": None}


def try_frozen_round_trip(trainer: Trainer, target: Path) -> dict[str, Any]:
    """Freeze the model's first layer, save a state by hand, make every parameter trainable again and
    load the state back: which parameters require gradients then, and what the state records."""
    model = trainer.get_model()
    next(model.children()).requires_grad_(False)
    trainer.save_training_state(target)
    model.requires_grad_(True)
    trainer.load_training_state(target)
    return {
        "frozen": sorted(name for name, param in model.named_parameters() if not param.requires_grad),
        "record": torch.load(target / "trainer_state.pt", weights_only=True)["frozen_parameters"],
    }


def run(args: Any, save_dir: str, resume_from: str) -> tuple[Trainer, dict[str, Any]]:
    """The run of the module docstring, saving into ``save_dir``, resumed from ``resume_from`` if given."""
    model = make_mlp()
    watch = WatchWeights()
    callbacks = (
        *get_default_callbacks(progress_bar=False),
        SaveTrainingStateCallback(save_dir, save_every_n_steps=4),
        watch,
    )
    trainer_class = (
        type("FSDPTrainer", (FSDPOnCPUTrainer,), {"state_dict_type": args.state_dict_type})
        if args.engine == "fsdp"
        else Trainer
    )
    trainer = trainer_class(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01),
        callbacks=callbacks,
    )
    trainer.train(
        RegressionDataset(40, seed=1),
        num_epochs=3,
        eval_dataset=RegressionDataset(12, seed=2),
        per_device_batch_size=4,
        max_grad_norm=1.0,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, warmup_starting_lr=1e-3
        ),
        resume_from=resume_from or None,
        seed=7,
    )
    return trainer, {
        "engine": trainer.accelerator.distributed_type.value,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "progress": trainer.progress.state_dict(),
        "train_loss": trainer.run_history.get_metric_values("train_loss_epoch"),
        "eval_loss": trainer.run_history.get_metric_values("eval_loss_epoch"),
        "weights": full_weights(trainer),
        "at_start": watch.at_start,
        "at_saved_step": watch.at_saved_step,
    }


def try_flipped_states(args: Any, folder: Path) -> dict[str, Any]:
    """Resume from each state in ``folder`` (each with one byte flipped): what each attempt raised."""
    outcomes: dict[str, Any] = {}
    for state in sorted(folder.iterdir()):
        try:
            run(args, f"{args.save_dir}_{state.name}", str(state))
            outcomes[state.name] = None
        except Exception as error:
            outcomes[state.name] = {"type": type(error).__name__, "message": str(error)}
    return outcomes


def main() -> None:
    args = parse_args({
        "engine": "fsdp", "save-dir": "", "resume-from": "", "try-async": 0, "state-dict-type": "SHARDED_STATE_DICT",
        "then-resume-from": "", "flipped-states": "",
    })  # fmt: skip
    one_process_group()
    trainer, result = run(args, args.save_dir, args.resume_from)
    if args.try_async:
        result["async"] = try_async_save(trainer, Path(args.save_dir) / "async")
        result["failed_save"] = try_failing_save(trainer, Path(args.save_dir))
        result["frozen"] = try_frozen_round_trip(trainer, Path(f"{args.save_dir}_frozen") / "state")
    if args.then_resume_from:  # then a new Trainer in this process resumes from there
        result["then"] = run(args, f"{args.save_dir}_then", args.then_resume_from)[1]
    if args.flipped_states:  # then the attempts to resume from damaged states
        result["flips"] = try_flipped_states(args, Path(args.flipped_states))
    trainer.accelerator.wait_for_everyone()
    write_result(args.out, result)


if __name__ == "__main__":
    main()
