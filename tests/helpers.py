"""Small models, data sets and recorders shared by the tests."""

from __future__ import annotations

import copy
import os
import socket
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TRAINER_EVENTS, TrainerCallback


def make_regression_data(num_samples: int, num_features: int = 3, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, num_features, generator=generator)
    y = x @ torch.arange(1.0, num_features + 1) + 0.1 * torch.randn(num_samples, generator=generator)
    return TensorDataset(x, y.unsqueeze(1))


def make_linear_model(num_features: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(num_features, 1)


class IndexedDataset(Dataset):
    """Returns (features, target, index), so tests can see which samples a batch held."""

    def __init__(self, base: TensorDataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = self.base[index]
        return x, y, index


class AskForStepMetrics(TrainerCallback):
    """Asks for step metrics every ``every_n_steps`` updates when a run starts, so that
    ``on_step_metrics`` fires (it fires only in runs where a callback asked)."""

    def __init__(self, every_n_steps: int = 1) -> None:
        self.every_n_steps = every_n_steps

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        trainer.loop_state.step_metrics.request(self.every_n_steps)


#: What the recorders write into ``positions``: (progress.epoch, progress.global_step, event).
Position = tuple[int, int, str]


class EventRecorder(TrainerCallback):
    """Records the name of every event it receives into ``log`` and, when given ``positions``,
    ``(trainer.progress.epoch, trainer.progress.global_step, event)`` into it."""

    def __init__(self, log: list[str], positions: list[Position] | None = None) -> None:
        self.log = log
        self.positions = positions

    def record(self, trainer: Any, event: str) -> None:
        self.log.append(event)
        if self.positions is not None:
            self.positions.append((trainer.progress.epoch, trainer.progress.global_step, event))


def _make_recording_hook(event: str) -> Any:
    def hook(self: EventRecorder, trainer: Any, **kwargs: Any) -> None:
        self.record(trainer, event)

    return hook


for _event in TRAINER_EVENTS:
    setattr(EventRecorder, _event, _make_recording_hook(_event))


class RecordingTrainer(Trainer):
    """A Trainer that records each overridable ML step into the same lists as the callback."""

    def __init__(
        self, *args: Any, log: list[str], positions: list[Position] | None = None, **kwargs: Any
    ) -> None:
        self.log = log
        self.positions = positions
        super().__init__(*args, **kwargs)

    def record(self, step: str) -> None:
        self.log.append(step)
        if self.positions is not None:
            self.positions.append((self.progress.epoch, self.progress.global_step, step))

    def calculate_train_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.record("calculate_train_batch_loss")
        return super().calculate_train_batch_loss(batch)

    def backward_step(self, loss: torch.Tensor) -> None:
        self.record("backward_step")
        super().backward_step(loss)

    def _clip_gradients(self) -> None:
        self.record("_clip_gradients")
        super()._clip_gradients()

    def optimizer_step(self) -> None:
        self.record("optimizer_step")
        super().optimizer_step()

    def scheduler_step(self) -> None:
        self.record("scheduler_step")
        super().scheduler_step()

    def optimizer_zero_grad(self) -> None:
        self.record("optimizer_zero_grad")
        super().optimizer_zero_grad()

    def calculate_eval_batch_loss(self, batch: Any) -> dict[str, Any]:
        self.record("calculate_eval_batch_loss")
        return super().calculate_eval_batch_loss(batch)


#: The default of an argument of :func:`make_trainer` (``None`` is a value some tests pass).
DEFAULT: Any = object()


def make_trainer(
    callbacks: Any = (),
    *,
    model: nn.Module | None = None,
    seed: int = 0,
    loss_func: Any = DEFAULT,
    optimizer: Any = DEFAULT,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.SGD,
    lr: float = 0.01,
    momentum: float | None = None,
    trainer_class: type[Trainer] = Trainer,
    **trainer_kwargs: Any,
) -> Trainer:
    """The suite's trainer factory: model + loss + optimizer + callbacks -> ``trainer_class``.

    By default the linear model of :func:`make_linear_model` (``seed``), ``nn.MSELoss()`` and
    ``optimizer_class(model.parameters(), lr=lr)`` (plus ``momentum`` when given), no callbacks.
    ``model``, ``loss_func`` and ``optimizer`` replace the defaults as given (``None`` too, for
    the tests of bad input); ``callbacks`` is passed as given; ``trainer_kwargs`` go to the
    trainer class (a subclass's own arguments, ``**kwargs`` of ``Trainer``). A module that needs
    other defaults binds them once: ``make_trainer = functools.partial(helpers.make_trainer, lr=0.1)``.
    """
    model = make_linear_model(seed=seed) if model is None else model
    if optimizer is DEFAULT:
        optimizer_kwargs: dict[str, Any] = {"lr": lr}
        if momentum is not None:
            optimizer_kwargs["momentum"] = momentum
        optimizer = optimizer_class(model.parameters(), **optimizer_kwargs)
    loss_func = nn.MSELoss() if loss_func is DEFAULT else loss_func
    return trainer_class(model, loss_func, optimizer, callbacks=callbacks, **trainer_kwargs)


def make_recording_trainer(
    log: list[str], extra_callbacks: tuple = (), positions: list[Position] | None = None, **kwargs: Any
) -> RecordingTrainer:
    return make_trainer(  # type: ignore[return-value]
        (EventRecorder(log, positions), *extra_callbacks),
        trainer_class=RecordingTrainer,
        log=log,
        positions=positions,
        **kwargs,
    )


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of every tensor of the module's state dict, by name."""
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def assert_close_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-6, atol=1e-7)


def snapshot(trainer: Trainer) -> dict[str, Any]:
    """A deep copy of the trainer's model and optimizer state dicts."""
    return copy.deepcopy(
        {"model": trainer.get_model().state_dict(), "optimizer": trainer.optimizer.state_dict()}
    )


def assert_equal_nested(a: Any, b: Any, where: str = "value") -> None:
    """``a`` and ``b`` are equal all the way down: same types, same keys in the same order,
    tensors of the same dtype and values; ``where`` names the place of a difference."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for key in a:
            assert_equal_nested(a[key], b[key], f"{where}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_equal_nested(x, y, f"{where}[{index}]")
    else:
        assert a == b, where


class RecordUpdates(TrainerCallback):
    """The model's (and an EMA callback's) weights after each optimizer update and each epoch."""

    def __init__(self, ema_callback: Any = None) -> None:
        self.ema_callback, self.initial, self._last_step = ema_callback, {}, 0
        self.model_weights: list[dict[str, torch.Tensor]] = []  # index i: after update i + 1
        self.ema_weights: list[dict[str, torch.Tensor]] = []
        self.ema_per_epoch: list[dict[str, torch.Tensor]] = []

    def ema(self) -> dict[str, torch.Tensor]:
        return weights(self.ema_callback.ema_model.module) if self.ema_callback else {}

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        self.initial = weights(trainer.get_model())

    def on_train_step_end(
        self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any
    ) -> None:
        if trainer.progress.global_step != self._last_step:
            self._last_step = trainer.progress.global_step
            self.model_weights.append(weights(trainer.get_model()))
            self.ema_weights.append(self.ema())

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.ema_per_epoch.append(self.ema())


# ---------------------------------------------------------------------------- subprocesses

REPO_ROOT = Path(__file__).resolve().parents[1]

# Variables an outer launcher, an accelerate config or a batch limit may have left in the test
# session's environment: a run started by a test sees only what its own launcher sets.
_INHERITED_SETTINGS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "PT_ACC_LIMIT_BATCHES",
)


def subprocess_env(tmp_dir: Path) -> dict[str, str]:
    """The environment for a script or worker group started by a test: CPU only, one thread per
    process, the package importable, temporary files (torchrun's logs too) under ``tmp_dir``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _INHERITED_SETTINGS and not k.startswith("ACCELERATE_")
    }
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no __pycache__ beside the scripts
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(tmp_dir)
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU (gloo) groups on every machine, as in CI
    # Small models: intra-op threads only add waiting, a lot of it on a busy CI machine.
    env["OMP_NUM_THREADS"] = "1"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def reseal_state(state: Path) -> None:
    """Rewrite the manifest of the training state ``state`` with the checksums of its files as they
    are now, as if it had been saved so: for tests that change a state's files on purpose."""
    import json

    from pytorch_accelerated.checkpoints.directories import SEAL, write_manifest

    manifest = json.loads((state / "manifest.json").read_text())
    write_manifest(state, {key: value for key, value in manifest.items() if key not in (SEAL, "crc32")})


def as_version_1(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` as versions without checksums wrote it (version 1, no ``crc32`` keys)."""
    return {**{k: v for k, v in manifest.items() if k not in ("crc32", "manifest_crc32")}, "version": 1}
