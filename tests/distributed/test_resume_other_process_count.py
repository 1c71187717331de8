"""A training state saved mid-epoch by 2 real processes (gloo on CPU), resumed on 1 and on 4.

``workers/reshard_worker.py`` trains on 28 samples that return their index, per-device batch 2:
the 2-process run saves after batch 3 of the first epoch (12 samples of the epoch's order
seen) and stops; two runs then resume from that state at the same time, on 1 process and on 4
(where 12 is not a multiple of the new global batch of 8). Each must load the saved weights
and optimizer state exactly and visit every sample not yet seen in that epoch exactly once.
Settings whose position does not map are refused before training (in this process).

``resume_from="auto"`` on another number of processes keeps the saved global batch: a 2-process run
of ``workers/auto_resume.py`` (per-device batch 4, 8 samples per update) killed after its state of
update 4, relaunched on 1 process, accumulates 2 batches per update and ends where the uninterrupted
2-process run ends, whether the batch is given as ``per_device_batch_size`` or as
``train_dataloader_kwargs={"batch_size": 4}``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import IterableDataset, SequentialSampler

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import StopTrainingError, TrainerCallback
from tests.launch import WorkerRun, launch_workers, start_workers

NUM_SAMPLES = 28  # as in workers/reshard_worker.py
SAVE_AT = 3  # batches per process: 3 x 2 processes x 2 = 12 samples seen
#: How workers/auto_resume.py is given its per-device batch of 4 (3 epochs of 6 updates on 2 processes).
BATCH_GIVEN = {"per_device_batch_size": (), "train_dataloader_kwargs": ("--batch-in-kwargs", "1")}
AUTO_RESUME_UPDATES = 18


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, WorkerRun]:
    """The saving run (key 2), then the resumed runs on 1 and 4 processes, started together."""
    root = tmp_path_factory.mktemp("reshard")
    state = str(root / "state")
    saved = launch_workers(
        "reshard_worker.py", root / "save", "--phase", "save", "--state-dir", state, "--save-at", str(SAVE_AT)
    )
    groups = {
        nproc: start_workers(
            "reshard_worker.py",
            root / f"resume{nproc}",
            "--phase",
            "resume",
            "--state-dir",
            state,
            nproc=nproc,
        )
        for nproc in (1, 4)
    }
    return {2: saved, **{nproc: group.wait() for nproc, group in groups.items()}}


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> dict[str, WorkerRun]:
    """The uninterrupted 2-process run ("plain"), and for each way of giving the batch, the 2-process
    run SIGKILLed at update 5 (its newest state: step_4) relaunched on 1 process (by that name)."""
    root = tmp_path_factory.mktemp("elastic_batch")
    script = "auto_resume.py"
    plain = start_workers(script, root / "plain", "--save-dir", str(root / "plain_states"))
    killed = {
        how: start_workers(
            script,
            root / f"killed-{how}",
            *("--save-dir", str(root / f"states-{how}"), "--kill-at-update", "5", *args),
            expect_success=False,
        )
        for how, args in BATCH_GIVEN.items()
    }
    runs = {"plain": plain.wait(), **{f"killed-{how}": group.wait() for how, group in killed.items()}}
    relaunched = {
        how: start_workers(script, root / how, "--save-dir", str(root / f"states-{how}"), *args, nproc=1)
        for how, args in BATCH_GIVEN.items()
    }
    return {**runs, **{how: group.wait() for how, group in relaunched.items()}}


@pytest.mark.parametrize("how", list(BATCH_GIVEN))
def test_an_auto_resume_on_1_process_keeps_the_global_batch_and_ends_where_the_2_process_run_ends(
    elastic: dict[str, WorkerRun], how: str
) -> None:
    killed, resumed, plain = elastic[f"killed-{how}"], elastic[how], elastic["plain"].results[0]
    assert killed.returncode != 0 and killed.results == [None, None], killed.describe()
    result = resumed.results[0]
    assert (result["num_processes"], result["accumulation"]) == (1, 2), resumed.describe()
    assert "gradient_accumulation_steps 2 instead of 1 keeps its global batch of 8 samples" in resumed.output
    assert result["global_step"] == plain["global_step"] == AUTO_RESUME_UPDATES
    for name, weights in plain["weights"].items():  # the same means, summed in another order
        torch.testing.assert_close(torch.tensor(result["weights"][name]), torch.tensor(weights))


def seen_in_first_epoch(run: WorkerRun) -> list[int]:
    return [index for result in run.results for index in result["seen"].get("0", [])]


@pytest.mark.parametrize("nproc", [1, 4])
def test_weights_and_optimizer_state_are_those_saved_on_2_processes(
    runs: dict[int, WorkerRun], nproc: int
) -> None:
    saved = runs[2].results[0]["saved"]
    for result in runs[nproc].results:
        assert result["loaded"]["weights"] == saved["weights"]
        assert result["loaded"]["optimizer"] == saved["optimizer"]
        assert result["loaded"]["optimizer"], "AdamW has state after 3 updates"


@pytest.mark.parametrize("nproc", [1, 4])
def test_every_sample_not_seen_before_the_save_is_seen_exactly_once_in_the_rest_of_the_epoch(
    runs: dict[int, WorkerRun], nproc: int
) -> None:
    before = seen_in_first_epoch(runs[2])
    after = seen_in_first_epoch(runs[nproc])
    assert len(before) == len(set(before)) == SAVE_AT * 2 * 2
    assert Counter(after) == Counter(set(range(NUM_SAMPLES)) - set(before))


@pytest.mark.parametrize("nproc, batch_index, global_step", [(1, 6, 3 + 8 + 14), (4, 1, 3 + 2 + 4)])
def test_position_and_step_counters_map_and_the_run_completes(
    runs: dict[int, WorkerRun], nproc: int, batch_index: int, global_step: int
) -> None:
    # 12 samples seen: batch 6 of 2 on 1 process; on 4 (8 per batch index), batch 1 of an
    # order that starts after 4 samples. The 3 updates made are kept; then 8 (2) updates finish
    # the epoch and 14 (4) make the next one.
    for result in runs[nproc].results:
        assert result["loaded"]["progress"] == {
            "epoch": 0,
            "global_step": 3,
            "batch_index": batch_index,
            "epoch_step": 3,
        }
        assert result["final_progress"] == {
            "epoch": 2,
            "global_step": global_step,
            "batch_index": 0,
            "epoch_step": 0,
        }
        assert result["num_processes"] == nproc
    second_epoch = Counter(index for result in runs[nproc].results for index in result["seen"]["1"])
    assert set(second_epoch) == set(range(NUM_SAMPLES))  # the next epoch is whole again


@pytest.mark.parametrize("nproc", [1, 4])
def test_the_epochs_loss_so_far_is_summed_into_rank_0(runs: dict[int, WorkerRun], nproc: int) -> None:
    saved_total = [
        sum(values) for values in zip(*(r["saved"]["loss_share"] for r in runs[2].results), strict=True)
    ]
    shares = [result["loaded"]["loss_share"] for result in runs[nproc].results]
    assert shares[0] == pytest.approx(saved_total, rel=1e-6)
    assert saved_total[1] == 12
    assert all(share == [0.0, 0.0] for share in shares[1:])


def test_each_rank_gets_its_own_rng_states_and_new_ranks_distinct_ones(runs: dict[int, WorkerRun]) -> None:
    saved_draws = [result["first_draw"] for result in runs[2].results]
    assert runs[1].results[0]["first_draw"] == saved_draws[0]
    draws = [result["first_draw"] for result in runs[4].results]
    assert draws[:2] == saved_draws
    assert len({*draws[2:], *saved_draws}) == len(set(saved_draws)) + 2  # ranks 2, 3: new streams


# ---------------------------------------------------------------------------- refused before training


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        data = torch.randn(NUM_SAMPLES, 5, generator=torch.Generator().manual_seed(0))
        for index in range(NUM_SAMPLES):
            yield data[index], data[index, :2], index


class Events(TrainerCallback):
    def __init__(self) -> None:
        self.fired: list[str] = []

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.fired.append("on_training_run_start")


@pytest.mark.parametrize(
    "data, kwargs, reason",
    [
        (
            "map",
            {"sampler": SequentialSampler(range(NUM_SAMPLES))},
            "train_dataloader_kwargs gives a custom sampler (SequentialSampler)",
        ),
        ("map", {"shuffle": False}, "train_dataloader_kwargs has shuffle=False"),
        ("stream", {}, "the training set (Stream) is a stream (an IterableDataset)"),
        ("short", {}, "saved mid-epoch over a training set of 28 samples, but this run's has 20"),
    ],
    ids=["custom-sampler", "no-shuffle", "iterable-dataset", "other-training-set"],
)
def test_settings_whose_position_does_not_map_are_refused_naming_them_before_training(
    runs: dict[int, WorkerRun],
    worker_common: ModuleType,
    tmp_path: Path,
    data: str,
    kwargs: dict[str, Any],
    reason: str,
) -> None:
    model = worker_common.make_mlp(seed=3)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    events = Events()
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-2), callbacks=(events,)
    )
    datasets = {
        "map": worker_common.RegressionDataset(NUM_SAMPLES, seed=1, with_index=True),
        "stream": Stream(),
        "short": worker_common.RegressionDataset(20, seed=1, with_index=True),
    }
    state = runs[2].out_dir.parent / "state"
    with pytest.raises(ValueError) as error:
        trainer.train(
            datasets[data],
            num_epochs=2,
            per_device_batch_size=2,
            train_dataloader_kwargs=kwargs,
            resume_from=state,
        )
    message = str(error.value)
    assert reason in message
    if data != "short":
        assert "Cannot resume" in message and "mid-epoch on other settings" in message
        assert (
            "saved with 2 process(es) x per_device_batch_size 2 x gradient_accumulation_steps 1, resumed with 1 x 2 x 1"
            in message
        )
        assert "Resume with the saved settings (2 process(es)" in message
    assert events.fired == []
    assert all(torch.equal(value, before[name]) for name, value in model.state_dict().items())


# ---------------------------------------------------------------------------- a resumed epoch saved again


class SeenThenSave(TrainerCallback):
    """Records the sample indices of the first epoch; saves after batch ``save_at`` and stops."""

    def __init__(self, save_to: Path | None = None, save_at: int = 0) -> None:
        self.save_to, self.save_at = save_to, save_at
        self.seen: list[int] = []

    def on_train_step_end(self, trainer: Any, batch: Any, **kwargs: Any) -> None:
        if trainer.progress.epoch == 0:
            self.seen.extend(batch[2].tolist())
        if self.save_to is not None and trainer.progress.batch_index == self.save_at:
            trainer.save_training_state(self.save_to)
            raise StopTrainingError("saved")


def resume_in_this_process(
    worker_common: ModuleType, state: Path, batch_size: int, recorder: SeenThenSave
) -> Trainer:
    model = worker_common.make_mlp(seed=0)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-2), callbacks=(recorder,)
    )
    with pytest.warns(UserWarning, match="mid-epoch: it was saved with"):
        trainer.train(
            worker_common.RegressionDataset(NUM_SAMPLES, seed=1, with_index=True),
            num_epochs=1,
            per_device_batch_size=batch_size,
            resume_from=state,
            seed=7,
        )
    return trainer


@pytest.mark.parametrize("batch_size", [8, 2], ids=["same-settings-again", "other-batch-size"])
def test_a_state_saved_in_a_resumed_epoch_maps_again_with_every_sample_once(
    runs: dict[int, WorkerRun], worker_common: ModuleType, tmp_path: Path, batch_size: int
) -> None:
    # 2 x 2 -> 1 x 8: batch 1 of an order starting after 4 samples; saved after batch 2 (20 seen).
    first = SeenThenSave(tmp_path / "again", save_at=2)
    resume_in_this_process(worker_common, runs[2].out_dir.parent / "state", 8, first)
    assert len(first.seen) == 8
    rest = SeenThenSave()
    trainer = resume_in_this_process(worker_common, tmp_path / "again", batch_size, rest)
    assert Counter(seen_in_first_epoch(runs[2]) + first.seen + rest.seen) == Counter(range(NUM_SAMPLES))
    assert trainer.progress.global_step == 3 + 1 + len(rest.seen) // batch_size


def test_without_the_shuffle_sampler_the_same_samples_per_batch_index_still_resume_at_the_saved_batch(
    runs: dict[int, WorkerRun], worker_common: ModuleType
) -> None:
    # 2 processes x 2 saved, 1 x 4 resumed: batch 3 holds the same 4 samples of the order.
    model = worker_common.make_mlp(seed=0)
    positions: list[int] = []

    class RecordStart(TrainerCallback):
        def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
            positions.append(trainer.progress.batch_index)

    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.AdamW(model.parameters(), lr=1e-2), callbacks=(RecordStart(),)
    )
    with pytest.warns(UserWarning, match="resumed with 1 x 4 x 1. 12 samples"):
        trainer.train(
            worker_common.RegressionDataset(NUM_SAMPLES, seed=1, with_index=True),
            num_epochs=1,
            per_device_batch_size=4,
            train_dataloader_kwargs={"shuffle": False},
            resume_from=runs[2].out_dir.parent / "state",
        )
    assert positions == [SAVE_AT]
    assert trainer.progress.global_step == 3 + (7 - SAVE_AT)  # 7 batches of 4 per epoch
