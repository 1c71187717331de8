"""WSD training with checkpoints, then a continuation run, as the original's WSD docs show.

Run 1: ``WSDLrScheduler.create_scheduler_fn(total_num_epochs=..., num_warmup_epochs=...,
num_checkpoints=3)`` over 4 epochs of 25 updates (100 updates) and ``WSDCheckpointCallback``
writing ``checkpoint_{s}_wsd_pre_decay`` (training-state directories) and
``checkpoint_{s}_wsd_post_decay.pt`` (files): the example of docs/callbacks-builtin.md gives
pre-decay 23, 48, 95 and post-decay 25, 50, 100.
Run 2: a continuation from the last post-decay checkpoint with
``is_continuation_from_checkpoint=True`` and ``initial_checkpoint=...``: the weights are loaded
and the schedule starts a fresh stable phase at the peak learning rate.
"""

import os

import torch
from torch import nn, optim
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback, WSDCheckpointCallback
from pytorch_accelerated.schedulers.wsd_scheduler import WSDLrScheduler

PEAK_LR = 0.05


class RecordLr(TrainerCallback):
    def __init__(self):
        self.lrs = []

    def on_train_step_start(self, trainer, **kwargs):
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def make_data():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(25, 3, generator=generator)
    return TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))


def make_trainer(callbacks):
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    return Trainer(
        model,
        loss_func=nn.MSELoss(),
        optimizer=optim.SGD(model.parameters(), lr=PEAK_LR),
        callbacks=(*callbacks, *DEFAULT_CALLBACKS),
    )


def main():
    trainer = make_trainer([WSDCheckpointCallback(save_dir="checkpoints")])
    trainer.train(
        train_dataset=make_data(),
        num_epochs=4,
        per_device_batch_size=1,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
            total_num_epochs=4, num_warmup_epochs=1, num_checkpoints=3, lr_min=0.01
        ),
    )
    expected = {
        *(f"checkpoint_{s}_wsd_pre_decay" for s in (23, 48, 95)),
        *(f"checkpoint_{s}_wsd_post_decay.pt" for s in (25, 50, 100)),
    }
    written = set(os.listdir("checkpoints"))
    assert expected <= written, f"missing {sorted(expected - written)}; written {sorted(written)}"
    assert all(
        os.path.isdir(os.path.join("checkpoints", f"checkpoint_{s}_wsd_pre_decay")) for s in (23, 48, 95)
    )
    final_weights = {k: v.clone() for k, v in trainer.get_model().state_dict().items()}

    checkpoint = torch.load("checkpoints/checkpoint_100_wsd_post_decay.pt", weights_only=True)
    assert checkpoint["checkpoint_type"] == "wsd_post_decay" and checkpoint["step"] == 100, checkpoint.keys()
    assert "model_state_dict" in checkpoint

    # Continuation: 2 more epochs (50 updates) from the final post-decay checkpoint.
    lrs = RecordLr()
    continued = make_trainer(
        [
            lrs,
            WSDCheckpointCallback(
                save_dir="continued", initial_checkpoint="checkpoints/checkpoint_100_wsd_post_decay.pt"
            ),
        ]
    )
    loaded = []

    class CheckLoaded(TrainerCallback):
        def on_train_epoch_start(self, trainer, **kwargs):
            if not loaded:
                state = trainer.get_model().state_dict()
                loaded.append(all(torch.equal(state[k], final_weights[k]) for k in final_weights))

    continued.callback_handler.add_callback(CheckLoaded())
    continued.train(
        train_dataset=make_data(),
        num_epochs=2,
        per_device_batch_size=1,
        create_scheduler_fn=WSDLrScheduler.create_scheduler_fn(
            total_num_epochs=2,
            num_warmup_epochs=0,
            num_checkpoints=1,
            lr_min=0.01,
            is_continuation_from_checkpoint=True,
        ),
    )
    assert loaded == [True], "the continuation did not start from the checkpoint's weights"
    assert abs(lrs.lrs[0] - PEAK_LR) < 1e-9, f"the continuation should start at the peak lr, got {lrs.lrs[0]}"
    assert lrs.lrs[-1] < PEAK_LR / 2, f"the continuation should end decayed, got {lrs.lrs[-1]}"
    continued_files = os.listdir("continued")
    assert any(name.endswith("_wsd_post_decay.pt") for name in continued_files), continued_files
    if continued.run_config.is_world_process_zero:
        print(f"COMPAT OK wsd_checkpoints written={len(written)} continued={sorted(continued_files)}")


if __name__ == "__main__":
    main()
