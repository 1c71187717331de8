"""A custom callback event without the ``on_`` prefix, as the original's docs fire one.

A Trainer subclass calls ``self.callback_handler.call_event("verify_train_batch", trainer=self,
xb=xb, yb=yb)`` from its ``calculate_train_batch_loss``; a callback handles it with a method
``verify_train_batch(self, trainer, xb, yb)``; callbacks without that method are skipped.
"""

import torch
from torch import nn, optim
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback


class VerifyBatchCallback(TrainerCallback):
    def __init__(self):
        self.num_batches_verified = 0

    def verify_train_batch(self, trainer, xb, yb):
        assert xb.shape[0] == yb.shape[0], "inputs and targets differ in length"
        assert torch.isfinite(xb).all(), "the batch holds non-finite inputs"
        self.num_batches_verified += 1


class TrainerWithCustomEvent(Trainer):
    def calculate_train_batch_loss(self, batch):
        xb, yb = batch
        self.callback_handler.call_event("verify_train_batch", trainer=self, xb=xb, yb=yb)
        return super().calculate_train_batch_loss(batch)


def main():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(40, 4, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    model = nn.Linear(4, 1)
    verifier = VerifyBatchCallback()
    trainer = TrainerWithCustomEvent(
        model,
        loss_func=nn.MSELoss(),
        optimizer=optim.SGD(model.parameters(), lr=0.05),
        callbacks=(verifier, *DEFAULT_CALLBACKS),
    )
    trainer.train(train_dataset=dataset, num_epochs=2, per_device_batch_size=8)
    # 40 samples in batches of 8: 5 batches per epoch on one process.
    expected = 2 * len(trainer.train_dataloader)
    assert verifier.num_batches_verified == expected, (verifier.num_batches_verified, expected)
    if trainer.run_config.is_world_process_zero:
        print(f"COMPAT OK custom_event batches_verified={verifier.num_batches_verified}")


if __name__ == "__main__":
    main()
