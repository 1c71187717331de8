"""Gradual unfreezing with discriminative learning rates: a timm ResNet on scikit-learn's digits.

The recipe of docs/finetuning.md, end to end. The 8x8 digits are upsampled to 32x32 single-channel
images and a timm model is fine-tuned in three stages, each one ``trainer.train(...)`` call with a
fresh cosine schedule:

1. only the head (the last layer group) learns;
2. the last residual stage (``layer4``) joins, with a 10x smaller learning rate;
3. every other group joins, each deeper one at half the rate of the one above it.

The model is created with ``pretrained=False`` so that nothing is downloaded; with real work you
would pass ``pretrained=True``, which is where freezing the backbone first pays off. Batch norms
stay trainable throughout (``ModelFreezer``'s default), so even stage 1 adapts the backbone's
normalisation to the new images.

    python examples/finetune_timm_gradual_unfreezing.py
    python examples/finetune_timm_gradual_unfreezing.py --epochs-per-stage 1 --train-samples 600  # about 20 s

One process only: see "With several processes (DDP)" in docs/finetuning.md for why unfreezing
after the model is wrapped needs a different set-up there.
"""

import argparse
import os
import time

import timm
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback
from pytorch_accelerated.finetuning import ModelFreezer
from pytorch_accelerated.schedulers import CosineLrScheduler

NUM_CLASSES = 10


class AccuracyCallback(TrainerCallback):
    """Record the accuracy of every evaluation epoch as ``accuracy`` in the run history."""

    def __init__(self):
        self.accuracy = MulticlassAccuracy(NUM_CLASSES, average="micro")

    def on_eval_epoch_start(self, trainer, **kwargs):
        self.accuracy.to(trainer.device)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        self.accuracy.update(batch_output["model_outputs"].argmax(dim=-1), batch[1])

    def on_eval_epoch_end(self, trainer, **kwargs):
        trainer.run_history.update_metric("accuracy", self.accuracy.compute().item())
        self.accuracy.reset()


def load_digit_images(seed, image_size, train_samples):
    """Return (train, validation, test) datasets of normalised ``1 x image_size x image_size`` images."""
    features, targets = load_digits(return_X_y=True)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(seed))
    n_train, n_val = int(0.7 * len(order)), int(0.15 * len(order))
    splits = [order[:n_train], order[n_train : n_train + n_val], order[n_train + n_val :]]
    if train_samples:
        splits[0] = splits[0][:train_samples]
    images = torch.tensor(features, dtype=torch.float32).view(-1, 1, 8, 8) / 16
    images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    train_images = images[splits[0]]
    images = (images - train_images.mean()) / train_images.std()  # statistics of the training split only
    labels = torch.tensor(targets, dtype=torch.long)
    return [TensorDataset(images[idx], labels[idx]) for idx in splits]


def describe_stage(stage, model, optimizer):
    """Print the layer groups that learn in this stage and each param group's starting rate."""
    # Batch norms are never frozen (ModelFreezer's default): a group counts as learning when a
    # parameter outside its batch norms does.
    learning = [
        name
        for name, group in model.named_children()
        for layer in group.modules()
        if not isinstance(layer, _BatchNorm) and any(p.requires_grad for p in layer.parameters(recurse=False))
    ]
    num_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # A group's starting rate is its "initial_lr" once a scheduler has seen it, else its "lr".
    lrs = [f"{group.get('initial_lr', group['lr']):.2g}" for group in optimizer.param_groups]
    print(
        f"\n=== Stage {stage}: {list(dict.fromkeys(learning))} learn, with every batch norm: "
        f"{num_trainable:,} parameters; param group lrs {lrs}"
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--model", default="resnet10t", help="a timm ResNet (layer groups conv1 ... layer4, fc)"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--epochs-per-stage", type=int, default=2)
    parser.add_argument(
        "--train-samples", type=int, default=0, help="use only this many training images; 0: all"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="small batches: more updates for the batch-norm statistics"
    )
    parser.add_argument("--lr", type=float, default=3e-3, help="the head's learning rate")
    parser.add_argument("--seed", type=int, default=42, help="data split, initial weights, shuffling")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        parser.error(
            "this example runs on one process: unfreezing parameters after DistributedDataParallel has "
            "wrapped the model would train them separately on each process. See 'With several "
            "processes (DDP)' in docs/finetuning.md for the multi-process recipe."
        )
    start = time.perf_counter()
    if "OMP_NUM_THREADS" not in os.environ:
        # 32x32 images are too small to split: extra intra-op threads only wait for each other.
        torch.set_num_threads(1)

    torch.manual_seed(args.seed)
    train_dataset, validation_dataset, test_dataset = load_digit_images(
        args.seed, args.image_size, args.train_samples
    )
    model = timm.create_model(args.model, pretrained=False, num_classes=NUM_CLASSES, in_chans=1)
    freezer = ModelFreezer(model)
    print(
        f"{args.model} layer groups: {[(index, name) for index, (name, _) in enumerate(model.named_children())]}"
    )
    print(
        f"{len(train_dataset)} training, {len(validation_dataset)} validation, {len(test_dataset)} test images"
    )

    # Stage 1: everything but the head is frozen, and the optimizer only holds what can learn.
    freezer.freeze(from_index=0, to_index=-2)
    optimizer = torch.optim.AdamW(freezer.get_trainable_parameters(), lr=args.lr)
    trainer = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optimizer,
        callbacks=(AccuracyCallback(), *DEFAULT_CALLBACKS),  # before LogMetricsCallback prints it
    )

    def train_stage(stage):
        describe_stage(stage, model, optimizer)
        trainer.train(
            train_dataset=train_dataset,
            eval_dataset=validation_dataset,
            num_epochs=args.epochs_per_stage,
            per_device_batch_size=args.batch_size,
            # A new cosine cycle per stage, from each param group's own starting rate.
            create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(lr_min=args.lr / 100),
            reset_run_history=stage == 1,  # keep one history across the stages
            seed=args.seed + stage,  # a new shuffle order for each stage
        )
        history = trainer.run_history
        print(
            f"STAGE={stage} epochs_so_far={len(history.get_metric_values('eval_loss_epoch'))} "
            f"trainable_params={sum(p.numel() for p in freezer.get_trainable_parameters())} "
            f"param_groups={len(optimizer.param_groups)} "
            f"eval_loss_epoch={history.get_latest_metric('eval_loss_epoch'):.4f} "
            f"eval_accuracy={history.get_latest_metric('accuracy'):.4f}"
        )

    train_stage(1)

    # Stage 2: layer4 (group -3) joins. Param groups are added between train() calls, never during
    # one: each run builds its scheduler from the groups the optimizer has when it starts.
    for param_group in freezer.unfreeze(from_index=-3, to_index=-3).values():
        optimizer.add_param_group({**param_group, "lr": args.lr / 10})
    train_stage(2)

    # Stage 3: the rest joins, one param group per layer group with frozen parameters (conv1 and
    # layer1-3; the pooling and activation groups have none), deeper ones at smaller rates.
    unfrozen = freezer.unfreeze(from_index=-4, to_index=0)
    for depth, group_index in enumerate(sorted(unfrozen, reverse=True), start=1):
        optimizer.add_param_group({**unfrozen[group_index], "lr": args.lr / 10 * 0.5**depth})
    train_stage(3)

    test_accuracy = trainer.evaluate(dataset=test_dataset, per_device_batch_size=2 * args.batch_size)[
        "accuracy"
    ]
    print(f"\nwall_time_s={time.perf_counter() - start:.1f}")
    print(f"FINAL test_accuracy={test_accuracy:.4f}")


if __name__ == "__main__":
    main()
