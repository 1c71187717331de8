"""Resume, on 2 processes, from a training state laid out as pytorch-accelerated 0.1.61 wrote it.

Writes the state with accelerate's own ``Accelerator.save_state`` (each rank its
``random_states_{rank}.pkl``) plus ``trainer_metadata.pt``, records each rank's RNG draws right
after the save, then loads it with ``Trainer.load_training_state`` (the draws must come back,
per rank) and resumes it with ``train(resume_from=...)``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from accelerate import Accelerator
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.schedulers import CosineLrScheduler

CREATE = CosineLrScheduler.create_scheduler_fn(num_warmup_epochs=0)


def write_original_state(directory: Path) -> list[float]:
    accelerator = Accelerator()
    model = make_mlp(seed=3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = CosineLrScheduler(optimizer, total_num_epochs=3, num_update_steps_per_epoch=4)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(scheduler)
    torch.manual_seed(100 + rank())  # each rank's RNGs differ
    accelerator.save_state(str(directory))
    if accelerator.is_main_process:
        torch.save({"current_epoch": 2, "global_step": 4}, directory / "trainer_metadata.pt")
    draws = torch.rand(2).tolist()
    accelerator.wait_for_everyone()
    return draws


def main() -> None:
    args = parse_args()
    directory = args.out / "epoch_2"
    model = make_mlp(seed=0)
    # First: the Trainer sets up the process group (a second Accelerator shares it).
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), callbacks=()
    )
    saved_draws = write_original_state(directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = trainer.load_training_state(directory)
        draws = torch.rand(2).tolist()
        trainer.train(
            RegressionDataset(32),
            num_epochs=3,
            per_device_batch_size=4,
            create_scheduler_fn=CREATE,
            resume_from=directory,
        )
    write_result(args.out, {
        "loaded": loaded,
        "rng_restored": draws == saved_draws,
        "global_step": trainer.progress.global_step,
        "steps_per_epoch": trainer.run_config.num_update_steps_per_epoch,
        "scheduler_updates": trainer.scheduler.num_updates,
        "weight_sum": float(sum(p.double().sum() for p in trainer.get_model().parameters())),
        "warnings": [str(w.message) for w in caught],
    })  # fmt: skip


if __name__ == "__main__":
    main()
