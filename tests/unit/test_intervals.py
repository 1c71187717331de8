""" "Every N updates" is one rule: :func:`every`, and :meth:`StepMetrics.is_due`, which inlines it
for the loop's per-update check."""

from __future__ import annotations

import pytest

from pytorch_accelerated._internal.intervals import every
from pytorch_accelerated.step_metrics import StepMetrics


def test_every_n_is_true_on_the_multiples_of_n_only() -> None:
    assert [count for count in range(1, 13) if every(4, count)] == [4, 8, 12]
    assert [count for count in range(1, 4) if every(1, count)] == [1, 2, 3]


def test_every_none_is_never() -> None:
    assert not any(every(None, count) for count in range(0, 10))


@pytest.mark.parametrize("n", [None, 1, 2, 3, 5, 50])
def test_step_metrics_is_due_follows_the_same_rule_as_every(n: int | None) -> None:
    metrics = StepMetrics()
    if n is not None:
        metrics.request(n)
    assert [metrics.is_due(step) for step in range(0, 120)] == [every(n, step) for step in range(0, 120)]
