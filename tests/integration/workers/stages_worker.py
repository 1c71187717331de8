"""A script of two ``train()`` calls, two stages of one run: tests/integration/test_stages.py runs it,
kills it and runs it again.

Not a test module (pytest does not collect it)::

    python tests/integration/workers/stages_worker.py --out DIR --save-dir STATES
                                                      [--resume auto|none] [--kill-at S:N]

The model is a backbone (``Linear(3, 8)``, ``ReLU``) and a head (``Linear(8, 1)``); 32 samples in
batches of 8, 4 updates per epoch. Stage 1 trains the head alone for 2 epochs (8 updates): the
backbone frozen, the optimizer (SGD, momentum 0.9) holding the head's parameters only. Then the
script unfreezes the backbone and adds it to the optimizer as a second param group (a smaller
learning rate), and stage 2 trains both for 3 epochs (12 updates) with ``reset_run_history=False``,
continuing the run. ``SaveTrainingStateCallback`` saves into ``STATES`` every 2 updates (and
``final`` at each call's end); both calls pass ``resume_from="auto"`` (``--resume none``: None, the
uninterrupted oracle).

``--kill-at S:N``: the process SIGKILLs itself in stage S after that call's update N (after the
update's save); N = 0: when stage S's first update starts (``on_train_step_start``), before the
stage has saved anything. ``--signal S:N``: it sends itself SIGTERM there instead (the callback
saves the state and stops the run; the script goes on). ``--range-test``: a learning-rate range
test (5 updates) before stage 1.

On 2 processes (tests/distributed/test_stages_two_processes.py) each writes ``DIR/rank{R}.json``:
its weights and each call's updates. On 1, at the end it writes ``DIR/result.pt``: the final weights, and for each call the number of updates it
trained, the events the Trainer fired, and ``trainer.progress.global_step`` and ``run_identity``'s
``run_id`` and ``steps_before`` after it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import STATE_SAVES_ORDER, SaveTrainingStateCallback, TrainerCallback
from tests.helpers import EventRecorder, make_regression_data

DATA = make_regression_data(32)  # 4 updates per epoch in batches of 8
BATCH = 8
STAGE_EPOCHS = (2, 3)  # 8 updates, then 12
SAVE_EVERY_N_STEPS = 2


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 1))


class KillAt(TrainerCallback):
    """Sends this process ``signum`` in stage ``stage`` (set by the script before each call) after
    update ``update`` of that call (0: when its first update starts)."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, stage: int, update: int, signum: int = signal.SIGKILL) -> None:
        self.at, self.update, self.stage, self.signum = stage, update, 0, signum

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        if self.stage == self.at and self.update == 0:
            os.kill(os.getpid(), self.signum)

    def on_train_step_end(self, trainer: Any, **kwargs: Any) -> None:
        if self.stage == self.at and trainer.progress.global_step == self.update:
            os.kill(os.getpid(), self.signum)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--save-dir", type=Path, required=True)
    parser.add_argument("--resume", choices=("auto", "none"), default="auto")
    parser.add_argument("--kill-at", default="")
    parser.add_argument("--signal", default="")
    parser.add_argument("--range-test", action="store_true")
    parser.add_argument("--batch", type=int, default=BATCH, help="per process")
    args = parser.parse_args()
    killer = KillAt(*map(int, args.kill_at.split(":"))) if args.kill_at else None
    if args.signal:
        killer = KillAt(*map(int, args.signal.split(":")), signum=signal.SIGTERM)
    recorder = EventRecorder([])

    model = make_model()
    backbone, head = model[0], model[2]
    backbone.requires_grad_(False)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.05, momentum=0.9)
    callbacks = [
        SaveTrainingStateCallback(args.save_dir, save_every_n_steps=SAVE_EVERY_N_STEPS),
        recorder,
        *([killer] if killer else []),
    ]
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=callbacks)
    resume_from = "auto" if args.resume == "auto" else None
    if args.range_test:  # puts everything back: no stage of the script
        trainer.find_learning_rate(DATA, per_device_batch_size=BATCH, num_steps=5)
    calls = []
    for stage, num_epochs in enumerate(STAGE_EPOCHS, start=1):
        if stage == 2:  # the backbone joins, with a smaller learning rate
            backbone.requires_grad_(True)
            optimizer.add_param_group({"params": list(backbone.parameters()), "lr": 0.01})
        if killer:
            killer.stage = stage
        recorder.log = []
        trainer.train(
            DATA,
            num_epochs=num_epochs,
            per_device_batch_size=args.batch,
            reset_run_history=stage == 1,
            resume_from=resume_from,
        )
        calls.append(
            {
                "updates": recorder.log.count("on_train_step_end"),
                "events": recorder.log,
                "global_step": trainer.progress.global_step,
                "run_id": trainer.run_identity.run_id,
                "steps_before": trainer.run_identity.steps_before,
            }
        )
    weights = {name: value.detach().clone() for name, value in trainer.get_model().state_dict().items()}
    if trainer.accelerator.num_processes == 1:
        torch.save({"weights": weights, "calls": calls}, args.out / "result.pt")
    else:  # each process its rank{R}.json, as tests/launch.py's worker groups read them
        result = {
            "num_processes": trainer.accelerator.num_processes,
            "weights": {name: value.tolist() for name, value in weights.items()},
            "updates": [call["updates"] for call in calls],
        }
        (args.out / f"rank{trainer.accelerator.process_index}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
