"""The scheduler module paths, TrainerPlaceholderValues and schedulers of pytorch-accelerated
0.1.61 keep working (docs/migration.md; the schedulers' behaviour in docs/schedulers.md).

Each kept item is exercised in 0.1.61's form (its import paths, keyword names, attribute names,
state dicts), with worked numbers; where 0.1.61 was at fault, the fix is checked to stay.
"""

from __future__ import annotations

import functools
import inspect
import io
import warnings
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from pytorch_accelerated import Trainer, TrainerPlaceholderValues
from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.placeholders import replace_trainer_placeholder_values
from pytorch_accelerated.schedulers import base, cosine, wsd
from pytorch_accelerated.schedulers.cosine_scheduler import CosineLrScheduler
from pytorch_accelerated.schedulers.scheduler_base import SchedulerBase, StatefulSchedulerBase
from pytorch_accelerated.schedulers.wsd_scheduler import WSDLrScheduler, estimate_checkpoint_steps
from tests.helpers import make_linear_model, make_regression_data


def optimizer_with(*lrs: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    groups = [{"params": [nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.SGD(groups, lr=lrs[0], weight_decay=weight_decay)


def lr(scheduler: Any, group: int = 0) -> float:
    return float(scheduler.optimizer.param_groups[group]["lr"])


def values_at(scheduler: Any, *steps: int) -> list[float]:
    return [scheduler.get_updated_values(t)[0] for t in steps]


# The run config a Trainer would give these placeholders (P = 2: the counts are per update).
STAND_IN_TRAINER = SimpleNamespace(
    run_config=SimpleNamespace(
        num_epochs=4, num_update_steps_per_epoch=25, num_local_update_steps_per_epoch=25
    )
)


# ---------------------------------------------------------------- module paths


def test_the_original_module_paths_export_the_same_classes() -> None:
    assert (SchedulerBase, StatefulSchedulerBase) == (base.SchedulerBase, base.StatefulSchedulerBase)
    assert CosineLrScheduler is cosine.CosineLrScheduler
    assert WSDLrScheduler is wsd.WSDLrScheduler


@pytest.mark.parametrize(
    ("num_checkpoints", "expected"),
    [
        (None, [250, 500, 1000]),
        (1, [1000]),
        (2, [250, 1000]),
        (3, [250, 500, 1000]),
        (4, [250, 397, 630, 1000]),
    ],
)
def test_estimate_checkpoint_steps_returns_the_layout_of_the_scheduler(
    num_checkpoints: Any, expected: list[int]
) -> None:
    steps = (
        estimate_checkpoint_steps(1000)
        if num_checkpoints is None
        else estimate_checkpoint_steps(1000, num_checkpoints)
    )
    assert steps == expected
    scheduler = WSDLrScheduler(optimizer_with(0.1), total_steps=1000, num_checkpoints=num_checkpoints or 3)
    assert scheduler.checkpoint_steps == expected


def test_estimate_checkpoint_steps_rejects_too_many_checkpoints() -> None:
    with pytest.raises(ValueError, match=r"num_checkpoints=4 is too many for total_steps=3"):
        estimate_checkpoint_steps(3, 4)


# ---------------------------------------------------------------- TrainerPlaceholderValues


def test_placeholder_set_returns_the_member_names() -> None:
    assert TrainerPlaceholderValues.placeholder_set() == {
        "NUM_EPOCHS",
        "NUM_UPDATE_STEPS_PER_EPOCH",
        "PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH",
        "TRAIN_DATALOADER_LEN",
        "EVAL_DATALOADER_LEN",
    }


def test_placeholder_expressions_keep_the_name_and_resolve_without_eval() -> None:
    epochs = TrainerPlaceholderValues.NUM_EPOCHS
    for expression, value in ((epochs * 2, 8), (epochs + 1, 5), (3 * epochs + 1, 13)):
        assert expression.name == "NUM_EPOCHS"
        fn = replace_trainer_placeholder_values(STAND_IN_TRAINER, functools.partial(dict, n=expression))
        assert fn() == {"n": value}
    assert epochs.value == "num_epochs"  # changed from 0.1.61: a plain name, never an eval-ed string


@pytest.mark.parametrize(
    "subtract",
    [
        lambda p: p - 1,
        lambda p: 1 - p,
        lambda p: p * 2 - 1,
        lambda p: 1 - (p + 1),
    ],
)
def test_subtracting_from_a_placeholder_raises_not_implemented_error(subtract: Any) -> None:
    with pytest.raises(NotImplementedError, match=r"only `\* k` and `\+ k`.*not `-`"):
        subtract(TrainerPlaceholderValues.NUM_UPDATE_STEPS_PER_EPOCH)


# ---------------------------------------------------------------- counting (changed from 0.1.61: update k uses value(k-1))


def test_update_k_uses_value_k_minus_1_from_the_first_update() -> None:
    scheduler = CosineLrScheduler(
        optimizer_with(0.1),
        total_num_epochs=4,
        num_update_steps_per_epoch=5,
        lr_min=0.0,
        num_warmup_epochs=1,
        warmup_starting_lr=0.0,
    )
    used = []
    for _ in range(7):  # the lr each update k = 1..7 uses
        used.append(round(lr(scheduler), 4))
        scheduler.step()
    assert used == [0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.0989]


# ---------------------------------------------------------------- the original's subclass pattern


class StepWdScheduler(StatefulSchedulerBase):
    """As 0.1.61's docs write it: attributes set after super().__init__(), None = no update."""

    def __init__(self, optimizer: torch.optim.Optimizer, n: int = 3, gamma: float = 1.1) -> None:
        super().__init__(optimizer, param_group_field="weight_decay")
        self.n = n
        self.gamma = gamma

    def get_updated_values(self, num_updates: int) -> list[float] | None:
        if num_updates % self.n == 0 and num_updates > 0:
            return [group[self.param_group_field] * self.gamma for group in self.optimizer.param_groups]
        return None


class MilestoneLrScheduler(SchedulerBase):
    """As 0.1.61's docs write it: a stateless scheduler fed the update count by the loop."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, gamma: float = 0.5, milestones: tuple[int, ...] = (2, 4)
    ) -> None:
        super().__init__(optimizer, param_group_field="lr")
        self._gamma = gamma
        self._milestones = set(milestones)

    def get_updated_values(self, num_updates: int) -> list[float] | None:
        if num_updates in self._milestones:
            return [group["lr"] * self._gamma for group in self.optimizer.param_groups]
        return None


def test_the_documented_step_wd_scheduler_works_with_attributes_after_super_init() -> None:
    scheduler = StepWdScheduler(optimizer_with(0.1, weight_decay=0.1), n=3, gamma=1.1)
    after = []
    for _ in range(7):
        scheduler.step()
        after.append(round(scheduler.optimizer.param_groups[0]["weight_decay"], 6))
    assert after == [0.1, 0.1, 0.11, 0.11, 0.11, 0.121, 0.121]
    assert scheduler.base_lr_values == [0.1]  # the initial values of the scheduled field


class RecordWeightDecay(TrainerCallback):
    def __init__(self) -> None:
        self.after_updates: list[float] = []

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:
            self.after_updates.append(round(trainer.optimizer.param_groups[0]["weight_decay"], 6))


def test_the_step_wd_scheduler_runs_in_a_real_training_run() -> None:
    model, recorder = make_linear_model(), RecordWeightDecay()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, weight_decay=0.1)
    trainer = Trainer(model, nn.MSELoss(), optimizer, callbacks=(recorder,))
    trainer.train(
        make_regression_data(28),
        num_epochs=1,
        per_device_batch_size=4,
        create_scheduler_fn=functools.partial(StepWdScheduler, n=3, gamma=1.1),
    )
    assert recorder.after_updates == [0.1, 0.1, 0.11, 0.11, 0.11, 0.121, 0.121]


def test_a_stateless_subclass_with_none_for_no_update_and_the_default_state_dict() -> None:
    scheduler = MilestoneLrScheduler(optimizer_with(0.4))
    seen = []
    for num_updates in range(6):
        scheduler.step_update(num_updates)
        seen.append(lr(scheduler))
    assert seen == [0.4, 0.4, 0.2, 0.2, 0.1, 0.1]
    restored = MilestoneLrScheduler(optimizer_with(0.4), gamma=0.9, milestones=(1,))
    restored.load_state_dict(scheduler.state_dict())
    assert (restored._gamma, restored._milestones) == (0.5, {2, 4})


def test_a_none_in_the_list_leaves_that_group_alone() -> None:
    class FirstGroupOnly(StatefulSchedulerBase):
        def get_updated_values(self, num_updates: int) -> list[float | None]:
            return [0.5 * num_updates, None]

    scheduler = FirstGroupOnly(optimizer_with(0.1, 0.2))
    scheduler.step()
    assert [group["lr"] for group in scheduler.optimizer.param_groups] == [0.5, 0.2]


# ---------------------------------------------------------------- base_lr_values


def test_base_lr_values_is_canonical_and_base_values_an_alias() -> None:
    scheduler = CosineLrScheduler(optimizer_with(0.1, 0.3), 2, 5)
    assert scheduler.base_lr_values == [0.1, 0.3] and scheduler.base_values is scheduler.base_lr_values
    scheduler.base_values = [0.2, 0.6]
    assert scheduler.base_lr_values == [0.2, 0.6]
    assert "base_lr_values" in scheduler.state_dict() and "base_values" not in scheduler.state_dict()


# ---------------------------------------------------------------- state dicts


@pytest.mark.parametrize(
    "make",
    [
        lambda o: CosineLrScheduler(o, 10, 10),
        lambda o: WSDLrScheduler(o, total_steps=100),
        lambda o: StepWdScheduler(o),
    ],
    ids=["cosine", "wsd", "custom"],
)
def test_every_state_dict_has_num_updates_counting_completed_updates(make: Any) -> None:
    scheduler = make(optimizer_with(0.1, weight_decay=0.1))
    for _ in range(50):
        scheduler.step()
    assert scheduler.state_dict()["num_updates"] == 50


ORIGINAL_COSINE_STATE = {
    "total_iterations": 20,
    "lr_min_ratio": None,
    "lr_min": 0.0,
    "warmup_iterations": 5,
    "warmup_lr_init": 0.0,
    "warmup_lr_ratio": None,
    "k_decay": 1.0,
    "num_cooldown_iterations": 0,
    "num_updates": 7,
}


def test_a_state_of_the_original_cosine_loads_with_its_counter_plus_one() -> None:
    reference = CosineLrScheduler(
        optimizer_with(0.1), 4, 5, lr_min=0.0, num_warmup_epochs=1, warmup_starting_lr=0.0
    )
    target = CosineLrScheduler(optimizer_with(0.1), 8, 3, lr_min=0.5, warmup_starting_lr=0.3)
    target.load_state_dict(ORIGINAL_COSINE_STATE)
    assert target.num_updates == 8  # 0.1.61 counted from -1: 7 means 8 completed updates
    assert (target.total_steps, target.num_warmup_steps, target.num_decay_steps) == (20, 5, 15)
    assert (target.lr_min, target.warmup_starting_lr) == (0.0, 0.0)
    assert lr(target) == pytest.approx(reference.get_updated_values(8)[0])
    for _ in range(12):
        target.step()
    assert lr(target) == 0.0
    # A loader that knows the position (a 0.1.61 training-state directory) sets the counter.
    positioned = CosineLrScheduler(optimizer_with(0.1), 8, 3)
    positioned.load_state_dict({**ORIGINAL_COSINE_STATE, "_num_updates": 10})
    assert positioned.num_updates == 10 and lr(positioned) == pytest.approx(
        reference.get_updated_values(10)[0]
    )
    assert "total_iterations" not in positioned.state_dict() and positioned.total_iterations == 20


def test_a_state_of_the_original_wsd_loads_its_settings_keeps_the_counter_and_warns() -> None:
    original_state = {
        "total_steps": 1000,
        "num_warmup_steps": 10,
        "decay_phase_ratio": 0.1,
        "lr_min": 0.01,
        "warmup_starting_lr": 1e-6,
        "use_inverse_sqrt_decay": True,
        "num_checkpoints": 3,
        "is_continuation_from_checkpoint": False,
        "param_group_field": "lr",
        "base_lr_values": [0.1],
        "checkpoint_steps": [250, 500, 1000],
        "previous_checkpoint_step": 224,
        "checkpoint_decay_info": [
            {"period_start": 0, "period_end": 250, "decay_steps": 25, "pre_decay_step": 225},
            {"period_start": 250, "period_end": 500, "decay_steps": 25, "pre_decay_step": 475},
            {"period_start": 500, "period_end": 1000, "decay_steps": 50, "pre_decay_step": 950},
        ],
    }
    target = WSDLrScheduler(optimizer_with(0.5), total_steps=300, lr_min=0.5)
    for _ in range(249):
        target.step()
    with pytest.warns(
        UserWarning, match=r"holds the configuration but no update counter; the counter stays at 249"
    ):
        target.load_state_dict(original_state)
    assert (target.total_steps, target.num_checkpoints, target.lr_min) == (1000, 3, 0.01)
    assert target.checkpoint_decay_info == original_state["checkpoint_decay_info"]
    assert target.num_updates == 249 and lr(target) == pytest.approx(0.003, rel=1e-3)
    positioned = WSDLrScheduler(optimizer_with(0.5), total_steps=300)
    positioned.load_state_dict({**original_state, "_num_updates": 251})  # a loader that knows the position
    assert positioned.num_updates == 251 and lr(positioned) == 0.1


def test_our_state_round_trips_with_the_counter() -> None:
    source = WSDLrScheduler(optimizer_with(0.1), total_steps=100, num_checkpoints=3)
    for _ in range(24):
        source.step()
    target = WSDLrScheduler(optimizer_with(0.1), total_steps=100, num_checkpoints=3)
    target.load_state_dict(torch.load(_saved(source.state_dict()), weights_only=True))
    assert target.num_updates == 24 and lr(target) == lr(source)


def _saved(state: dict[str, Any]) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


# ---------------------------------------------------------------- cosine attribute names


def test_the_cosine_scheduler_has_the_original_attribute_names() -> None:
    scheduler = CosineLrScheduler(
        optimizer_with(0.1),
        total_num_epochs=6,
        num_update_steps_per_epoch=5,
        num_warmup_epochs=1,
        num_cooldown_epochs=2,
        warmup_starting_lr=0.01,
        warmup_starting_lr_ratio=0.2,
        min_lr_ratio=0.05,
    )
    assert (scheduler.total_iterations, scheduler.warmup_iterations, scheduler.num_cooldown_iterations) == (
        30,
        5,
        10,
    )
    assert (scheduler.warmup_lr_init, scheduler.warmup_lr_ratio, scheduler.lr_min_ratio) == (0.01, 0.2, 0.05)


# ---------------------------------------------------------------- WSDLrScheduler


def test_num_warmup_steps_none_is_one_percent_and_a_warmup_may_overlap_the_decay() -> None:
    assert WSDLrScheduler(optimizer_with(0.1), total_steps=1000, num_warmup_steps=None).num_warmup_steps == 10
    overlapping = WSDLrScheduler(
        optimizer_with(0.1), total_steps=100, num_warmup_steps=95, warmup_starting_lr=0.0
    )
    assert values_at(overlapping, 92)[0] == pytest.approx(0.1 * 92 / 95)  # the warm-up wins over the decay
    assert values_at(overlapping, 96)[0] < 0.1


def test_create_scheduler_fn_has_the_original_signature_and_defaults() -> None:
    parameters = inspect.signature(WSDLrScheduler.create_scheduler_fn).parameters
    assert list(parameters)[:9] == [
        "total_num_epochs",
        "num_update_steps_per_epoch",
        "num_warmup_epochs",
        "decay_phase_ratio",
        "lr_min",
        "warmup_starting_lr",
        "use_inverse_sqrt_decay",
        "num_checkpoints",
        "is_continuation_from_checkpoint",
    ]
    defaults = {name: parameter.default for name, parameter in parameters.items()}
    assert defaults["total_num_epochs"] is TrainerPlaceholderValues.NUM_EPOCHS
    assert (
        defaults["num_update_steps_per_epoch"]
        is TrainerPlaceholderValues.PER_PROCESS_NUM_UPDATE_STEPS_PER_EPOCH
    )
    assert [defaults[name] for name in list(parameters)[2:9]] == [None, 0.1, 1e-6, 1e-6, True, 1, False]
    keyword_only = [name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == ["num_epochs", "total_steps", "num_warmup_steps"]


def build(fn: functools.partial) -> WSDLrScheduler:
    return replace_trainer_placeholder_values(STAND_IN_TRAINER, fn)(optimizer_with(0.1))


def test_create_scheduler_fn_with_the_original_keywords() -> None:
    scheduler = build(
        WSDLrScheduler.create_scheduler_fn(total_num_epochs=4, num_warmup_epochs=1, num_checkpoints=3)
    )
    assert (scheduler.total_steps, scheduler.num_warmup_steps, scheduler.checkpoint_steps) == (
        100,
        25,
        [25, 50, 100],
    )
    assert build(WSDLrScheduler.create_scheduler_fn()).num_warmup_steps == 1  # None: 1% of 100
    assert (
        build(WSDLrScheduler.create_scheduler_fn(num_warmup_epochs=0.5)).num_warmup_steps == 12
    )  # int(12.5)
    positional = build(WSDLrScheduler.create_scheduler_fn(2, 10, 1))
    assert (positional.total_steps, positional.num_warmup_steps) == (20, 10)


def test_create_scheduler_fn_with_our_keywords() -> None:
    assert build(WSDLrScheduler.create_scheduler_fn(num_epochs=2)).total_steps == 50
    by_steps = build(WSDLrScheduler.create_scheduler_fn(total_steps=40, num_warmup_steps=4))
    assert (by_steps.total_steps, by_steps.num_warmup_steps) == (40, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"total_num_epochs": 3, "num_epochs": 3},
            r"Give the number of epochs once: total_num_epochs=3 \(0.1.61's name\) or "
            r"num_epochs=3, not both",
        ),
        (
            {"num_warmup_epochs": 1, "num_warmup_steps": 5},
            r"Give the warm-up once: num_warmup_epochs=1 \(0.1.61's name\) "
            r"or num_warmup_steps=5, not both",
        ),
        (
            {"total_steps": 100, "total_num_epochs": 3},
            r"either as total_steps=100 or as the number of epochs",
        ),
        ({"total_steps": 100, "num_epochs": 3}, r"either as total_steps=100 or as the number of epochs"),
        (
            {"total_steps": 100, "num_update_steps_per_epoch": 10},
            r"num_update_steps_per_epoch=10. Drop one of them",
        ),
    ],
)
def test_create_scheduler_fn_rejects_conflicting_pairs(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WSDLrScheduler.create_scheduler_fn(**kwargs)


def test_lr_min_is_a_ratio_of_each_groups_peak() -> None:
    scheduler = WSDLrScheduler(optimizer_with(0.1, 0.05), total_steps=100, lr_min=0.01)
    for _ in range(100):
        scheduler.step()
    assert [lr(scheduler, 0), lr(scheduler, 1)] == [pytest.approx(0.001), pytest.approx(0.0005)]


@pytest.mark.parametrize(
    ("use_inverse_sqrt_decay", "expected"),
    [
        (True, [0.1, 0.0505, 0.0300, 0.01426, 0.001496, 0.001]),
        (False, [0.1, 0.003883, 0.00198, 0.001329, 0.00101, 0.001]),
    ],
)
def test_the_two_decay_formulas_give_the_worked_numbers(
    use_inverse_sqrt_decay: bool, expected: list[float]
) -> None:
    scheduler = WSDLrScheduler(
        optimizer_with(0.1), total_steps=1000, lr_min=0.01, use_inverse_sqrt_decay=use_inverse_sqrt_decay
    )
    assert values_at(scheduler, 0, 900) == [0.1, 0.1]
    assert values_at(scheduler, 900, 925, 950, 975, 999, 1000) == pytest.approx(expected, rel=1e-3)
    # The first decayed update is 902: update k uses value(k - 1), and value(901) is below the peak.
    assert values_at(scheduler, 901)[0] < 0.1


@pytest.mark.parametrize(
    ("num_checkpoints", "checkpoints", "pre_decay"),
    [
        (1, [1000], [900]),
        (2, [250, 1000], [225, 925]),
        (3, [250, 500, 1000], [225, 475, 950]),
        (4, [250, 397, 630, 1000], [225, 383, 607, 963]),
    ],
)
def test_the_layout_and_its_pre_decay_steps(
    num_checkpoints: int, checkpoints: list[int], pre_decay: list[int]
) -> None:
    scheduler = WSDLrScheduler(optimizer_with(0.1), total_steps=1000, num_checkpoints=num_checkpoints)
    assert scheduler.get_checkpoint_steps() == checkpoints
    assert [info["pre_decay_step"] for info in scheduler.get_decay_info()] == pre_decay
    assert scheduler.get_decay_start_steps() == pre_decay
    starts = [0, *checkpoints[:-1]]
    assert [info["decay_steps"] for info in scheduler.get_decay_info()] == [
        max(1, int(0.1 * (end - start))) for start, end in zip(starts, checkpoints, strict=True)
    ]


def test_around_an_intermediate_checkpoint() -> None:
    scheduler = WSDLrScheduler(optimizer_with(0.1), total_steps=1000, lr_min=0.01, num_checkpoints=3)
    assert values_at(scheduler, 249, 250, 251) == pytest.approx([0.003, 0.001, 0.1], rel=1e-3)


def test_introspection_of_the_original() -> None:
    scheduler = WSDLrScheduler(optimizer_with(0.1), total_steps=1000, num_checkpoints=3)
    keys = ("period_start", "period_end", "decay_steps", "pre_decay_step")
    assert [tuple(info[k] for k in keys) for info in scheduler.get_decay_info()] == [
        (0, 250, 25, 225),
        (250, 500, 25, 475),
        (500, 1000, 50, 950),
    ]
    assert tuple(scheduler.get_phase_info(250)[k] for k in keys) == (0, 250, 25, 225)
    assert tuple(scheduler.get_phase_info(251)[k] for k in keys) == (250, 500, 25, 475)
    beyond = scheduler.get_phase_info(1500)
    assert tuple(beyond[k] for k in keys) == (500, 1000, 50, 950)
    # Ours' keys are merged in (WSDCheckpointCallback reads them).
    assert (
        scheduler.get_phase_info(251)["checkpoint_step"] == 500
        and scheduler.get_phase_info(251)["phase"] == "stable"
    )
    assert scheduler.checkpoint_steps == [250, 500, 1000]
    assert scheduler.checkpoint_decay_info == scheduler.get_decay_info()
    assert scheduler.base_lr_values == [0.1]
    assert scheduler.previous_checkpoint_step is None
    for _ in range(225):
        scheduler.step()
    assert scheduler.get_current_step() == 225  # changed from 0.1.61: completed updates
    assert scheduler.get_current_phase_info() == scheduler.get_phase_info(225)
    assert scheduler.previous_checkpoint_step == 224
    assert scheduler.state_dict()["previous_checkpoint_step"] == 224


def saved_first_run_state(peak: float = 0.1) -> dict[str, Any]:
    first = WSDLrScheduler(optimizer_with(peak), total_steps=1000, num_warmup_steps=10, lr_min=0.01)
    for _ in range(600):
        first.step()
    return first.state_dict()


@pytest.mark.parametrize("original_form", [False, True], ids=["our_state", "original_state"])
def test_a_continuation_is_a_fresh_stable_phase_at_the_saved_peak(original_form: bool) -> None:
    state = saved_first_run_state()
    if original_form:  # 0.1.61 saved no counter
        state = {k: v for k, v in state.items() if k not in ("_num_updates", "num_updates")}
    continued = WSDLrScheduler(
        optimizer_with(0.5), total_steps=50, num_warmup_steps=10, is_continuation_from_checkpoint=True
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a continuation keeps its counter on purpose: no warning
        continued.load_state_dict(state)
    assert continued.is_continuation_from_checkpoint and continued.num_updates == 0
    assert (continued.total_steps, continued.checkpoint_steps, continued.lr_min) == (50, [50], 0.01)
    assert continued.base_lr_values == [0.1] and lr(continued) == 0.1  # the saved peak, no warm-up
    assert values_at(continued, 44, 45) == [0.1, 0.1] and values_at(continued, 46)[0] < 0.1
    assert values_at(continued, 50)[0] == pytest.approx(0.001)


def test_a_non_continuation_restores_everything_counter_included() -> None:
    restored = WSDLrScheduler(optimizer_with(0.5), total_steps=50)
    restored.load_state_dict(saved_first_run_state())
    assert (restored.num_updates, restored.total_steps, restored.num_warmup_steps) == (600, 1000, 10)
    assert lr(restored) == 0.1
