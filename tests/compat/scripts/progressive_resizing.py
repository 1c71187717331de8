"""Progressive resizing, both ways the original's users do it.

1. A callback changes the image size of the training data per epoch: in ``on_train_epoch_start``
   it sets the size on the data set behind ``trainer.train_dataloader``.
2. ``train()`` is called several times, each stage with a data set of larger images, keeping one
   run history (``reset_run_history=False``).
The model pools adaptively, so it accepts every size.
"""

import torch
from torch import nn, optim
from torch.nn import functional as F
from torch.utils.data import Dataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback

NUM_CLASSES = 2


class ResizableImages(Dataset):
    """Images made at 32x32 and resized on access to ``image_size``."""

    def __init__(self, num_samples, image_size, seed):
        generator = torch.Generator().manual_seed(seed)
        self.targets = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
        self.images = 0.3 * torch.randn(num_samples, 1, 32, 32, generator=generator) + self.targets.view(
            -1, 1, 1, 1
        )
        self.image_size = image_size
        self.sizes_served = set()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        self.sizes_served.add(self.image_size)
        image = F.interpolate(self.images[index : index + 1], size=self.image_size, mode="bilinear")[0]
        return image, self.targets[index]


class ProgressiveResizeCallback(TrainerCallback):
    def __init__(self, sizes):
        self.sizes = sizes

    def on_train_epoch_start(self, trainer, **kwargs):
        epoch = trainer.run_history.current_epoch
        size = self.sizes[min(epoch, len(self.sizes)) - 1]
        trainer.train_dataloader.dataset.image_size = size
        print(f"epoch {epoch}: image size {size}")


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4, NUM_CLASSES),
    )


def main():
    model = make_model()
    sizes = [8, 16, 24]
    train_dataset = ResizableImages(24, image_size=8, seed=0)
    trainer = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(model.parameters(), lr=0.1),
        callbacks=(ProgressiveResizeCallback(sizes), *DEFAULT_CALLBACKS),
    )
    trainer.train(train_dataset=train_dataset, num_epochs=3, per_device_batch_size=8)
    assert train_dataset.sizes_served == set(sizes), train_dataset.sizes_served

    # Several train() calls, one stage each, with one run history.
    model = make_model()
    trainer = Trainer(model, loss_func=nn.CrossEntropyLoss(), optimizer=optim.SGD(model.parameters(), lr=0.1))
    for stage, size in enumerate(sizes):
        trainer.train(
            train_dataset=ResizableImages(24, image_size=size, seed=0),
            eval_dataset=ResizableImages(8, image_size=size, seed=1),
            num_epochs=1,
            per_device_batch_size=8,
            reset_run_history=stage == 0,
        )
    assert len(trainer.run_history.get_metric_values("train_loss_epoch")) == len(sizes)
    assert len(trainer.run_history.get_metric_values("eval_loss_epoch")) == len(sizes)
    if trainer.run_config.is_world_process_zero:
        print(f"COMPAT OK progressive_resizing stages={len(sizes)}")


if __name__ == "__main__":
    main()
