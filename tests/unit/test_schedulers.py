"""Tests for pytorch_accelerated.schedulers: closed-form curves, state round-trips, factories, errors."""

from __future__ import annotations

import doctest
import functools
import math
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.placeholders import (
    TrainerPlaceholderValues,
    replace_trainer_placeholder_values,
)
from pytorch_accelerated.schedulers import (
    CosineLrScheduler,
    SchedulerBase,
    StatefulSchedulerBase,
    WSDLrScheduler,
)
from pytorch_accelerated.schedulers import cosine as cosine_module
from pytorch_accelerated.schedulers import wsd as wsd_module
from tests.helpers import make_linear_model, make_regression_data


def make_optimizer(*lrs: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], weight_decay=weight_decay)


def lrs_of(optimizer: torch.optim.Optimizer, field: str = "lr") -> list[float]:
    return [float(group[field]) for group in optimizer.param_groups]


def run_schedule(scheduler: StatefulSchedulerBase, num_steps: int, field: str = "lr") -> list[list[float]]:
    """Values in the optimizer after 0, 1, ..., num_steps calls of step()."""
    values = [lrs_of(scheduler.optimizer, field)]
    for _ in range(num_steps):
        scheduler.step()
        values.append(lrs_of(scheduler.optimizer, field))
    return values


class LinearRamp(StatefulSchedulerBase):
    """A test scheduler: each group's initial value times (1 + num_updates)."""

    def get_updated_values(self, num_updates: int) -> list[float]:
        return [value * (1 + num_updates) for value in self.base_values]


class Constant(SchedulerBase):
    def __init__(self, optimizer: torch.optim.Optimizer, value: float | list[float]) -> None:
        super().__init__(optimizer)
        self.value = value

    def get_updated_values(self, num_updates: int) -> list[float] | float:
        return self.value


# Closed forms, written from the formulas in the docs rather than from the implementation.


def cosine_expected(t, lr_max, total, warmup, cooldown, k, lr_min, lr_start):
    decay = total - warmup - cooldown
    if t < warmup:
        return lr_start + (lr_max - lr_start) * t / warmup
    if t >= warmup + decay:
        return lr_min
    return lr_min + (lr_max - lr_min) * 0.5 * (1 + math.cos(math.pi * (t - warmup) ** k / decay**k))


def wsd_expected(t, peak, checkpoints, decay_lengths, warmup, lr_min_ratio, lr_start, sqrt_decay):
    """lr_min is a ratio of the peak; the non-sqrt decay is peak / (p / r + 1 - p)."""
    if t < warmup:
        return lr_start + (peak - lr_start) * t / warmup
    r = lr_min_ratio
    for checkpoint, length in zip(checkpoints, decay_lengths, strict=True):
        if t <= checkpoint:
            start = checkpoint - length
            if t <= start:
                return peak
            p = (t - start) / length
            return peak * (r + (1 - r) * (1 - math.sqrt(p))) if sqrt_decay else peak / (p / r + 1 - p)
    return peak * r


# SchedulerBase and StatefulSchedulerBase


def test_base_applies_a_single_returned_value_to_every_param_group():
    optimizer = make_optimizer(0.1, 0.2, 0.3)
    Constant(optimizer, 0.05).step_update(7)
    assert lrs_of(optimizer) == [0.05, 0.05, 0.05]


def test_base_applies_one_value_per_param_group_in_order():
    optimizer = make_optimizer(0.1, 0.2)
    Constant(optimizer, [0.01, 0.02]).step_update(3)
    assert lrs_of(optimizer) == [0.01, 0.02]


def test_base_records_initial_value_in_each_group_and_keeps_an_existing_one():
    optimizer = make_optimizer(0.1, 0.2)
    optimizer.param_groups[1]["initial_lr"] = 0.5
    scheduler = Constant(optimizer, 0.0)
    assert [group["initial_lr"] for group in optimizer.param_groups] == [0.1, 0.5]
    assert scheduler.base_values == [0.1, 0.5]


def test_base_wrong_number_of_values_raises_value_error_naming_counts():
    scheduler = Constant(make_optimizer(0.1, 0.2), [0.01, 0.02, 0.03])
    with pytest.raises(ValueError, match=r"returned 3 values but the optimizer has 2 param groups"):
        scheduler.step_update(0)


def test_base_bad_param_group_field_error_lists_the_group_keys():
    with pytest.raises(
        ValueError,
        match=r"param_group_field='learning_rate' is not a key of "
        r"optimizer param group 0; its keys are \[.*'lr'.*'weight_decay'.*\]",
    ):
        LinearRamp(make_optimizer(0.1), param_group_field="learning_rate")


def test_base_non_numeric_param_group_field_raises_type_error():
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(TypeError, match=r"param_group_field='betas' holds \(0.9, 0.999\)"):
        LinearRamp(optimizer, param_group_field="betas")


def test_base_schedules_weight_decay_via_param_group_field_and_leaves_lr_alone():
    optimizer = make_optimizer(0.1, 0.2, weight_decay=0.01)
    scheduler = LinearRamp(optimizer, param_group_field="weight_decay")
    values = run_schedule(scheduler, 3, field="weight_decay")
    assert values == [[pytest.approx(0.01 * (1 + t))] * 2 for t in range(4)]
    assert [group["initial_weight_decay"] for group in optimizer.param_groups] == [0.01, 0.01]
    assert lrs_of(optimizer) == [0.1, 0.2]


def test_base_updates_a_tensor_learning_rate_in_place():
    lr = torch.tensor(0.1)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    LinearRamp(optimizer).step()
    assert optimizer.param_groups[0]["lr"] is lr
    assert lr.item() == pytest.approx(0.2)


def test_stateful_applies_the_values_for_step_zero_at_construction():
    optimizer = make_optimizer(0.1)
    CosineLrScheduler(optimizer, 2, 5, num_warmup_epochs=1, warmup_starting_lr=0.003)
    assert lrs_of(optimizer) == [0.003]


def test_stateful_step_increments_num_updates_and_applies_its_values():
    scheduler = LinearRamp(make_optimizer(0.1, 0.2))
    assert scheduler.num_updates == 0
    scheduler.step()
    scheduler.step()
    assert scheduler.num_updates == 2
    assert lrs_of(scheduler.optimizer) == [pytest.approx(0.3), pytest.approx(0.6)]


def test_stateful_num_updates_is_read_only():
    scheduler = LinearRamp(make_optimizer(0.1))
    with pytest.raises(AttributeError):
        scheduler.num_updates = 5


def test_stateful_load_state_dict_reapplies_the_values_of_the_restored_counter():
    source = LinearRamp(make_optimizer(0.1))
    for _ in range(4):
        source.step()
    target = LinearRamp(make_optimizer(0.1))
    target.load_state_dict(source.state_dict())
    assert target.num_updates == 4
    assert lrs_of(target.optimizer) == [pytest.approx(0.5)]


def test_stateful_load_state_dict_without_counter_raises_value_error():
    scheduler = LinearRamp(make_optimizer(0.1))
    with pytest.raises(ValueError, match=r"got a state without '_num_updates' \(keys: \['base_values'\]\)"):
        scheduler.load_state_dict({"base_values": [0.1]})


# CosineLrScheduler


@pytest.mark.parametrize("k_decay", [1.0, 2.0])
def test_cosine_curve_with_warmup_decay_and_cooldown_matches_closed_form(k_decay):
    epochs, steps, warmup_epochs, cooldown_epochs = 10, 7, 2, 3
    scheduler = CosineLrScheduler(
        make_optimizer(0.1),
        epochs,
        steps,
        k_decay=k_decay,
        lr_min=1e-4,
        num_warmup_epochs=warmup_epochs,
        warmup_starting_lr=1e-3,
        num_cooldown_epochs=cooldown_epochs,
    )
    total = epochs * steps
    expected = [
        cosine_expected(t, 0.1, total, warmup_epochs * steps, cooldown_epochs * steps, k_decay, 1e-4, 1e-3)
        for t in range(total + 5)
    ]
    assert [v[0] for v in run_schedule(scheduler, total + 4)] == pytest.approx(expected, rel=1e-12)


def test_cosine_anchor_values_for_k1_and_k2():
    # Warm-up of 10 updates, decay of 20: mid-decay is t=20.
    k1 = CosineLrScheduler(
        make_optimizer(1.0), 3, 10, lr_min=0.0, num_warmup_epochs=1, warmup_starting_lr=0.0
    )
    k2 = CosineLrScheduler(make_optimizer(1.0), 3, 10, k_decay=2, lr_min=0.0, num_warmup_epochs=1)
    assert k1.get_updated_values(5) == [pytest.approx(0.5)]
    assert k1.get_updated_values(10) == [1.0]
    assert k1.get_updated_values(20) == [pytest.approx(0.5)]
    # k=2 at half the decay: 0.5 * (1 + cos(pi / 4)).
    assert k2.get_updated_values(20) == [pytest.approx(0.5 * (1 + math.sqrt(0.5)))]


def test_cosine_value_after_the_last_step_is_exactly_lr_min_and_stays_there():
    for cooldown in (0, 1):
        scheduler = CosineLrScheduler(make_optimizer(0.1), 4, 3, lr_min=0.00123, num_cooldown_epochs=cooldown)
        values = run_schedule(scheduler, 12 + 3)
        assert [v[0] for v in values[12:]] == [0.00123] * 4
        assert scheduler.get_updated_values(12) == [0.00123]


def test_cosine_lr_min_is_reached_exactly_at_the_start_of_cooldown():
    scheduler = CosineLrScheduler(make_optimizer(0.1), 4, 3, lr_min=0.002, num_cooldown_epochs=2)
    assert scheduler.get_updated_values(5) > [0.002]
    assert [scheduler.get_updated_values(t) for t in range(6, 13)] == [[0.002]] * 7


def test_cosine_uses_each_param_group_initial_lr_with_absolute_lr_min():
    scheduler = CosineLrScheduler(make_optimizer(0.1, 0.01), 5, 4, lr_min=1e-4, num_warmup_epochs=1)
    values = run_schedule(scheduler, 20)
    for group, lr_max in enumerate([0.1, 0.01]):
        expected = [cosine_expected(t, lr_max, 20, 4, 0, 1.0, 1e-4, 1e-6) for t in range(21)]
        assert [v[group] for v in values] == pytest.approx(expected, rel=1e-12)


def test_cosine_ratios_scale_warmup_start_and_lr_min_with_each_group_initial_lr():
    scheduler = CosineLrScheduler(
        make_optimizer(0.1, 0.02),
        5,
        4,
        min_lr_ratio=0.01,
        num_warmup_epochs=1,
        warmup_starting_lr_ratio=0.1,
    )
    assert scheduler.get_updated_values(0) == [pytest.approx(0.01), pytest.approx(0.002)]
    assert scheduler.get_updated_values(20) == [pytest.approx(0.001), pytest.approx(0.0002)]
    values = run_schedule(scheduler, 20)
    expected = [cosine_expected(t, 0.02, 20, 4, 0, 1.0, 0.0002, 0.002) for t in range(21)]
    assert [v[1] for v in values] == pytest.approx(expected, rel=1e-12)


# WSDLrScheduler


@pytest.mark.parametrize("sqrt_decay", [True, False])
def test_wsd_single_checkpoint_curve_matches_closed_form(sqrt_decay):
    scheduler = WSDLrScheduler(
        make_optimizer(0.1),
        total_steps=100,
        num_warmup_steps=10,
        decay_phase_ratio=0.2,
        lr_min=1e-4,
        warmup_starting_lr=1e-3,
        use_inverse_sqrt_decay=sqrt_decay,
    )
    expected = [wsd_expected(t, 0.1, [100], [20], 10, 1e-4, 1e-3, sqrt_decay) for t in range(106)]
    assert [v[0] for v in run_schedule(scheduler, 105)] == pytest.approx(expected, rel=1e-12)


def test_wsd_decay_anchor_values_for_sqrt_and_inverse_shapes():
    # Decay from step 80 to 100: a quarter of the way through is step 85.
    sqrt = WSDLrScheduler(make_optimizer(1.0), total_steps=100, decay_phase_ratio=0.2, lr_min=0.0)
    inverse = WSDLrScheduler(
        make_optimizer(1.0), total_steps=100, decay_phase_ratio=0.2, lr_min=0.01, use_inverse_sqrt_decay=False
    )
    assert sqrt.get_updated_values(79) == [1.0] and sqrt.get_updated_values(80) == [1.0]
    assert sqrt.get_updated_values(85) == [pytest.approx(0.5)]
    assert inverse.get_updated_values(85) == [pytest.approx(1 / (0.25 / 0.01 + 0.75))]
    assert inverse.get_updated_values(100) == [pytest.approx(0.01)]


@pytest.mark.parametrize(
    ("num_checkpoints", "expected"),
    [(1, [1000]), (2, [250, 1000]), (3, [250, 500, 1000]), (4, [250, 397, 630, 1000])],
)
def test_wsd_checkpoint_steps_follow_a_geometric_progression_from_a_quarter(num_checkpoints, expected):
    scheduler = WSDLrScheduler(make_optimizer(0.1), total_steps=1000, num_checkpoints=num_checkpoints)
    assert scheduler.get_checkpoint_steps() == expected


def test_wsd_multiple_checkpoints_curve_matches_closed_form_and_returns_to_peak():
    scheduler = WSDLrScheduler(
        make_optimizer(0.1, 0.05),
        total_steps=200,
        num_warmup_steps=20,
        decay_phase_ratio=0.1,
        lr_min=1e-5,
        num_checkpoints=3,
    )
    # Each decay lasts int(0.1 * (c_i - c_{i-1})) updates.
    checkpoints, lengths = [50, 100, 200], [5, 5, 10]
    assert scheduler.get_checkpoint_steps() == checkpoints
    assert scheduler.get_decay_start_steps() == [45, 95, 190]
    values = run_schedule(scheduler, 205)
    for group, peak in enumerate([0.1, 0.05]):
        expected = [wsd_expected(t, peak, checkpoints, lengths, 20, 1e-5, 1e-6, True) for t in range(206)]
        assert [v[group] for v in values] == pytest.approx(expected, rel=1e-12)
    assert [values[t] for t in checkpoints] == [[0.1 * 1e-5, 0.05 * 1e-5]] * 3
    assert values[51] == [0.1, 0.05] and values[101] == [0.1, 0.05]


def test_wsd_decay_length_truncates_and_is_at_least_one_update():
    half = WSDLrScheduler(make_optimizer(0.1), total_steps=25, decay_phase_ratio=0.1)
    tiny = WSDLrScheduler(make_optimizer(0.1), total_steps=10, decay_phase_ratio=0.01, lr_min=0.0)
    assert half.get_decay_start_steps() == [23]  # int(2.5) = 2 updates, as in 0.1.61
    assert tiny.get_decay_start_steps() == [9]
    assert tiny.get_updated_values(9) == [0.1] and tiny.get_updated_values(10) == [0.0]


def test_wsd_continuation_from_checkpoint_skips_warmup_and_starts_at_peak():
    optimizer = make_optimizer(0.1)
    scheduler = WSDLrScheduler(
        optimizer, total_steps=100, num_warmup_steps=30, is_continuation_from_checkpoint=True
    )
    assert lrs_of(optimizer) == [0.1]
    assert scheduler.get_phase_info(0)["phase"] == "stable"


def test_wsd_total_steps_from_epochs_is_their_product():
    scheduler = WSDLrScheduler(make_optimizer(0.1), num_epochs=4, num_update_steps_per_epoch=25)
    assert scheduler.total_steps == 100 and scheduler.get_checkpoint_steps() == [100]


def test_wsd_phase_info_reports_phase_checkpoint_and_steps_left():
    scheduler = WSDLrScheduler(make_optimizer(0.1), total_steps=200, num_warmup_steps=20, num_checkpoints=3)
    info = {step: scheduler.get_phase_info(step) for step in (0, 30, 47, 50, 51, 200)}
    assert [info[s]["phase"] for s in info] == ["warmup", "stable", "decay", "decay", "stable", "decay"]
    assert [info[s]["checkpoint_index"] for s in info] == [0, 0, 0, 0, 1, 2]
    assert [info[s]["steps_until_checkpoint"] for s in info] == [50, 20, 3, 0, 49, 0]
    assert [info[s]["is_decay_phase"] for s in info] == [False, False, True, True, False, True]
    assert [info[s]["is_checkpoint_step"] for s in info] == [False, False, False, True, False, True]
    assert info[51]["checkpoint_step"] == 100 and info[51]["decay_start_step"] == 95


def test_wsd_phase_info_beyond_the_run_describes_the_last_period_and_rejects_negatives():
    scheduler = WSDLrScheduler(make_optimizer(0.1), total_steps=100)
    assert scheduler.get_phase_info(101) == {**scheduler.get_phase_info(100), "is_checkpoint_step": False}
    with pytest.raises(ValueError, match=r"step must be a whole number >= 0, got -1"):
        scheduler.get_phase_info(-1)


# State round-trips

SCHEDULER_FACTORIES = {
    "cosine": lambda opt: CosineLrScheduler(opt, 6, 5, k_decay=2, num_warmup_epochs=1, num_cooldown_epochs=1),
    "wsd": lambda opt: WSDLrScheduler(
        opt,
        total_steps=30,
        num_warmup_steps=3,
        num_checkpoints=3,
        decay_phase_ratio=0.2,
        use_inverse_sqrt_decay=False,
    ),
    "custom": LinearRamp,
}


@pytest.mark.parametrize("via_file", [False, True], ids=["in_memory", "torch_save"])
@pytest.mark.parametrize("name", sorted(SCHEDULER_FACTORIES))
def test_restored_scheduler_continues_the_uninterrupted_sequence(name, via_file, tmp_path):
    factory, resume_at, total = SCHEDULER_FACTORIES[name], 11, 30
    uninterrupted = run_schedule(factory(make_optimizer(0.1, 0.3)), total)

    first = factory(make_optimizer(0.1, 0.3))
    run_schedule(first, resume_at)
    state = first.state_dict()
    if via_file:
        torch.save(state, tmp_path / "scheduler.pt")
        state = torch.load(tmp_path / "scheduler.pt", weights_only=True)

    second = factory(make_optimizer(0.1, 0.3))
    second.load_state_dict(state)
    assert second.num_updates == resume_at
    resumed = run_schedule(second, total - resume_at)
    assert resumed == uninterrupted[resume_at:]


def test_state_dict_holds_the_counter_and_no_optimizer():
    scheduler = WSDLrScheduler(make_optimizer(0.1), total_steps=10)
    scheduler.step()
    state = scheduler.state_dict()
    assert state["_num_updates"] == 1 and state["num_updates"] == 1 and "optimizer" not in state
    assert state["checkpoint_steps"] == [10]


def test_state_dict_is_a_copy_unaffected_by_later_steps():
    scheduler = LinearRamp(make_optimizer(0.1))
    state = scheduler.state_dict()
    scheduler.step()
    scheduler.base_values.append(1.0)
    assert state["_num_updates"] == 0 and state["base_lr_values"] == [0.1]


# create_scheduler_fn and placeholders

STAND_IN_TRAINER = SimpleNamespace(
    run_config=SimpleNamespace(num_epochs=3, num_update_steps_per_epoch=5, num_local_update_steps_per_epoch=5)
)


def test_cosine_create_scheduler_fn_holds_placeholders_the_trainer_resolves():
    fn = CosineLrScheduler.create_scheduler_fn(k_decay=2, num_warmup_epochs=1)
    assert isinstance(fn, functools.partial) and fn.func is CosineLrScheduler
    assert fn.keywords["total_num_epochs"] is TrainerPlaceholderValues.NUM_EPOCHS
    assert fn.keywords["num_update_steps_per_epoch"] is TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH
    scheduler = replace_trainer_placeholder_values(STAND_IN_TRAINER, fn)(make_optimizer(0.1))
    assert (scheduler.total_steps, scheduler.num_warmup_steps, scheduler.k_decay) == (15, 5, 2.0)


def test_wsd_create_scheduler_fn_holds_placeholders_the_trainer_resolves():
    fn = WSDLrScheduler.create_scheduler_fn(num_checkpoints=2, num_warmup_steps=1)
    assert fn.keywords["num_epochs"] is TrainerPlaceholderValues.NUM_EPOCHS
    # 0.1.61's default; the same value as NUM_UPDATE_STEPS_PER_EPOCH here.
    assert (
        fn.keywords["num_update_steps_per_epoch"]
        is TrainerPlaceholderValues.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH
    )
    scheduler = replace_trainer_placeholder_values(STAND_IN_TRAINER, fn)(make_optimizer(0.1))
    assert scheduler.total_steps == 15 and scheduler.get_checkpoint_steps() == [4, 15]


def test_wsd_create_scheduler_fn_with_total_steps_drops_the_epoch_placeholders():
    fn = WSDLrScheduler.create_scheduler_fn(total_steps=40)
    assert fn.keywords["num_epochs"] is None and fn.keywords["num_update_steps_per_epoch"] is None
    assert replace_trainer_placeholder_values(STAND_IN_TRAINER, fn)(make_optimizer(0.1)).total_steps == 40


def test_docstring_examples_run():
    for module in (cosine_module, wsd_module):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


# Bad input

BAD_INPUTS = [
    (
        lambda o: CosineLrScheduler(o, 2.5, 10),
        ValueError,
        r"total_num_epochs must be a whole number >= 1, got 2.5",
    ),
    (
        lambda o: CosineLrScheduler(o, 0, 10),
        ValueError,
        r"total_num_epochs must be a whole number >= 1, got 0",
    ),
    (
        lambda o: CosineLrScheduler(o, 5, 0),
        ValueError,
        r"num_update_steps_per_epoch must be a whole number >= 1, got 0",
    ),
    (
        lambda o: CosineLrScheduler(o, 5, 10, num_warmup_epochs=-1),
        ValueError,
        r"num_warmup_epochs must be a whole number >= 0, got -1",
    ),
    (
        lambda o: CosineLrScheduler(o, 5, 10, num_cooldown_epochs=True),
        ValueError,
        r"num_cooldown_epochs must be a whole number >= 0, got True",
    ),
    (
        lambda o: CosineLrScheduler(o, 5, 10, num_warmup_epochs=3, num_cooldown_epochs=2),
        ValueError,
        r"num_warmup_epochs=3 plus num_cooldown_epochs=2 must be less than total_num_epochs=5",
    ),
    (lambda o: CosineLrScheduler(o, 5, 10, k_decay=0), ValueError, r"k_decay must be > 0, got 0"),
    (lambda o: CosineLrScheduler(o, 5, 10, k_decay=-1), ValueError, r"k_decay must be >= 0, got -1"),
    (lambda o: CosineLrScheduler(o, 5, 10, lr_min=-1e-3), ValueError, r"lr_min must be >= 0, got -0.001"),
    (
        lambda o: CosineLrScheduler(o, 5, 10, min_lr_ratio=-0.1),
        ValueError,
        r"min_lr_ratio must be >= 0, got -0.1",
    ),
    (
        lambda o: CosineLrScheduler(o, 5, 10, warmup_starting_lr="1e-3"),
        TypeError,
        r"warmup_starting_lr must be a number, got '1e-3'",
    ),
    (
        lambda o: CosineLrScheduler(o, TrainerPlaceholderValues.NUM_EPOCHS, 10),
        TypeError,
        r"total_num_epochs is the placeholder TrainerPlaceholderValues.NUM_EPOCHS.*create_scheduler_fn",
    ),
    (
        lambda o: WSDLrScheduler(o),
        ValueError,
        r"Give the run length as total_steps, or as both num_epochs and num_update_steps_per_epoch; "
        r"got total_steps=None, num_epochs=None",
    ),
    (lambda o: WSDLrScheduler(o, num_epochs=3), ValueError, r"num_update_steps_per_epoch=None"),
    (
        lambda o: WSDLrScheduler(o, num_epochs=3, num_update_steps_per_epoch=5, total_steps=15),
        ValueError,
        r"not both; got total_steps=15, num_epochs=3, num_update_steps_per_epoch=5. Drop one",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=0),
        ValueError,
        r"total_steps must be a whole number >= 1, got 0",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=100, num_warmup_steps=-5),
        ValueError,
        r"num_warmup_steps must be a whole number >= 0 or None, got -5",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=100, decay_phase_ratio=0),
        ValueError,
        r"decay_phase_ratio must be in \(0, 1\], got 0",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=100, decay_phase_ratio=1.5),
        ValueError,
        r"decay_phase_ratio must be in \(0, 1\], got 1.5",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=100, decay_phase_ratio=None),
        TypeError,
        r"decay_phase_ratio must be a number in \(0, 1\], got None",
    ),
    (
        lambda o: WSDLrScheduler(o, total_steps=100, num_checkpoints=0),
        ValueError,
        r"num_checkpoints must be a whole number >= 1, got 0",
    ),
    (lambda o: WSDLrScheduler(o, total_steps=100, lr_min=-1), ValueError, r"lr_min must be >= 0, got -1"),
    (
        lambda o: WSDLrScheduler(o, total_steps=3, num_checkpoints=4),
        ValueError,
        r"num_checkpoints=4 is too many for total_steps=3: the checkpoint steps \[1, 1, 2, 3\]",
    ),
]


@pytest.mark.parametrize(("build", "error", "message"), BAD_INPUTS, ids=[m[:40] for _, _, m in BAD_INPUTS])
def test_bad_input_raises_an_error_naming_the_argument_and_value(build, error, message):
    with pytest.raises(error, match=message):
        build(make_optimizer(0.1))


def test_a_scheduler_sees_every_optimizer_step_without_warning() -> None:
    model = make_linear_model()
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=1.0), callbacks=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a scheduler steps before its optimizer
        trainer.train(
            make_regression_data(8),
            num_epochs=1,
            per_device_batch_size=2,
            create_scheduler_fn=lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        )
    assert trainer.optimizer.param_groups[0]["lr"] == 0.5**4
