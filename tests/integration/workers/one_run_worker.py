"""Runs that write training states into one folder; tests/integration/test_one_run_per_folder.py
starts them as scripts (concurrently, or killed with SIGKILL).

Not a test module (pytest does not collect it)::

    python one_run_worker.py concurrent --out DIR --name A --peer B --trials 20 --seed 1
    python one_run_worker.py two-calls --out DIR [--kill-at-second-call-step N] [--resume]

``concurrent``: for each trial i, wait until the peer is ready too, then train a tiny model
(seeded by ``--seed``) for one epoch of 4 updates, saving a state after every update and at the
end into ``DIR/trial_i/states``. After each
save it records what that state must hold (the run id, the weights, the optimizer's momentum and
the torch RNG state); ``DIR/<name>.json`` lists, per trial, the outcome and those records.

``two-calls``: the issue's script: ``train(num_epochs=2)``, then ``train(num_epochs=3,
reset_run_history=False)`` on the same Trainer, saving every 4 updates into ``DIR/states``.
``--kill-at-second-call-step N`` SIGKILLs the process at the second call's update N (after its
save); ``--resume`` builds a new Trainer and runs ``train(num_epochs=3,
resume_from=DIR/states)``. ``DIR/result.pt`` holds the final weights and the run history.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from pytorch_accelerated.callbacks import STATE_SAVES_ORDER, SaveTrainingStateCallback, TrainerCallback  # noqa: E402
from tests.helpers import make_regression_data, make_trainer  # noqa: E402

SAVE_EVERY_N_STEPS = 4


class RecordSaves(TrainerCallback):
    """After each save of the callback before it: what the state must hold, by its name."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self) -> None:
        self.saved: dict[str, Any] = {}

    def record(self, trainer: Any, name: str) -> None:
        optimizer = trainer.optimizer.state_dict()["state"]
        self.saved[name] = {
            "run_id": trainer.run_state.run_id,
            "weights": [p.detach().flatten().tolist() for p in trainer.get_model().parameters()],
            "momentum": [optimizer[k]["momentum_buffer"].flatten().tolist() for k in sorted(optimizer)],
            "rng": torch.get_rng_state().tolist(),
        }

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:
            self.record(trainer, f"step_{trainer.run_state.run_step(trainer.progress)}")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.record(trainer, "final")


def wait_for(path: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.002)


def concurrent(out: Path, name: str, peer: str, trials: int, seed: int) -> None:
    results = []
    data = make_regression_data(16, seed=seed)
    for trial in range(trials):
        (out / f"ready_{name}_{trial}").touch()
        wait_for(out / f"ready_{peer}_{trial}")
        recorder = RecordSaves()
        save = SaveTrainingStateCallback(out / f"trial_{trial}" / "states", save_every_n_steps=1)
        trainer = make_trainer((save, recorder), seed=seed, momentum=0.9)
        try:
            trainer.train(data, num_epochs=1, per_device_batch_size=4, seed=seed)
            outcome = "ok"
        except Exception as error:
            outcome = f"{type(error).__name__}: {error}"
        results.append({"outcome": outcome, "run_id": trainer.run_state.run_id, "saved": recorder.saved})
    (out / f"{name}.json").write_text(json.dumps(results))


class KillAt(TrainerCallback):
    """SIGKILL this process at the second ``train()`` call's update ``step`` (after its save)."""

    event_order = STATE_SAVES_ORDER + 1  # after the state saves of the same event

    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        second_call = trainer.run_state.steps_before > 0
        if is_update_step and second_call and trainer.progress.global_step == self.step:
            print(f"KILLED at run step {trainer.run_state.run_step(trainer.progress)}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def two_calls(out: Path, kill_at: int | None, resume: bool) -> None:
    states = out / "states"
    save = SaveTrainingStateCallback(states, save_every_n_steps=SAVE_EVERY_N_STEPS)
    trainer = make_trainer((save, KillAt(kill_at)), momentum=0.9, lr=0.02)
    train, evaluation = make_regression_data(36, seed=1), make_regression_data(12, seed=2)
    settings = {"eval_dataset": evaluation, "per_device_batch_size": 4, "seed": 3}
    if resume:
        trainer.train(train, num_epochs=3, resume_from=states, **settings)
    else:
        trainer.train(train, num_epochs=2, **settings)
        trainer.train(train, num_epochs=3, reset_run_history=False, **settings)
    history = trainer.run_history
    torch.save(
        {
            "weights": trainer.get_model().state_dict(),
            "eval_loss": history.get_metric_values("eval_loss_epoch"),
            "train_loss": history.get_metric_values("train_loss_epoch"),
            "epoch": history.current_epoch,
        },
        out / "result.pt",
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("concurrent", "two-calls"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--name", default="A")
    parser.add_argument("--peer", default="B")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-at-second-call-step", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.mode == "concurrent":
        concurrent(args.out, args.name, args.peer, args.trials, args.seed)
    else:
        two_calls(args.out, args.kill_at_second_call_step, args.resume)


if __name__ == "__main__":
    main()
