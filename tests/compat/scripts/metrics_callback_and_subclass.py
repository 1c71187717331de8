"""Metrics as the original's docs track them: torchmetrics in a callback and in a Trainer subclass.

The callback updates a torchmetrics ``Accuracy`` in ``on_eval_step_end`` with ``trainer.gather``,
computes it in ``on_eval_epoch_end``, records it with ``trainer.run_history.update_metric`` and
prints it on the world's process zero (``trainer.run_config.is_world_process_zero``). The subclass
overrides ``calculate_eval_batch_loss`` and ``eval_epoch_end``. Both are checked against the
accuracy of the trained model on the whole evaluation set, on one process or several, and the
callback also in an evaluation-only run on a fresh Trainer.
"""

import torch
import torchmetrics
from torch import nn, optim
from torch.utils.data import TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, TrainerCallback

NUM_CLASSES = 3


def make_data(num_samples, seed):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.tensor([[2.0, 0.0], [-2.0, 1.0], [0.0, -2.0]])
    targets = torch.randint(0, NUM_CLASSES, (num_samples,), generator=generator)
    inputs = centres[targets] + 1.2 * torch.randn(num_samples, 2, generator=generator)
    return TensorDataset(inputs, targets)


class ClassificationMetricsCallback(TrainerCallback):
    def __init__(self, num_classes):
        self.metrics = torchmetrics.MetricCollection(
            {"accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)}
        )

    def _move_to_device(self, trainer):
        self.metrics.to(trainer.device)

    def on_training_run_start(self, trainer, **kwargs):
        self._move_to_device(trainer)

    def on_evaluation_run_start(self, trainer, **kwargs):
        self._move_to_device(trainer)

    def on_eval_step_end(self, trainer, batch, batch_output, **kwargs):
        preds = batch_output["model_outputs"].argmax(dim=-1)
        self.metrics.update(trainer.gather(preds), trainer.gather(batch[1]))

    def on_eval_epoch_end(self, trainer, **kwargs):
        metrics = self.metrics.compute()
        trainer.run_history.update_metric("accuracy", metrics["accuracy"].cpu())
        if trainer.run_config.is_world_process_zero:
            print(f"callback accuracy: {metrics['accuracy'].item():.4f}")
        self.metrics.reset()


class TrainerWithMetrics(Trainer):
    def __init__(self, num_classes, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.metrics = torchmetrics.MetricCollection(
            {"accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=num_classes)}
        )

    def training_run_start(self):
        super().training_run_start()
        self.metrics.to(self.device)

    def calculate_eval_batch_loss(self, batch):
        batch_output = super().calculate_eval_batch_loss(batch)
        preds = batch_output["model_outputs"].argmax(dim=-1)
        # torchmetrics syncs its states across processes in compute(): no gather here.
        self.metrics.update(preds, batch[1])
        return batch_output

    def eval_epoch_end(self):
        metrics = self.metrics.compute()
        self.run_history.update_metric("accuracy", metrics["accuracy"].cpu())
        self.metrics.reset()


def true_accuracy(model, dataset):
    inputs, targets = dataset.tensors
    with torch.no_grad():
        return (model.eval()(inputs).argmax(dim=-1) == targets).float().mean().item()


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, NUM_CLASSES))


def main():
    # 49 evaluation samples in batches of 8: on 2 processes 25 and 24, so 4 and 3 batches.
    train_dataset, eval_dataset = make_data(96, seed=1), make_data(49, seed=2)

    model = make_model()
    trainer = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        callbacks=(ClassificationMetricsCallback(num_classes=NUM_CLASSES), *DEFAULT_CALLBACKS),
    )
    trainer.train(
        train_dataset=train_dataset, eval_dataset=eval_dataset, num_epochs=2, per_device_batch_size=8
    )
    accuracy = trainer.run_history.get_latest_metric("accuracy")
    assert len(trainer.run_history.get_metric_values("accuracy")) == 2
    expected = true_accuracy(model, eval_dataset)
    assert abs(float(accuracy) - expected) < 1e-6, f"callback accuracy {float(accuracy)} != {expected}"

    # The original's evaluation-only script: a fresh Trainer, evaluate(), the same callback.
    fresh = Trainer(
        model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=None,
        callbacks=(ClassificationMetricsCallback(num_classes=NUM_CLASSES), *DEFAULT_CALLBACKS),
    )
    fresh.evaluate(dataset=eval_dataset, per_device_batch_size=8)
    evaluated = float(fresh.run_history.get_latest_metric("accuracy"))
    assert abs(evaluated - expected) < 1e-6, f"evaluate() accuracy {evaluated} != {expected}"

    model = make_model()
    trainer = TrainerWithMetrics(
        num_classes=NUM_CLASSES,
        model=model,
        loss_func=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
    )
    trainer.train(
        train_dataset=train_dataset, eval_dataset=eval_dataset, num_epochs=2, per_device_batch_size=8
    )
    subclass_accuracy = float(trainer.run_history.get_latest_metric("accuracy"))
    expected = true_accuracy(model, eval_dataset)
    assert abs(subclass_accuracy - expected) < 1e-6, f"subclass accuracy {subclass_accuracy} != {expected}"
    if trainer.run_config.is_world_process_zero:
        print(f"COMPAT OK metrics accuracy={expected:.4f} processes={trainer.run_config.num_processes}")


if __name__ == "__main__":
    main()
