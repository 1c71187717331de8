"""The step metrics are right: checked against plain oracles computed from what each batch gave.

A recording callback keeps every batch's loss and weight (``batch_size``, or
``num_items_in_batch``) and the update it belongs to; the oracle of ``train_loss`` at a point is
their weighted mean over the batches since the previous point. The other metrics are checked
against torch (the gradient norm), the optimizer's learning rates, and the relations between
the metrics of one point (samples = samples_per_second x step_time_seconds x updates).
Resume: a run resumed from a state saved at a step where no point is due, or at an epoch end,
records bitwise the same series as the uninterrupted run.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import AskForStepMetrics, make_regression_data
from torch import nn
from torch.utils.data import Dataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback

NUM_SAMPLES, BATCH_SIZE = 23, 4  # 6 batches per epoch, the last one of 3 samples


class BatchRecorder(TrainerCallback):
    """Keeps ``(update, loss, weight)`` for every batch (the update it counts towards) and the
    metrics of every ``on_step_metrics``."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, float, float]] = []
        self.points: dict[int, dict[str, float]] = {}

    def on_train_step_end(
        self, trainer: Trainer, batch_output: Any = None, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        update = trainer.progress.global_step + (0 if is_update_step else 1)
        weight = batch_output.get("num_items_in_batch", batch_output["batch_size"])
        self.batches.append((update, float(batch_output["loss"].detach()), float(weight)))

    def on_step_metrics(
        self, trainer: Trainer, step: int = 0, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        self.points[step] = dict(metrics or {})

    def loss_oracle(self) -> dict[int, float]:
        """The weighted mean loss of the batches since the previous point, at each point."""
        oracle, previous = {}, 0
        for step in sorted(self.points):
            interval = [(loss, weight) for update, loss, weight in self.batches if previous < update <= step]
            oracle[step] = sum(loss * weight for loss, weight in interval) / sum(
                weight for _, weight in interval
            )
            previous = step
        return oracle

    def samples_between_points(self) -> dict[int, tuple[float, int]]:
        """The weight summed, and the updates made, since the previous point, at each point."""
        counts, previous = {}, 0
        for step in sorted(self.points):
            counts[step] = (
                sum(w for update, _, w in self.batches if previous < update <= step),
                step - previous,
            )
            previous = step
        return counts


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))


def run(
    every: int,
    *extra_callbacks: TrainerCallback,
    trainer_class: type[Trainer] = Trainer,
    optimizer_fn: Any = None,
    dataset: Any = None,
    **train_kwargs: Any,
) -> tuple[Trainer, BatchRecorder]:
    recorder = BatchRecorder()
    model = make_model()
    optimizer = (
        optimizer_fn(model) if optimizer_fn else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    )
    trainer = trainer_class(
        model, nn.MSELoss(), optimizer, callbacks=(AskForStepMetrics(every), *extra_callbacks, recorder)
    )
    train_kwargs.setdefault("num_epochs", 3)
    trainer.train(
        dataset or make_regression_data(NUM_SAMPLES), per_device_batch_size=BATCH_SIZE, **train_kwargs
    )
    return trainer, recorder


# ---------------------------------------------------------------------------- the training loss


@pytest.mark.parametrize(
    ("every", "accumulation"),
    [(4, 1), (1, 1), (3, 4)],
    ids=["every_4", "every_update", "accumulation_4_every_3"],
)
def test_train_loss_is_the_weighted_mean_of_the_batches_since_the_previous_point(
    every: int, accumulation: int
) -> None:
    # 6 batches per epoch (the last of 3 samples): with accumulation 4, windows of 4 and 2
    # batches, 2 updates per epoch. Points fall mid-epoch and span epoch boundaries.
    trainer, recorder = run(every, gradient_accumulation_steps=accumulation)
    updates = 3 * math.ceil(6 / accumulation)
    assert sorted(recorder.points) == list(range(every, updates + 1, every))
    oracle = recorder.loss_oracle()
    for step, expected in oracle.items():
        assert recorder.points[step]["train_loss"] == pytest.approx(expected, rel=1e-5), step
    history = trainer.run_history.get_step_metric_values("train_loss")
    assert history == [(step, recorder.points[step]["train_loss"]) for step in sorted(recorder.points)]


def test_the_series_are_in_the_run_history_under_the_metric_names() -> None:
    trainer, recorder = run(4)
    names = set(trainer.run_history.get_step_metric_names())
    assert {"train_loss", "lr", "samples_per_second", "step_time_seconds", "data_wait_fraction"} <= names
    assert not names & {
        "grad_norm",
        "tokens_per_second",
        "peak_memory_mb",
        "lr_group_0",
    }  # not asked for / no CUDA
    for name in names:
        assert trainer.run_history.get_step_metric_values(name) == [
            (s, m[name]) for s, m in sorted(recorder.points.items())
        ]


# ---------------------------------------------------------------------------- learning rates


def test_two_param_groups_give_one_learning_rate_each_as_scheduled() -> None:
    def two_groups(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(
            [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters(), "lr": 0.01}]
        )

    def schedule(optimizer: torch.optim.Optimizer) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 0.9**update)

    _, recorder = run(4, optimizer_fn=two_groups, create_scheduler_fn=schedule)
    for step, metrics in recorder.points.items():  # the rate of the next update, after `step` scheduler steps
        assert metrics["lr_group_0"] == pytest.approx(0.1 * 0.9**step, rel=1e-12)
        assert metrics["lr_group_1"] == pytest.approx(0.01 * 0.9**step, rel=1e-12)
        assert "lr" not in metrics


# ---------------------------------------------------------------------------- gradient norm


class RecordsGradientNorms(Trainer):
    """Records the total gradient norm after each backward pass (each is an update here)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.norms: dict[int, float] = {}

    def backward_step(self, loss: torch.Tensor) -> None:
        super().backward_step(loss)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.norms[self.progress.global_step + 1] = float(
            torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
        )


@pytest.mark.parametrize("max_grad_norm", [0.01, None], ids=["clipping", "log_grad_norm"])
def test_grad_norm_is_the_total_norm_before_clipping(max_grad_norm: float | None) -> None:
    class AskForGradNorm(TrainerCallback):
        def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
            trainer.run_state.step_metrics.request(4, grad_norm=max_grad_norm is None)

    trainer, recorder = run(
        4, AskForGradNorm(), trainer_class=RecordsGradientNorms, max_grad_norm=max_grad_norm
    )
    assert recorder.points
    for step, metrics in recorder.points.items():
        assert metrics["grad_norm"] == pytest.approx(trainer.norms[step], rel=1e-5)
        if max_grad_norm is not None:
            assert metrics["grad_norm"] > max_grad_norm  # the norm before clipping, not after


def test_no_grad_norm_without_clipping_by_norm_or_asking() -> None:
    _, recorder = run(4, gradient_clip_value=0.5)
    assert recorder.points and all("grad_norm" not in metrics for metrics in recorder.points.values())


# ---------------------------------------------------------------------------- throughput


def check_rates(recorder: BatchRecorder) -> None:
    for step, (samples, updates) in recorder.samples_between_points().items():
        metrics = recorder.points[step]
        assert metrics["samples_per_second"] > 0
        assert metrics["samples_per_second"] * metrics["step_time_seconds"] * updates == pytest.approx(
            samples, rel=1e-9
        )
        assert 0 <= metrics["data_wait_fraction"] <= 1


def test_samples_per_second_is_samples_over_step_time() -> None:
    _, recorder = run(4)
    check_rates(recorder)
    assert all("tokens_per_second" not in metrics for metrics in recorder.points.values())


class CountsItems(Trainer):
    """Batches give ``num_items_in_batch``: 3 items per sample (e.g. tokens)."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        output = super().calculate_train_batch_loss(batch)
        return {**output, "num_items_in_batch": torch.tensor(3 * output["batch_size"])}


def test_tokens_per_second_counts_num_items_in_batch() -> None:
    _, recorder = run(4, trainer_class=CountsItems)
    assert recorder.points
    for step, (items, updates) in recorder.samples_between_points().items():
        metrics = recorder.points[step]
        assert metrics["tokens_per_second"] == pytest.approx(3 * metrics["samples_per_second"], rel=1e-9)
        assert metrics["tokens_per_second"] * metrics["step_time_seconds"] * updates == pytest.approx(
            items, rel=1e-9
        )
    for step, expected in recorder.loss_oracle().items():  # weighted by items (3 x samples: the same mean)
        assert recorder.points[step]["train_loss"] == pytest.approx(expected, rel=1e-5)


class SlowDataset(Dataset):
    """Sleeps 5 ms in each ``__getitem__``: the loop mostly waits for data."""

    def __init__(self) -> None:
        self.data = make_regression_data(16)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        time.sleep(0.005)
        return self.data[index]


def test_data_wait_fraction_is_large_when_loading_is_slow() -> None:
    _, recorder = run(2, dataset=SlowDataset(), num_epochs=1, train_dataloader_kwargs={"num_workers": 0})
    check_rates(recorder)
    assert [metrics["data_wait_fraction"] > 0.7 for metrics in recorder.points.values()] == [True, True]


# ---------------------------------------------------------------------------- resume


@pytest.mark.filterwarnings("ignore:The training state holds a state for the callback")
def test_a_resumed_run_records_bitwise_the_series_of_the_uninterrupted_run(tmp_path: Path) -> None:
    # 6 updates per epoch, a point every 5: step 7 and the end of epoch 1 (step 6) are saved
    # with a loss since the last point (steps 6-7, and 6) that the resumed run must carry on.
    saving = SaveTrainingStateCallback(
        str(tmp_path), save_every_n_epochs=1, save_every_n_steps=7, save_at_end=False, handle_signals=()
    )
    reference, _ = run(5, saving)
    expected = {name: reference.run_history.get_step_metric_values(name) for name in ("train_loss", "lr")}
    assert [step for step, _ in expected["train_loss"]] == [5, 10, 15]
    for state, step in (("step_7", 7), ("epoch_1", 6), ("step_14", 14)):
        resumed, recorder = run(5, resume_from=tmp_path / state)
        assert resumed.progress.global_step == 18
        for name, series in expected.items():
            assert resumed.run_history.get_step_metric_values(name) == series, (state, name)
        assert min(recorder.points) > step  # measured again after the resume, not copied
