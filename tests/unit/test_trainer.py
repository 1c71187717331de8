"""Training semantics on one real process, each compared with a plain-PyTorch oracle."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.data import ReproducibleShuffleSampler
from tests.helpers import IndexedDataset, make_linear_model, make_regression_data, make_trainer


def shuffled_batches(num_samples: int, batch_size: int, epoch: int, seed: int = 42) -> list[list[int]]:
    sampler = ReproducibleShuffleSampler(num_samples, seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    return [order[i : i + batch_size] for i in range(0, num_samples, batch_size)]


def oracle_train(
    model: nn.Module,
    data: Any,
    num_epochs: int,
    batch_size: int,
    accumulation: int,
    lr: float,
    max_grad_norm: float | None = None,
) -> tuple[nn.Module, list[float]]:
    """A hand-written loop: each update's gradient is the mean over the samples of its window."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x_all, y_all = data.tensors
    epoch_losses = []
    for epoch in range(num_epochs):
        batches = shuffled_batches(len(data), batch_size, epoch)
        loss_sum, count = 0.0, 0
        for start in range(0, len(batches), accumulation):
            window = batches[start : start + accumulation]
            window_samples = sum(len(b) for b in window)
            for indices in window:
                per_sample = (model(x_all[indices]) - y_all[indices]).pow(2).squeeze(1)
                loss_sum += per_sample.sum().item()
                count += len(indices)
                (per_sample.sum() / window_samples).backward()
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        epoch_losses.append(loss_sum / count)
    return model, epoch_losses


def run_trainer(
    data: Any, num_epochs: int, batch_size: int, accumulation: int, lr: float, **kwargs: Any
) -> Trainer:
    trainer = make_trainer(lr=lr, momentum=0.9)
    trainer.train(
        data,
        num_epochs=num_epochs,
        per_device_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        **kwargs,
    )
    return trainer


@pytest.mark.parametrize(
    ("num_samples", "batch_size", "accumulation"),
    [(12, 4, 1), (12, 2, 3), (9, 2, 2), (9, 2, 3), (11, 4, 2)],
    ids=["no-accumulation", "full-windows", "small-last-batch", "partial-last-window", "both"],
)
def test_weights_and_epoch_loss_match_oracle_whatever_the_accumulation(
    num_samples: int, batch_size: int, accumulation: int
) -> None:
    data = make_regression_data(num_samples)
    trainer = run_trainer(data, num_epochs=2, batch_size=batch_size, accumulation=accumulation, lr=0.05)
    expected_model, expected_losses = oracle_train(
        make_linear_model(), data, 2, batch_size, accumulation, lr=0.05
    )

    for got, want in zip(trainer.get_model().parameters(), expected_model.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    recorded = trainer.run_history.get_metric_values("train_loss_epoch")
    assert recorded == pytest.approx(expected_losses, rel=1e-5)


def test_max_grad_norm_clips_total_norm_like_torch_on_update_steps_only() -> None:
    data = make_regression_data(9)
    trainer = run_trainer(data, num_epochs=1, batch_size=2, accumulation=2, lr=0.05, max_grad_norm=0.5)
    expected_model, _ = oracle_train(make_linear_model(), data, 1, 2, 2, lr=0.05, max_grad_norm=0.5)
    for got, want in zip(trainer.get_model().parameters(), expected_model.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert float(trainer.last_grad_norm) > 0.5  # the norm before clipping is what is reported


class TokenTrainer(Trainer):
    """Each sample has a variable number of valid 'tokens' (mask); loss is the mean over them."""

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        x, y, mask = batch
        per_token = (self.model(x) - y).pow(2) * mask
        num_items = mask.sum()
        return {
            "loss": per_token.sum() / num_items,
            "model_outputs": None,
            "batch_size": x.shape[0],
            "num_items_in_batch": num_items,
        }


def test_num_items_in_batch_makes_each_update_the_mean_over_all_items_of_its_window() -> None:
    base = make_regression_data(8, num_features=3)
    x, y = base.tensors
    y = y.repeat(1, 4)
    mask = torch.zeros(8, 4)
    for i, n in enumerate([1, 4, 2, 3, 4, 1, 1, 2]):
        mask[i, :n] = 1
    data = torch.utils.data.TensorDataset(x, y, mask)
    model = nn.Linear(3, 4)
    oracle = copy.deepcopy(model)
    trainer = TokenTrainer(model, None, torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    trainer.train(data, num_epochs=1, per_device_batch_size=2, gradient_accumulation_steps=2)

    optimizer = torch.optim.SGD(oracle.parameters(), lr=0.1)
    batches = shuffled_batches(8, 2, epoch=0)
    for window in (batches[:2], batches[2:]):
        indices = [i for b in window for i in b]
        loss = ((oracle(x[indices]) - y[indices]).pow(2) * mask[indices]).sum() / mask[indices].sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for got, want in zip(trainer.get_model().parameters(), oracle.parameters(), strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_same_seed_gives_identical_runs_and_different_seed_a_different_shuffle() -> None:
    data = make_regression_data(16)
    first = run_trainer(data, 2, 4, 1, lr=0.05)
    second = run_trainer(data, 2, 4, 1, lr=0.05)
    other = run_trainer(data, 2, 4, 1, lr=0.05, seed=7)
    for a, b in zip(first.get_model().parameters(), second.get_model().parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first.get_model().weight, other.get_model().weight)


def test_seed_none_leaves_the_global_rng_alone_and_a_seed_reseeds_it() -> None:
    def rng_after_training(global_seed: int, seed: int | None) -> torch.Tensor:
        model = make_linear_model()  # seeds torch itself, so build it before the RNG is set
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.05), callbacks=())
        torch.manual_seed(global_seed)
        trainer.train(make_regression_data(8), 1, per_device_batch_size=4, seed=seed)
        return torch.rand(1)

    # seed=None: what comes after depends on the RNG state the user left, so it was not reset.
    assert torch.equal(rng_after_training(1234, None), rng_after_training(1234, None))
    assert not torch.equal(rng_after_training(1234, None), rng_after_training(99, None))
    # seed=5: every RNG is reset, whatever state the user left.
    assert torch.equal(rng_after_training(1234, 5), rng_after_training(99, 5))


def test_evaluate_returns_its_metrics_and_keeps_the_training_history() -> None:
    data = make_regression_data(10)
    trainer = run_trainer(data, 2, 4, 1, lr=0.05)
    history_before = list(trainer.run_history.get_metric_values("train_loss_epoch"))

    metrics = trainer.evaluate(data, per_device_batch_size=3)

    model = trainer.get_model()
    with torch.no_grad():
        expected = nn.functional.mse_loss(model(data.tensors[0]), data.tensors[1]).item()
    assert metrics == {"evaluation_loss": pytest.approx(expected, rel=1e-6)}
    assert trainer.run_history.get_metric_values("train_loss_epoch") == history_before


def test_eval_loss_epoch_is_the_per_sample_mean_over_an_uneven_last_batch() -> None:
    data = make_regression_data(7)
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.0), callbacks=())
    trainer.train(data, num_epochs=1, eval_dataset=data, per_device_batch_size=3)
    with torch.no_grad():
        expected = nn.functional.mse_loss(model(data.tensors[0]), data.tensors[1]).item()
    assert trainer.run_history.get_latest_metric("eval_loss_epoch") == pytest.approx(expected, rel=1e-6)


def test_run_config_counts_updates_and_placeholders_resolve_from_it() -> None:
    from functools import partial

    from pytorch_accelerated import TrainerPlaceholderValues as P

    created: dict[str, Any] = {}

    def make_scheduler(optimizer: Any, total: int, per_epoch: int, batches: int) -> Any:
        created.update(total=total, per_epoch=per_epoch, batches=batches)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)

    scheduler_fn = partial(
        make_scheduler,
        total=P.NUM_EPOCHS * P.NUM_UPDATE_STEPS_PER_EPOCH + 1,
        per_epoch=P.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH,
        batches=P.TRAIN_DATALOADER_LEN,
    )
    trainer = run_trainer(make_regression_data(10), 3, 2, 2, lr=0.05, create_scheduler_fn=scheduler_fn)
    config = trainer.run_config
    assert (config.num_update_steps_per_epoch, config.num_epochs, config.train_total_batch_size) == (3, 3, 4)
    assert created == {"total": 10, "per_epoch": 3, "batches": 5}
    assert trainer.scheduler.last_epoch == 9  # stepped once per update
    assert config.to_dict()["num_processes"] == 1


def test_cosine_scheduler_from_placeholders_ends_at_lr_min_on_the_last_update() -> None:
    from pytorch_accelerated.schedulers import CosineLrScheduler

    trainer = run_trainer(
        make_regression_data(10),
        3,
        2,
        2,
        lr=0.05,
        create_scheduler_fn=CosineLrScheduler.create_scheduler_fn(lr_min=1e-4, num_warmup_epochs=1),
    )
    assert trainer.scheduler.num_updates == 9
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4)


def test_default_train_loader_uses_no_worker_processes_on_the_cpu() -> None:
    trainer = run_trainer(make_regression_data(8), 1, 4, 1, lr=0.05)
    assert trainer.get_default_train_dl_kwargs(4)["num_workers"] == 0
    assert trainer.train_dataloader.num_workers == 0


def test_shuffle_order_follows_seed_and_epoch_and_covers_every_sample() -> None:
    seen: list[list[int]] = []

    class Recorder(Trainer):
        def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
            x, y, index = batch
            seen.append(index.tolist())
            return super().calculate_train_batch_loss((x, y))

    data = IndexedDataset(make_regression_data(8))
    model = make_linear_model()
    Recorder(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.0), callbacks=()).train(
        data, 2, per_device_batch_size=4
    )
    assert seen == shuffled_batches(8, 4, 0) + shuffled_batches(8, 4, 1)
    assert sorted(i for batch in seen[:2] for i in batch) == list(range(8))
    assert seen[:2] != seen[2:]


def test_running_loss_is_nan_before_training_and_finite_after() -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=())
    assert math.isnan(trainer.running_loss)
    trainer.train(make_regression_data(8), 1, per_device_batch_size=4)
    assert math.isfinite(trainer.running_loss)


def test_a_single_process_run_steps_the_users_optimizer_itself() -> None:
    model = make_linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=())
    trainer.train(make_regression_data(8), num_epochs=2, per_device_batch_size=4)
    assert trainer.optimizer is optimizer
