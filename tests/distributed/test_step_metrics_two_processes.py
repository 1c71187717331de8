"""Step metrics over 2 real processes: one set of points, measured over both processes' batches.

The worker (``workers/step_metrics_worker.py``) records what each batch gave on each rank. The
oracle of a point's ``train_loss`` is the weighted mean over the batches of both ranks since
the previous point (what one process training on the same global batches would compute);
``samples_per_second`` counts the samples of both processes.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.launch import launch_workers


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    results = launch_workers(
        "step_metrics_worker.py", tmp_path_factory.mktemp("step_metrics"), nproc=2
    ).results
    assert [result["world_size"] for result in results] == [2, 2]
    return results


def intervals(ranks: list[dict[str, Any]]) -> dict[int, list[tuple[float, float]]]:
    """Each point's ``(loss, batch_size)`` of every batch of both ranks since the previous point."""
    steps = [step for step, _ in ranks[0]["points"]]
    batches = [batch for result in ranks for batch in result["batches"]]
    return {
        step: [(loss, size) for update, loss, size in batches if previous < update <= step]
        for previous, step in zip([0, *steps], steps, strict=False)
    }


def test_every_rank_measures_the_same_points(ranks: list[dict[str, Any]]) -> None:
    assert (
        ranks[0]["global_step"] == ranks[1]["global_step"] == 10
    )  # 2 epochs of ceil(ceil(27 / 3) / 2) updates
    assert [step for step, _ in ranks[0]["points"]] == [3, 6, 9]
    assert [m["train_loss"] for _, m in ranks[0]["points"]] == [
        m["train_loss"] for _, m in ranks[1]["points"]
    ]
    assert ranks[0]["history"] == [[step, m["train_loss"]] for step, m in ranks[0]["points"]]


def test_train_loss_is_the_mean_over_both_processes_batches(ranks: list[dict[str, Any]]) -> None:
    for (step, metrics), (_, batches) in zip(
        ranks[0]["points"], sorted(intervals(ranks).items()), strict=True
    ):
        expected = sum(loss * size for loss, size in batches) / sum(size for _, size in batches)
        assert metrics["train_loss"] == pytest.approx(expected, rel=1e-5), step
        # Not one rank's own mean: the two ranks' batches differ.
        own = [(loss, size) for update, loss, size in ranks[0]["batches"] if step - 3 < update <= step]
        assert metrics["train_loss"] != pytest.approx(
            sum(loss * size for loss, size in own) / sum(size for _, size in own), rel=1e-5
        )


def test_samples_per_second_counts_the_samples_of_both_processes(ranks: list[dict[str, Any]]) -> None:
    previous = 0
    for (step, metrics), (_, batches) in zip(
        ranks[0]["points"], sorted(intervals(ranks).items()), strict=True
    ):
        samples = sum(size for _, size in batches)
        rate = metrics["samples_per_second"] * metrics["step_time_seconds"] * (step - previous)
        assert rate == pytest.approx(samples, rel=1e-9)
        assert samples == 2 * sum(
            size for update, _, size in ranks[0]["batches"] if previous < update <= step
        )
        previous = step
