import math

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from pytorch_accelerated.utils import ModelEma


class CountingNet(nn.Module):
    """A small model with batch norm plus an integer and a boolean buffer of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.register_buffer("calls", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("seen", torch.tensor(False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.seen.fill_(True)
        return self.bn(self.linear(x))


def make_model() -> CountingNet:
    torch.manual_seed(0)
    return CountingNet()


def train_a_little(model: nn.Module) -> None:
    """Changes every parameter and, through a forward in training mode, every buffer."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    model.train()
    model(torch.randn(8, 4) * 3 + 1)


def test_update_matches_a_hand_computation_for_every_tensor_over_three_updates():
    model = make_model()
    ema = ModelEma(model, decay=0.9)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        train_a_little(model)
        ema.update(model)
        for name, current in model.state_dict().items():
            if current.is_floating_point():
                expected[name] = 0.9 * expected[name] + 0.1 * current
            else:
                expected[name] = current.clone()
    ema_state = ema.module.state_dict()
    assert ema_state.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(ema_state[name], value, rtol=1e-6, atol=1e-6, msg=name)


def test_integer_and_bool_buffers_are_copied_not_averaged():
    model = make_model()
    ema = ModelEma(model, decay=0.9)
    for _ in range(3):
        train_a_little(model)
    ema.update(model)
    assert ema.module.calls.dtype == torch.int64 and ema.module.calls.item() == 3
    assert ema.module.bn.num_batches_tracked.item() == 3
    assert ema.module.seen.item() is True


def test_ema_of_a_batch_norm_model_averages_running_stats_and_evaluates_with_them():
    model = make_model()
    ema = ModelEma(model, decay=0.5)
    initial_mean = model.bn.running_mean.clone()
    train_a_little(model)
    ema.update(model)
    torch.testing.assert_close(ema.module.bn.running_mean, 0.5 * initial_mean + 0.5 * model.bn.running_mean)

    # In eval mode the outputs depend on the running stats, which set() copies exactly.
    ema.set(model)
    x = torch.randn(5, 4)
    model.eval()
    assert not ema.module.training and not ema.module.bn.training
    torch.testing.assert_close(ema(x), model(x))


def test_set_copies_every_tensor_exactly():
    model = make_model()
    ema = ModelEma(model, decay=0.99)
    train_a_little(model)
    ema.set(model)
    for name, value in model.state_dict().items():
        assert torch.equal(ema.module.state_dict()[name], value), name


def test_copy_is_in_eval_mode_requires_no_grad_and_is_independent_of_the_model():
    model = make_model()
    ema = ModelEma(model)
    assert not ema.module.training
    assert not any(p.requires_grad for p in ema.parameters())
    assert all(p.requires_grad for p in model.parameters())
    before = ema.module.linear.weight.clone()
    train_a_little(model)
    assert torch.equal(ema.module.linear.weight, before)


def test_forward_runs_the_averaged_copy():
    model = make_model()
    ema = ModelEma(model, decay=1.0)
    train_a_little(model)
    ema.update(model)  # decay 1 keeps the initial weights
    x = torch.randn(5, 4)
    torch.testing.assert_close(ema(x), ema.module(x))
    assert not torch.allclose(ema(x), model.eval()(x))


def test_decay_zero_follows_the_model():
    model = make_model()
    ema = ModelEma(model, decay=0.0)
    train_a_little(model)
    ema.update(model)
    torch.testing.assert_close(ema.module.linear.weight, model.linear.weight)


@pytest.mark.parametrize("decay", [-0.1, 1.5, math.nan, "0.9", None, True])
def test_bad_decay_raises_naming_the_value_and_the_valid_range(decay):
    with pytest.raises(ValueError, match=rf"decay must be a number in \[0, 1\], but got {decay!r}\. "):
        ModelEma(make_model(), decay=decay)


def test_update_with_a_different_model_raises_naming_the_mismatch():
    ema = ModelEma(make_model())
    with pytest.raises(ValueError, match=r"missing: \['bn.bias'.*unexpected: \[\]\)\. Pass the same model"):
        ema.update(nn.Sequential())
    with pytest.raises(ValueError, match="differ from the averaged copy's"):
        ema.set(nn.Linear(4, 3))


def test_update_casts_the_model_tensors_to_the_copy_dtype():
    model = make_model()
    ema = ModelEma(model, decay=0.5).to(torch.float64)
    train_a_little(model)
    ema.update(model)
    assert ema.module.linear.weight.dtype == torch.float64
    assert ema.module.calls.dtype == torch.int64 and ema.module.calls.item() == 1


def test_state_dict_round_trips_into_another_model_ema():
    source = ModelEma(make_model(), decay=0.9)
    target = ModelEma(CountingNet(), decay=0.9)  # different random weights
    assert all(key.startswith("module.") for key in source.state_dict())
    assert not torch.equal(target.module.linear.weight, source.module.linear.weight)
    target.load_state_dict(source.state_dict())
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_a_compiled_model_is_unwrapped():
    model = make_model()
    ema = ModelEma(torch.compile(model), decay=0.5)
    assert isinstance(ema.module, CountingNet)
    train_a_little(model)
    ema.set(torch.compile(model))
    assert torch.equal(ema.module.linear.weight, model.linear.weight)


@pytest.fixture
def single_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_distributed_data_parallel_model_is_unwrapped(single_process_group):
    model = make_model()
    ddp_model = nn.parallel.DistributedDataParallel(model)
    ema = ModelEma(ddp_model, decay=0.5)
    assert isinstance(ema.module, CountingNet)
    initial = ema.module.linear.weight.clone()
    train_a_little(model)
    ema.update(ddp_model)
    torch.testing.assert_close(ema.module.linear.weight, 0.5 * initial + 0.5 * model.linear.weight)
