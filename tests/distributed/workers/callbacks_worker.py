"""Built-in callbacks on a group of processes: early stopping and save-best, then the EMA.

``early_stopping``: each rank records its own scripted ``eval_loss_epoch``. Rank 0's stops
improving at epoch 3 (patience 1); rank 1's improves every epoch. The decision is rank 0's on
every rank, so both stop at epoch 3 and reload the weights of epoch 2; a per-rank decision
would leave rank 1 waiting for rank 0 in its next all-reduce (a hang, caught by the timeout).

``ema``: a real evaluation set; each rank writes its EMA weights, the difference from an EMA
computed by hand from the weights after every update, and the metrics it recorded.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, state_dict_to_lists, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TRAINER_EVENTS, TrainerCallback
from pytorch_accelerated.callbacks.ema import ModelEmaCallback
from pytorch_accelerated.callbacks.monitoring import EarlyStoppingCallback, SaveBestModelCallback

SCRIPTS = {0: [1.0, 0.8, 0.85, 0.9, 0.7, 0.6], 1: [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]}


class ScriptedEvalLoss(TrainerCallback):
    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("eval_loss_epoch", SCRIPTS[rank()][trainer.progress.epoch])


class Recorder(TrainerCallback):
    """Event names; weights at each epoch end; model weights after each optimizer update."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.per_epoch: list[dict[str, torch.Tensor]] = []
        self.initial: dict[str, torch.Tensor] = {}
        self.per_update: list[dict[str, torch.Tensor]] = []
        self._last_step = 0

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.initial = copy.deepcopy(trainer.get_model().state_dict())

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if trainer.progress.global_step != self._last_step:
            self._last_step = trainer.progress.global_step
            self.per_update.append(copy.deepcopy(trainer.get_model().state_dict()))

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.per_epoch.append(copy.deepcopy(trainer.get_model().state_dict()))


def _recording_hook(event: str, original: Any) -> Any:
    def hook(self: Recorder, trainer: Any, **kwargs: Any) -> None:
        self.events.append(event)
        if original is not None:
            original(self, trainer, **kwargs)

    return hook


for _event in TRAINER_EVENTS:
    setattr(Recorder, _event, _recording_hook(_event, Recorder.__dict__.get(_event)))


def make_trainer(callbacks: tuple) -> Trainer:
    model = make_mlp(seed=0)
    return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=callbacks)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[name].double() - b[name].double()).abs().max().item() for name in a)


def early_stopping(out: Path) -> dict[str, Any]:
    save_best, recorder = SaveBestModelCallback(save_path=out / "best.pt"), Recorder()
    stopper = EarlyStoppingCallback(early_stopping_patience=1)
    trainer = make_trainer((ScriptedEvalLoss(), recorder, save_best, stopper))
    trainer.train(RegressionDataset(32), num_epochs=6, per_device_batch_size=2)
    final = trainer.get_model().state_dict()
    return {
        "num_processes": trainer.run_config.num_processes,
        "epochs_run": len(trainer.run_history.get_metric_values("train_loss_epoch")),
        "global_step": trainer.progress.global_step,
        "steps_per_epoch": trainer.run_config.num_update_steps_per_epoch,
        "last_events": recorder.events[-2:],
        "best_epoch": save_best.best_epoch,
        "final_minus_epoch_2": max_difference(final, recorder.per_epoch[1]),
        "final_minus_epoch_3": max_difference(final, recorder.per_epoch[2]),
        "final_weights": state_dict_to_lists(trainer.get_model()),
    }


def ema(out: Path) -> dict[str, Any]:
    decay = 0.9
    ema_callback, recorder = (
        ModelEmaCallback(decay=decay, save_path=out / "ema.pt", load_saved_checkpoint=False),
        Recorder(),
    )
    trainer = make_trainer((ema_callback, recorder))
    trainer.train(
        RegressionDataset(32),
        num_epochs=2,
        eval_dataset=RegressionDataset(22, seed=2),
        per_device_batch_size=4,
    )
    by_hand = {name: tensor.clone() for name, tensor in recorder.initial.items()}
    for weights in recorder.per_update:
        by_hand = {name: decay * by_hand[name] + (1 - decay) * weights[name] for name in by_hand}
    history = trainer.run_history
    return {
        "num_processes": trainer.run_config.num_processes,
        "num_updates": len(recorder.per_update),
        "ema_minus_hand": max_difference(ema_callback.ema_model.module.state_dict(), by_hand),
        "ema_weights": state_dict_to_lists(ema_callback.ema_model.module),
        "model_minus_ema": max_difference(
            trainer.get_model().state_dict(), ema_callback.ema_model.module.state_dict()
        ),
        "ema_model_eval_loss_epoch": history.get_metric_values("ema_model_eval_loss_epoch"),
        "eval_loss_epoch": history.get_metric_values("eval_loss_epoch"),
        "best_epoch": ema_callback.best_epoch,
    }


def main() -> None:
    args = parse_args()
    write_result(args.out, {"early_stopping": early_stopping(args.out), "ema": ema(args.out)})


if __name__ == "__main__":
    main()
