"""Metrics computed the documented ways, on data sets that do not split evenly over the processes.

For each ``[num_samples, batch_size]`` of ``--cases`` one ``evaluate()`` runs with, at once: the
``AccuracyCallback`` of docs/recipes/metrics.md, the article's ``ClassificationMetricsCallback``
(a torchmetrics ``MetricCollection`` moved to the device at run start), a Trainer subclass that
updates a metric in ``calculate_eval_batch_loss`` after ``super()``, a callback that gathers the
batch's sample indices and predictions in ``on_eval_step_end``, and a ``MeanMetric`` of correct
predictions. Then ``predict()`` on the same data. With fewer samples than processes, a process
without a sample evaluates a batch of zero rows, which torchmetrics' classification metrics
refuse (their issue 2279): those cases run without the three accuracy metrics. Each rank writes
what it computed; the test compares it with the value of one process. With
``--then-fail-on-zero-rows 1`` on several processes it ends by evaluating 1 sample with a model
that cannot take zero rows, which fails (the test reads the message).
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassPrecision, MulticlassRecall

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback

NUM_FEATURES, NUM_CLASSES = 4, 3


def make_classifier() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(NUM_FEATURES, NUM_CLASSES)


class ClassificationData(Dataset):
    """``(x, label, index)``: random features; the classifier is right on samples 0, 1, 3, 4, ...
    and wrong on every third (2, 5, ...), so a sample counted twice or missed shows in accuracy."""

    def __init__(self, num_samples: int) -> None:
        generator = torch.Generator().manual_seed(num_samples)
        self.x = torch.randn(num_samples, NUM_FEATURES, generator=generator)
        with torch.no_grad():
            predicted = make_classifier()(self.x).argmax(-1)
        wrong = torch.arange(num_samples) % 3 == 2
        self.y = torch.where(wrong, (predicted + 1) % NUM_CLASSES, predicted)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return self.x[index], self.y[index], index


class AccuracyCallback(TrainerCallback):
    """docs/recipes/metrics.md's callback, as written there."""

    def __init__(self, num_classes: int) -> None:
        self.accuracy = MulticlassAccuracy(num_classes)

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: Any, **kwargs: Any) -> None:
        self.accuracy.to(trainer.device)
        preds = batch_output["model_outputs"].argmax(-1)
        self.accuracy.update(preds, batch[1])

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("accuracy", self.accuracy.compute().item())
        self.accuracy.reset()


class ClassificationMetricsCallback(TrainerCallback):
    """The article's callback: a collection of metrics, moved to the device when a run starts."""

    def __init__(self, num_classes: int) -> None:
        self.metrics = MetricCollection(
            {
                "accuracy": MulticlassAccuracy(num_classes),
                "precision": MulticlassPrecision(num_classes),
                "recall": MulticlassRecall(num_classes),
            }
        )

    def _move_to_device(self, trainer: Any) -> None:
        self.metrics.to(trainer.device)

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self._move_to_device(trainer)

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self._move_to_device(trainer)

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: Any, **kwargs: Any) -> None:
        self.metrics.update(batch_output["model_outputs"], batch[1])

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        for name, value in self.metrics.compute().items():
            trainer.run_history.update_metric(f"article_{name}", value.item())
        self.metrics.reset()


class CorrectFraction(TrainerCallback):
    """A ``MeanMetric`` of correct predictions: takes a batch of zero rows."""

    def __init__(self) -> None:
        self.correct = MeanMetric()

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: Any, **kwargs: Any) -> None:
        self.correct.to(trainer.device)
        self.correct.update((batch_output["model_outputs"].argmax(-1) == batch[1]).float())

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        trainer.run_history.update_metric("correct_fraction", self.correct.compute().item())
        self.correct.reset()


class GatherInEvalStepEnd(TrainerCallback):
    """Gathers each batch's sample indices and predictions, and counts the batch events."""

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.indices: list[int] = []
        self.gathered_predictions: list[int] = []
        self.starts, self.ends, self.rows = 0, 0, 0

    def on_eval_step_start(self, trainer: Any, **kwargs: Any) -> None:
        self.starts += 1

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: Any, **kwargs: Any) -> None:
        self.ends += 1
        self.rows += len(batch[2])
        self.indices += trainer.gather_for_metrics(batch[2]).tolist()
        self.gathered_predictions += trainer.gather(batch_output["model_outputs"].argmax(-1)).tolist()


class AccuracyTrainer(Trainer):
    """The article's (and the recipe's) subclass: the metric updated after ``super()``."""

    def __init__(self, *args: Any, num_classes: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accuracy = MulticlassAccuracy(num_classes)

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_eval_batch_loss(batch)
        self.accuracy.to(self.device)
        preds = output["model_outputs"].argmax(-1)
        self.accuracy.update(preds, batch[1])
        return output

    def eval_epoch_end(self) -> None:
        self.run_history.update_metric("subclass_accuracy", self.accuracy.compute().item())
        self.accuracy.reset()


def main() -> None:
    from common import parse_args, write_result  # here: the test imports this file for its factories

    args = parse_args({"cases": "[]", "then-fail-on-zero-rows": 0})
    recorder = GatherInEvalStepEnd()
    accuracies = (AccuracyCallback(NUM_CLASSES), ClassificationMetricsCallback(NUM_CLASSES))
    model, loss = make_classifier(), nn.CrossEntropyLoss()
    everything = AccuracyTrainer(
        model, loss, None, callbacks=(*accuracies, CorrectFraction(), recorder), num_classes=NUM_CLASSES
    )
    zero_rows_safe = Trainer(model, loss, None, callbacks=(CorrectFraction(), recorder))
    num_processes = dist.get_world_size() if dist.is_initialized() else 1
    result: dict[str, Any] = {"num_processes": num_processes}
    for num_samples, batch_size in json.loads(args.cases):
        dataset = ClassificationData(num_samples)
        trainer = everything if num_samples >= num_processes else zero_rows_safe
        metrics = trainer.evaluate(dataset, per_device_batch_size=batch_size)
        result[f"{num_samples}_{batch_size}"] = {
            "metrics": metrics,
            "indices": recorder.indices,
            "gathered_predictions": recorder.gathered_predictions,
            "events": [recorder.starts, recorder.ends],
            "rows": recorder.rows,
            "predict": trainer.predict(dataset, per_device_batch_size=batch_size).tolist(),
        }
    write_result(args.out, result)
    if args.then_fail_on_zero_rows and num_processes > 1:
        # 1 sample: process 1's padding batch of zero rows meets a model that cannot take it.
        Trainer(ViewModel(), loss, None, callbacks=()).evaluate(
            ClassificationData(1), per_device_batch_size=1
        )


class ViewModel(nn.Module):
    """A classifier whose forward cannot take zero rows (``view(x.size(0), -1)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = make_classifier()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.view(x.size(0), -1))


if __name__ == "__main__":
    main()
