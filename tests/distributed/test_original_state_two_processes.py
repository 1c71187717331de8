"""Training states of 0.1.61 (docs/migration.md) on 2 real processes: a training state written by pytorch-accelerated 0.1.61
(accelerate's save_state, one random_states_{rank}.pkl per rank, trainer_metadata.pt) is loaded
and resumed; each rank gets its own RNG states back (see workers/original_state.py)."""

from __future__ import annotations

from pathlib import Path

from tests.launch import launch_workers


def test_an_original_state_resumes_on_two_processes_with_each_ranks_rngs(tmp_path: Path) -> None:
    run = launch_workers("original_state.py", tmp_path)
    for result in run.results:
        assert result["loaded"] == {"current_epoch": 2, "global_step": 4}
        assert result["rng_restored"], run.describe()
        # 32 samples, batch 4, 2 processes: 4 updates per epoch; epoch 2 starts after 4 updates.
        assert (result["steps_per_epoch"], result["global_step"], result["scheduler_updates"]) == (4, 12, 12)
        assert any("start of epoch 2, after 4 updates" in message for message in result["warnings"])
        assert not any("RNGs are not restored" in message for message in result["warnings"])
    assert run.results[0]["weight_sum"] == run.results[1]["weight_sum"]
