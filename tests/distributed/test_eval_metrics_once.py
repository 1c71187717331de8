"""Metrics computed the documented ways give on 2 and 3 processes what they give on 1.

One launch each on 1, 2 and 3 processes (``workers/eval_metrics_once.py``) evaluates every case
of :data:`CASES` (data-set sizes 1, 2, 3, 31, 64, 101; batch sizes 1, 3, 5) with the recipe's
``AccuracyCallback`` (docs/recipes/metrics.md), the article's ``MetricCollection`` callback, a
Trainer subclass updating a metric after ``super().calculate_eval_batch_loss``, a ``MeanMetric``
of correct predictions, ``gather_for_metrics`` and ``gather`` in ``on_eval_step_end``, and
``predict()``; then, on 2 and 3 processes, a model that cannot take a batch of zero rows. 31 and 64 samples have the shape of 10,001 samples on 8 processes: the last
round leaves all processes but the first one sample short. The 1-process values are checked
against plain torchmetrics over the whole data set.
"""

from __future__ import annotations

import json
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from tests.launch import WorkerRun, load_worker_module, start_workers

CASES = [[1, 1], [2, 3], [3, 1], [3, 5], [31, 1], [64, 3], [101, 1], [101, 5]]
PROCESSES = (1, 2, 3)


@pytest.fixture(scope="module")
def worker() -> ModuleType:
    return load_worker_module("eval_metrics_once")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[int, WorkerRun]:
    cases = json.dumps(CASES)
    groups = {
        nproc: start_workers(
            "eval_metrics_once.py",
            tmp_path_factory.mktemp(f"eval_metrics_once_{nproc}"),
            "--cases",
            cases,
            "--then-fail-on-zero-rows",
            "1",
            nproc=nproc,
            timeout_s=400,
            expect_success=nproc == 1,
        )
        for nproc in PROCESSES
    }
    return {nproc: group.wait() for nproc, group in groups.items()}


@pytest.fixture(scope="module")
def results(launched: dict[int, WorkerRun]) -> dict[int, list[dict[str, Any]]]:
    return {nproc: run.results for nproc, run in launched.items()}


def test_the_workers_ran_on_1_2_and_3_processes(results: dict[int, list[dict[str, Any]]]) -> None:
    assert {nproc: [rank["num_processes"] for rank in ranks] for nproc, ranks in results.items()} == {
        nproc: [nproc] * nproc for nproc in PROCESSES
    }


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_model_that_cannot_take_zero_rows_fails_with_a_note_naming_the_fix(
    launched: dict[int, WorkerRun], nproc: int
) -> None:
    run = launched[nproc]
    assert run.returncode != 0, run.describe()
    assert "cannot reshape tensor of 0 elements" in run.output, run.describe()
    assert "Raised on a padding batch of zero rows: process 1 has no sample left" in run.output
    assert "torch.flatten(x, 1) instead of x.view(x.size(0), -1)" in run.output


@pytest.mark.parametrize(("num_samples", "batch_size"), CASES)
def test_one_process_gives_plain_torchmetrics_values_over_the_whole_set(
    results: dict[int, list[dict[str, Any]]], worker: ModuleType, num_samples: int, batch_size: int
) -> None:
    from torchmetrics.functional.classification import (
        multiclass_accuracy,
        multiclass_precision,
        multiclass_recall,
    )

    data = worker.ClassificationData(num_samples)
    with torch.no_grad():
        logits = worker.make_classifier()(data.x)
    preds, classes = logits.argmax(-1), worker.NUM_CLASSES
    expected = {
        "evaluation_loss": nn.functional.cross_entropy(logits, data.y).item(),
        "correct_fraction": (preds == data.y).float().mean().item(),
    }
    if num_samples > 1:  # on 1 process every case >= 1 sample ran the accuracy metrics too
        accuracy = multiclass_accuracy(preds, data.y, classes).item()
        expected |= {
            "accuracy": accuracy,
            "subclass_accuracy": accuracy,
            "article_accuracy": accuracy,
            "article_precision": multiclass_precision(preds, data.y, classes).item(),
            "article_recall": multiclass_recall(preds, data.y, classes).item(),
        }
    found = results[1][0][f"{num_samples}_{batch_size}"]
    if num_samples == 1:
        found = {**found, "metrics": {key: found["metrics"][key] for key in expected}}
    assert found["metrics"] == pytest.approx(expected, rel=1e-6)
    torch.testing.assert_close(torch.tensor(found["predict"]), logits)


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize(("num_samples", "batch_size"), CASES)
def test_every_metric_equals_the_one_process_value(
    results: dict[int, list[dict[str, Any]]], nproc: int, num_samples: int, batch_size: int
) -> None:
    case = f"{num_samples}_{batch_size}"
    one = results[1][0][case]["metrics"]
    for rank in results[nproc]:
        metrics = rank[case]["metrics"]
        assert metrics == pytest.approx({key: one[key] for key in metrics}, rel=1e-6)
        # The accuracy metrics ran where every process has a sample (see the worker).
        assert len(metrics) == (2 if num_samples < nproc else 7)


def test_three_samples_in_batches_of_1_on_2_processes_is_two_thirds_as_on_one(
    results: dict[int, list[dict[str, Any]]],
) -> None:
    # The issue's case: 2 of 3 right gave 0.75 when process 1's padding batch repeated sample 1.
    assert [rank["3_1"]["metrics"]["correct_fraction"] for rank in results[2]] == pytest.approx([2 / 3] * 2)


@pytest.mark.parametrize("nproc", [2, 3])
@pytest.mark.parametrize(("num_samples", "batch_size"), CASES)
def test_on_eval_step_end_sees_and_gathers_each_sample_once_in_step(
    results: dict[int, list[dict[str, Any]]],
    worker: ModuleType,
    nproc: int,
    num_samples: int,
    batch_size: int,
) -> None:
    case = f"{num_samples}_{batch_size}"
    ranks = [rank[case] for rank in results[nproc]]
    # Every process fires the same number of batch events (so the gathers in them line up) ...
    assert len({tuple(rank["events"]) for rank in ranks}) == 1
    # ... and its batches hold each sample once over the processes.
    assert sum(rank["rows"] for rank in ranks) == num_samples
    data = worker.ClassificationData(num_samples)
    with torch.no_grad():
        preds = worker.make_classifier()(data.x).argmax(-1)
    for rank in ranks:
        assert sorted(rank["indices"]) == list(range(num_samples))
        assert rank["gathered_predictions"] == preds[rank["indices"]].tolist()
        torch.testing.assert_close(
            torch.tensor(rank["predict"]), torch.tensor(results[1][0][case]["predict"])
        )
