"""2 processes x batch B train exactly like 1 process x batch 2B, and like a plain PyTorch loop.

The data set holds a multiple of 2B x accumulation samples, so no process is ever given padding
and every update averages the same 2B x accumulation samples in all three runs.
"""

from __future__ import annotations

import json
import math
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.launch import start_workers

PER_DEVICE_BATCH = 4
NUM_SAMPLES = 64  # a multiple of 2 x PER_DEVICE_BATCH x 2 (the largest accumulation)
LR, MOMENTUM, SEED = 0.05, 0.9, 42
CONFIGS = [
    {
        "name": "accumulation_1",
        "gradient_accumulation_steps": 1,
        "num_epochs": 2,
        "max_num_train_steps": None,
    },
    {
        "name": "accumulation_2",
        "gradient_accumulation_steps": 2,
        "num_epochs": 2,
        "max_num_train_steps": None,
    },
    # 8 updates per epoch: stops in the middle of the first epoch.
    {
        "name": "accumulation_1_max_steps",
        "gradient_accumulation_steps": 1,
        "num_epochs": 5,
        "max_num_train_steps": 3,
    },
    # 4 updates per epoch: stops in the middle of the second epoch.
    {
        "name": "accumulation_2_max_steps",
        "gradient_accumulation_steps": 2,
        "num_epochs": 5,
        "max_num_train_steps": 6,
    },
]
CONFIG_NAMES = [config["name"] for config in CONFIGS]
MAX_STEP_CONFIGS = [config for config in CONFIGS if config["max_num_train_steps"] is not None]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One torchrun group of 2 processes and one plain 1-process run, each through every config."""
    common_args = [
        "--configs",
        json.dumps(CONFIGS),
        "--num-samples",
        str(NUM_SAMPLES),
        "--lr",
        str(LR),
        "--momentum",
        str(MOMENTUM),
    ]
    two = start_workers(
        "parity.py",
        tmp_path_factory.mktemp("parity_2"),
        *common_args,
        "--batch-size",
        str(PER_DEVICE_BATCH),
        nproc=2,
    )
    one = start_workers(
        "parity.py",
        tmp_path_factory.mktemp("parity_1"),
        *common_args,
        "--batch-size",
        str(2 * PER_DEVICE_BATCH),
        nproc=1,
    )
    return {"two": two.wait().results, "one": one.wait().results[0]}


def plain_pytorch_training(common: ModuleType, config: dict[str, Any]) -> tuple[torch.nn.Module, int]:
    """The 1-process run written as a hand loop: same init, same shuffle order, no accelerate."""
    batch_size, accumulation = 2 * PER_DEVICE_BATCH, config["gradient_accumulation_steps"]
    model = common.make_mlp(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = common.make_data(NUM_SAMPLES)
    steps_per_epoch = math.ceil(math.ceil(NUM_SAMPLES / batch_size) / accumulation)
    max_steps = config["max_num_train_steps"]
    num_epochs = math.ceil(max_steps / steps_per_epoch) if max_steps else config["num_epochs"]
    step = 0
    for epoch in range(num_epochs):
        order = torch.randperm(NUM_SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch))
        batches = order.split(batch_size)
        for start in range(0, len(batches), accumulation):
            window = batches[start : start + accumulation]
            for indices in window:
                (F.mse_loss(model(x[indices]), y[indices]) / len(window)).backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if max_steps is not None and step >= max_steps:
                return model, step
    return model, step


def as_tensors(weights: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value, dtype=torch.float64) for name, value in weights.items()}


def assert_weights_close(actual: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    actual_t, expected_t = as_tensors(actual), as_tensors(expected)
    assert actual_t.keys() == expected_t.keys()
    for name in expected_t:
        difference = (actual_t[name] - expected_t[name]).abs().max().item()
        assert torch.allclose(actual_t[name], expected_t[name], rtol=0, atol=1e-6), (
            f"{what}: parameter {name} differs by up to {difference:.3g}"
        )


def test_worker_runs_used_two_processes_and_one_process(runs: dict[str, Any]) -> None:
    for name in CONFIG_NAMES:
        for rank_result in runs["two"]:
            assert rank_result[name]["num_processes"] == 2
            assert rank_result[name]["world_size"] == 2
        assert runs["one"][name]["num_processes"] == 1


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_two_processes_reach_the_weights_of_one_process_with_twice_the_batch(
    runs: dict[str, Any], name: str
) -> None:
    two, one = runs["two"][0][name], runs["one"][name]
    assert two["num_processes"] == 2 and one["num_processes"] == 1
    assert_weights_close(two["weights"], one["weights"], f"{name}: 2 processes vs 1 process")


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_both_ranks_hold_identical_weights_after_training(runs: dict[str, Any], name: str) -> None:
    rank0, rank1 = (result[name]["weights"] for result in runs["two"])
    for parameter in rank0:
        assert torch.equal(torch.tensor(rank0[parameter]), torch.tensor(rank1[parameter])), parameter


@pytest.mark.parametrize("config", CONFIGS, ids=CONFIG_NAMES)
def test_one_process_trainer_reaches_the_weights_of_a_plain_pytorch_loop(
    runs: dict[str, Any], worker_common: ModuleType, config: dict[str, Any]
) -> None:
    oracle, oracle_steps = plain_pytorch_training(worker_common, config)
    expected = worker_common.state_dict_to_lists(oracle)
    one = runs["one"][config["name"]]
    assert one["global_step"] == oracle_steps
    assert_weights_close(one["weights"], expected, f"{config['name']}: 1-process Trainer vs plain PyTorch")
    assert_weights_close(
        runs["two"][0][config["name"]]["weights"],
        expected,
        f"{config['name']}: 2-process Trainer vs plain PyTorch",
    )


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_update_steps_per_epoch_are_equal_for_one_and_two_processes(runs: dict[str, Any], name: str) -> None:
    one = runs["one"][name]
    for rank_result in runs["two"]:
        two = rank_result[name]
        assert two["num_update_steps_per_epoch"] == one["num_update_steps_per_epoch"]
        assert two["num_epochs"] == one["num_epochs"]
    accumulation = next(c for c in CONFIGS if c["name"] == name)["gradient_accumulation_steps"]
    assert one["num_update_steps_per_epoch"] == NUM_SAMPLES // (2 * PER_DEVICE_BATCH * accumulation)


@pytest.mark.parametrize("config", MAX_STEP_CONFIGS, ids=[c["name"] for c in MAX_STEP_CONFIGS])
def test_max_num_train_steps_stops_one_and_two_processes_at_the_same_global_step(
    runs: dict[str, Any], config: dict[str, Any]
) -> None:
    expected = config["max_num_train_steps"]
    assert runs["one"][config["name"]]["global_step"] == expected
    assert [result[config["name"]]["global_step"] for result in runs["two"]] == [expected, expected]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_train_loss_epoch_is_equal_for_one_and_two_processes(runs: dict[str, Any], name: str) -> None:
    one = runs["one"][name]["train_loss_epoch"]
    for rank_result in runs["two"]:
        two = rank_result[name]["train_loss_epoch"]
        assert len(two) == len(one) > 0
        assert two == pytest.approx(one, rel=1e-6, abs=1e-7)
