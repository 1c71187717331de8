"""The epoch's training loss over a stream on 2 processes, against the 1-process value: where the
stream's samples fill every round of processes x batch size it is the same; where they do not,
accelerate completes the last round with the stream's first sample, which is trained on (and so
counted) twice, as docs/inside-the-trainer.md ("Streams") says. Also a map-style set of the same
length, for comparison."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.launch import launch_workers


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    found = {}
    for nproc in (1, 2):
        (result, *_) = launch_workers(
            "stream_loss.py", tmp_path_factory.mktemp(f"p{nproc}"), nproc=nproc
        ).results
        assert result["num_processes"] == nproc
        found[nproc] = result
    return found


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def test_one_process_counts_each_sample_once(runs: dict[int, dict[str, Any]]) -> None:
    per_sample = runs[1]["per_sample13"]
    assert runs[1]["stream12"] == pytest.approx(mean(runs[1]["per_sample12"]), rel=1e-6)
    assert runs[1]["stream13"] == pytest.approx(mean(per_sample), rel=1e-6)
    assert runs[1]["map13"] == pytest.approx(mean(per_sample), rel=1e-6)


def test_two_processes_equal_one_where_the_stream_fills_every_round(runs: dict[int, dict[str, Any]]) -> None:
    assert runs[2]["stream12"] == pytest.approx(runs[1]["stream12"], rel=1e-6)


def test_two_processes_count_the_first_sample_again_where_the_last_round_is_completed(
    runs: dict[int, dict[str, Any]],
) -> None:
    per_sample = runs[1]["per_sample13"]
    assert runs[2]["stream13"] == pytest.approx(mean([*per_sample, per_sample[0]]), rel=1e-6)
    assert runs[2]["stream13"] != pytest.approx(runs[1]["stream13"], rel=1e-6)


def test_drop_last_trains_and_counts_only_the_whole_rounds(runs: dict[int, dict[str, Any]]) -> None:
    # 13 samples in rounds of 2 processes x 2: the 3 whole rounds (12 samples), each once.
    assert runs[2]["stream13_drop_last"] == pytest.approx(mean(runs[1]["per_sample13"][:12]), rel=1e-6)


def test_a_map_style_set_of_the_same_length(runs: dict[int, dict[str, Any]]) -> None:
    """Recorded for comparison: accelerate completes its last round too (see the docs)."""
    per_sample = runs[1]["per_sample13"]
    print(f"map13 on 2 processes: {runs[2]['map13']:.6f}, on 1: {mean(per_sample):.6f}")
    assert runs[2]["map13"] != pytest.approx(mean(per_sample), rel=1e-6)
