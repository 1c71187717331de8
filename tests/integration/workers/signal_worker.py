"""Training runs that a test stops with real signals; tests/integration/test_signals.py starts it as a script.

Not a test module (pytest does not collect it)::

    python tests/integration/workers/signal_worker.py --out DIR SCENARIO [SCENARIO ...]

Each scenario is one run (2 epochs of 4 optimizer updates, an evaluation set of 2 batches) with
``SaveTrainingStateCallback(DIR/<scenario>/states)``. At the scenario's moment (an event, or
inside the end save) the run writes ``DIR/<scenario>.ready`` and waits, in Python, until the
callback has noted a signal, which the test sends when it sees the file: so the signal arrives
at exactly that moment, with no sleeps. The run then goes on and acts on the signal. Before
each scenario the worker prints ``=== <scenario>``; at the end it writes ``DIR/results.json``:
per scenario, where the run stopped, the states saved, the history, whether the signal handlers
and the wakeup fd were put back, and whether resuming from the saved state gives the weights
and history of an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.discovery import list_complete_states

#: scenario -> (signal, the event to wait in, which occurrence of it, save_at_end)
SCENARIOS: dict[str, tuple[signal.Signals, str, int, bool]] = {
    "training": (signal.SIGTERM, "on_train_step_end", 3, True),
    "sigint": (signal.SIGINT, "on_train_step_end", 6, True),
    "last_evaluation": (signal.SIGTERM, "on_eval_step_start", 3, True),  # epoch 2's first batch
    "intermediate_evaluation": (signal.SIGTERM, "on_eval_step_start", 1, True),  # inside step 2
    "epoch_end": (signal.SIGTERM, "on_eval_epoch_end", 1, True),
    "after_last_step": (signal.SIGTERM, "on_training_run_end", 1, False),
    "during_end_save": (signal.SIGTERM, "state_dict", 1, True),
}
WAIT_S = 60.0


def make_data(num_samples: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, 3, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


TRAIN, EVAL = make_data(8, seed=0), make_data(4, seed=1)


class WaitForSignal(TrainerCallback):
    """At the ``occurrence``-th ``event`` (``state_dict``: inside the end save), write the ready
    file and wait until ``saver`` has noted a signal."""

    def __init__(self, ready: Path, saver: SaveTrainingStateCallback, event: str, occurrence: int) -> None:
        self.ready, self.saver, self.event, self.occurrence = ready, saver, event, occurrence
        self.seen = 0
        self.run_ended = False

    def _reached(self, event: str) -> None:
        if event != self.event:
            return
        self.seen += 1
        if self.seen != self.occurrence:
            return
        self.ready.write_text(event)
        deadline = time.monotonic() + WAIT_S
        while self.saver.signal_received is None and time.monotonic() < deadline:
            time.sleep(0.002)

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:
            self._reached("on_train_step_end")

    def on_eval_step_start(self, trainer: Any, **kwargs: Any) -> None:
        self._reached("on_eval_step_start")

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self._reached("on_eval_epoch_end")

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        self.run_ended = True
        self._reached("on_training_run_end")

    def state_dict(self) -> dict[str, Any]:  # called inside every save
        if self.run_ended:
            self._reached("state_dict")
        return {}


class EvaluateAtStep2(TrainerCallback):
    """An intermediate evaluation after the second update."""

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step and trainer.progress.global_step == 2:
            trainer.run_eval_epoch()


def run(
    saver: SaveTrainingStateCallback, extra: tuple[TrainerCallback, ...] = (), resume: bool = False
) -> Trainer:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=(*extra, saver)
    )
    resume_from = saver.save_dir if resume else None
    trainer.train(TRAIN, num_epochs=2, eval_dataset=EVAL, per_device_batch_size=2, resume_from=resume_from)
    return trainer


def summary(trainer: Trainer) -> dict[str, Any]:
    history = trainer.run_history
    return {
        "weights": [value.tolist() for value in trainer.get_model().state_dict().values()],
        "history": {name: history.get_metric_values(name) for name in sorted(history.get_metric_names())},
        "global_step": trainer.progress.global_step,
    }


def run_scenario(name: str, out: Path) -> dict[str, Any]:
    signum, event, occurrence, save_at_end = SCENARIOS[name]
    states = out / name / "states"
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    saver = SaveTrainingStateCallback(states, handle_signals=(signum,), save_at_end=save_at_end)
    waiter = WaitForSignal(out / f"{name}.ready", saver, event, occurrence)
    extra = (waiter, EvaluateAtStep2()) if name == "intermediate_evaluation" else (waiter,)
    trainer = run(saver, extra)
    after = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    result = {
        **summary(trainer),
        "states": [path.name for _, path in list_complete_states(states)],
        "handlers_restored": after == before,
        "wakeup_fd": signal.set_wakeup_fd(-1),
    }
    if name != "during_end_save":  # resume from what the signal saved
        saver = SaveTrainingStateCallback(states, handle_signals=(), save_at_end=False)
        resumed = run(saver, (WaitForSignal(out / "unused", saver, "never", 1),), resume=True)
        result["resumed"] = summary(resumed)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("scenarios", nargs="+")
    args = parser.parse_args()
    reference = run(SaveTrainingStateCallback(args.out / "reference", handle_signals=(), save_at_end=False))
    results: dict[str, Any] = {"reference": summary(reference)}
    for name in args.scenarios:
        print(f"=== {name}", flush=True)
        results[name] = run_scenario(name, args.out)
    print("=== end", flush=True)
    (args.out / "results.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
