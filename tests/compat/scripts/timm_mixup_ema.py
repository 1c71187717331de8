"""timm components as the original's examples combine them: a timm model built with
``timm.create_model(..., pretrained=False)``, ``timm.data.Mixup`` with ``SoftTargetCrossEntropy``
in a Trainer subclass, a timm cosine scheduler stepped by ``TrainerWithTimmScheduler``, and
``ModelEmaCallback`` evaluating the EMA weights with callbacks of its own.

During the EMA evaluation only the EMA callback's own callbacks get the events, as in 0.1.61
(docs/migration.md), so a callback passed to the Trainer sees one evaluation per epoch.
"""

import functools
import os

import timm
import timm.optim
import torch
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from timm.scheduler import CosineLRScheduler
from torch import nn
from torch.utils.data import TensorDataset

from pytorch_accelerated import TrainerPlaceholderValues
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, ModelEmaCallback, TrainerCallback
from pytorch_accelerated.trainer import TrainerWithTimmScheduler

NUM_CLASSES = 3
NUM_EPOCHS = 2


class MixupTrainer(TrainerWithTimmScheduler):
    def __init__(self, eval_loss_fn, mixup_args, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_loss_fn = eval_loss_fn
        self.mixup_fn = Mixup(**mixup_args)

    def calculate_train_batch_loss(self, batch):
        xb, yb = batch
        mixup_xb, mixup_yb = self.mixup_fn(xb, yb)
        return super().calculate_train_batch_loss((mixup_xb, mixup_yb))

    def calculate_eval_batch_loss(self, batch):
        with torch.no_grad():
            xb, yb = batch
            outputs = self.model(xb)
            val_loss = self.eval_loss_fn(outputs, yb)
        return {"loss": val_loss, "model_outputs": outputs, "batch_size": xb.size(0)}


class CountEvalEpochs(TrainerCallback):
    def __init__(self):
        self.count = 0

    def on_eval_epoch_end(self, trainer, **kwargs):
        self.count += 1


def make_images(num_samples, seed):
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    images = 0.3 * torch.randn(num_samples, 3, 32, 32, generator=generator)
    images[:, 0] += targets.view(-1, 1, 1).float() - 1  # the class shifts the first channel
    return TensorDataset(images, targets)


def main():
    model = timm.create_model("resnet10t", pretrained=False, num_classes=NUM_CLASSES)
    optimizer = timm.optim.create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.01)
    mixup_args = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "label_smoothing": 0.1, "num_classes": NUM_CLASSES}
    on_trainer, on_ema = CountEvalEpochs(), CountEvalEpochs()
    ema_callback = ModelEmaCallback(
        decay=0.9, save_path="ema_model.pt", evaluate_during_training=True, callbacks=(on_ema,)
    )
    trainer = MixupTrainer(
        eval_loss_fn=nn.CrossEntropyLoss(),
        mixup_args=mixup_args,
        model=model,
        loss_func=SoftTargetCrossEntropy(),
        optimizer=optimizer,
        callbacks=(on_trainer, ema_callback, *DEFAULT_CALLBACKS),
    )
    create_scheduler_fn = functools.partial(
        CosineLRScheduler, t_initial=TrainerPlaceholderValues.NUM_EPOCHS, warmup_t=1, warmup_lr_init=1e-5
    )
    trainer.train(
        train_dataset=make_images(32, seed=0),
        eval_dataset=make_images(16, seed=1),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=8,
        create_scheduler_fn=create_scheduler_fn,
    )
    history = trainer.run_history
    assert len(history.get_metric_values("eval_loss_epoch")) == NUM_EPOCHS
    assert len(history.get_metric_values("ema_model_eval_loss_epoch")) == NUM_EPOCHS
    assert on_trainer.count == NUM_EPOCHS, f"the Trainer's callback saw {on_trainer.count} evaluations"
    assert on_ema.count == NUM_EPOCHS, f"the EMA callback's own callback saw {on_ema.count} evaluations"
    assert isinstance(trainer.scheduler, CosineLRScheduler)
    if trainer.run_config.is_world_process_zero:
        assert os.path.exists("ema_model.pt")
        print(
            f"COMPAT OK timm_mixup_ema ema_eval_loss={history.get_latest_metric('ema_model_eval_loss_epoch'):.4f}"
        )


if __name__ == "__main__":
    main()
