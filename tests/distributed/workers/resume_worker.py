"""A 2-process run that saves training states, can be resumed, and can be told to stop by SIGTERM.

Each rank writes ``pid{RANK}`` (its process id) to the output folder as soon as it starts, and
``rank{RANK}.json`` at the end: its final weights, position, history and what it saw.

The run: an MLP with dropout (each process draws its own masks), AdamW, a cosine schedule with
warm-up, per-device batch 2, gradient accumulation 2, 66 samples (17 batches per process, a
partial last window: 9 optimizer steps per epoch), 3 epochs, an evaluation set, and
``SaveTrainingStateCallback`` saving into ``--save-dir`` every 4 steps, with its default SIGTERM
handling (the processes agree every 10 steps, and at every epoch end, whether a signal arrived).

``--pause-at-step N``: after step N, rank 0 writes ``paused`` and waits until it receives its
signal; rank 1 runs on into the next step and waits for rank 0 inside the gradient all-reduce.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from common import NUM_FEATURES, RegressionDataset, parse_args, rank, state_dict_to_lists, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    STATE_SAVES_ORDER,
    SaveTrainingStateCallback,
    TrainerCallback,
    get_default_callbacks,
)
from pytorch_accelerated.schedulers import CosineLrScheduler

NUM_EPOCHS = 3
STEPS_PER_EPOCH = 9
SAVE_EVERY_N_STEPS = 4


class PauseRank0(TrainerCallback):
    """Pauses rank 0 after update ``at_step`` (and its save) until the saver notes a signal."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, at_step: int, saver: SaveTrainingStateCallback, out: Any) -> None:
        self.at_step, self.saver, self.out = at_step, saver, out
        self.paused = False

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if rank() != 0 or trainer.progress.global_step != self.at_step or self.paused:
            return
        self.paused = True
        (self.out / "paused").write_text(str(self.at_step))
        deadline = time.monotonic() + 120
        while self.saver.signal_received is None and time.monotonic() < deadline:
            time.sleep(0.02)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(NUM_FEATURES, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))


def main() -> None:
    args = parse_args({"save-dir": "", "resume-from": "", "pause-at-step": 0})
    (args.out / f"pid{rank()}").write_text(str(os.getpid()))
    model = make_model()
    saver = SaveTrainingStateCallback(args.save_dir, save_every_n_steps=SAVE_EVERY_N_STEPS)
    callbacks: list[Any] = [*get_default_callbacks(progress_bar=False), saver]
    if args.pause_at_step:
        callbacks.append(PauseRank0(args.pause_at_step, saver, args.out))
    trainer = Trainer(
        model,
        nn.MSELoss(),
        torch.optim.AdamW(model.parameters(), lr=3e-2, weight_decay=0.01),
        callbacks=callbacks,
    )
    trainer.train(
        RegressionDataset(66, seed=1),
        num_epochs=NUM_EPOCHS,
        eval_dataset=RegressionDataset(20, seed=2),
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(
            num_warmup_epochs=1, warmup_starting_lr=1e-3
        ),
        resume_from=args.resume_from or None,
        seed=7,
    )
    write_result(
        args.out,
        {
            "num_processes": trainer.run_config.num_processes,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "weights": state_dict_to_lists(trainer.get_model()),
            "progress": trainer.progress.state_dict(),
            "metrics": trainer.run_history.state_dict()["metrics"],
            "signal_received": saver.signal_received,
        },
    )


if __name__ == "__main__":
    main()
