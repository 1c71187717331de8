"""``torch.compile`` with the Trainer, on the CPU (docs/recipes/compile.md).

A whole compiled model, and one compiled by regions (``pytorch_accelerated.utils.compile_regions``
and accelerate's ``--dynamo_use_regional_compilation``), train, evaluate and predict to the same
numbers as the plain model; each mode (training, evaluation) compiles once, and switching between
them compiles nothing more; checkpoints and training states move between compiled and plain
models both ways. Compilations are counted by a backend that records every graph it is given
(it runs them as they are, so these tests take seconds); one test compiles for real with
inductor. tests/compat/test_compat_checkpoints.py covers the 0.1.61 checkpoint forms.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import TrainerCallback
from pytorch_accelerated.utils import compile_regions
from tests.helpers import make_regression_data, subprocess_env
from tests.helpers import make_trainer as make_any_trainer

DATA = make_regression_data(16)  # 4 batches of 4: every batch has one shape


class CountingBackend:
    """A ``torch.compile`` backend that records each graph it compiles and runs it unchanged."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        self.graphs.append(graph)
        return graph.forward


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = nn.Linear(8, 8), nn.BatchNorm1d(8)  # batch norm: train and eval differ

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.norm(self.linear(x)))


class Blocks(nn.Module):
    """Three blocks of one class (what regional compilation compiles once) between two layers."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.blocks, self.head = (
            nn.Linear(3, 8),
            nn.ModuleList(Block() for _ in range(3)),
            nn.Linear(8, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CountAtEpochEnds(TrainerCallback):
    """Records how many graphs ``backend`` compiled by the end of each epoch (after its evaluation)."""

    def __init__(self, backend: CountingBackend) -> None:
        self.backend, self.counts = backend, []

    def on_eval_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        self.counts.append(len(self.backend.graphs))


make_trainer = functools.partial(make_any_trainer, momentum=0.9)


def plain_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return trainer.get_model(keep_torch_compile=False).state_dict()


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert list(a) == list(b) and all(value.isfinite().all() for value in a.values())
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-6, atol=1e-7, msg=name)


def train_three_epochs(model: nn.Module, backend: CountingBackend | None = None) -> tuple[Trainer, list[int]]:
    counter = CountAtEpochEnds(backend or CountingBackend())
    trainer = make_trainer((counter,), model=model)
    trainer.train(DATA, num_epochs=3, eval_dataset=DATA, per_device_batch_size=4)
    return trainer, counter.counts


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Forget earlier compilations: dynamo keeps at most ``recompile_limit`` graphs per function
    (modules share ``forward`` code), and runs eagerly, silently, past it."""
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def plain_run() -> Trainer:
    return train_three_epochs(Blocks())[0]


def test_a_compiled_model_trains_evaluates_and_predicts_like_the_plain_one(plain_run: Trainer) -> None:
    backend = CountingBackend()
    trainer, counts = train_three_epochs(torch.compile(Blocks(), backend=backend), backend)
    assert counts == [2, 2, 2]  # one graph for training, one for evaluation; switching adds none
    assert_same_weights(plain_weights(trainer), plain_weights(plain_run))
    assert trainer.run_history.get_metric_values("eval_loss_epoch") == pytest.approx(
        plain_run.run_history.get_metric_values("eval_loss_epoch"), rel=1e-6
    )
    assert trainer.evaluate(DATA, per_device_batch_size=4) == pytest.approx(
        plain_run.evaluate(DATA, per_device_batch_size=4)
    )
    torch.testing.assert_close(
        trainer.predict(DATA, per_device_batch_size=4), plain_run.predict(DATA, per_device_batch_size=4)
    )
    assert len(backend.graphs) == 2  # evaluate and predict reuse the evaluation graph


def test_regional_compilation_compiles_each_kind_of_block_once(plain_run: Trainer) -> None:
    backend = CountingBackend()
    model = compile_regions(Blocks(), backend=backend)
    assert all(type(block).__name__ == "OptimizedModule" for block in model.blocks)
    trainer, counts = train_three_epochs(model, backend)
    # embed, one Block for all three, head: 3 graphs per mode, where compiling the whole model
    # traces the three blocks into one graph per mode; switching modes compiles nothing more.
    assert counts == [6, 6, 6]
    assert_same_weights(plain_weights(trainer), plain_weights(plain_run))
    assert type(trainer.get_model(keep_torch_compile=False)) is Blocks


def test_compile_regions_refuses_a_model_that_is_already_compiled() -> None:
    with pytest.raises(ValueError, match=r"already compiled \(OptimizedModule\); pass the plain model"):
        compile_regions(torch.compile(Blocks(), backend="eager"), backend="eager")


@pytest.mark.parametrize("compile_model", [torch.compile, compile_regions], ids=["whole", "regions"])
def test_checkpoints_move_between_compiled_and_plain_models_both_ways(
    compile_model: Any, tmp_path: Path
) -> None:
    compiled = make_trainer(model=compile_model(Blocks(), backend=CountingBackend()))
    compiled.train(DATA, num_epochs=1, per_device_batch_size=4)
    compiled.save_checkpoint(tmp_path / "compiled.pt")
    assert list(torch.load(tmp_path / "compiled.pt", weights_only=True)["model_state_dict"]) == list(
        Blocks().state_dict()
    )
    plain = make_trainer(model=Blocks(seed=1))
    plain.load_checkpoint(tmp_path / "compiled.pt")
    assert_same_weights(plain_weights(plain), plain_weights(compiled))
    plain.save_checkpoint(tmp_path / "plain.pt")
    back = make_trainer(model=compile_model(Blocks(seed=2), backend=CountingBackend()))
    back.load_checkpoint(tmp_path / "plain.pt")
    assert_same_weights(plain_weights(back), plain_weights(compiled))
    assert back.optimizer.state_dict()["state"].keys() == compiled.optimizer.state_dict()["state"].keys()


def test_a_run_resumes_from_compiled_to_plain_and_back_to_the_uninterrupted_weights(
    plain_run: Trainer, tmp_path: Path
) -> None:
    compiled = make_trainer(model=compile_regions(Blocks(), backend=CountingBackend()))
    compiled.train(DATA, num_epochs=1, eval_dataset=DATA, per_device_batch_size=4)
    compiled.save_training_state(tmp_path / "epoch1")
    plain = make_trainer(model=Blocks(seed=1))
    plain.train(
        DATA, num_epochs=2, eval_dataset=DATA, per_device_batch_size=4, resume_from=tmp_path / "epoch1"
    )
    plain.save_training_state(tmp_path / "epoch2")
    back = make_trainer(model=torch.compile(Blocks(seed=2), backend=CountingBackend()))
    back.train(
        DATA, num_epochs=3, eval_dataset=DATA, per_device_batch_size=4, resume_from=tmp_path / "epoch2"
    )
    assert back.progress.global_step == plain_run.progress.global_step == 12
    assert_same_weights(plain_weights(back), plain_weights(plain_run))


def test_inductor_compiles_the_model_for_real_once_per_mode() -> None:
    def small_model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))

    before = counters["stats"]["unique_graphs"]
    trainer = make_trainer(
        model=torch.compile(small_model())
    )  # the default backend, inductor: C++ built with gcc
    trainer.train(DATA, num_epochs=1, eval_dataset=DATA, per_device_batch_size=4)
    trained = {name: value.clone() for name, value in plain_weights(trainer).items()}
    after_one_epoch = counters["stats"]["unique_graphs"]
    trainer.train(DATA, num_epochs=1, eval_dataset=DATA, per_device_batch_size=4)
    assert after_one_epoch - before == 2 and counters["stats"]["unique_graphs"] == after_one_epoch
    reference = make_trainer(model=small_model())
    reference.train(DATA, num_epochs=1, eval_dataset=DATA, per_device_batch_size=4)
    for name, value in plain_weights(reference).items():  # inductor fuses kernels: close, not bitwise
        torch.testing.assert_close(trained[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_accelerate_launch_compiles_by_regions_from_its_dynamo_options(tmp_path: Path) -> None:
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "eager", "--dynamo_use_regional_compilation",
        str(Path(__file__).parent / "workers" / "compile_worker.py"), str(tmp_path / "c.pt"),
    ]  # fmt: skip
    done = subprocess.run(
        command, env=subprocess_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout + done.stderr
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["compiled_blocks"] == ["OptimizedModule"] * 3
    assert result["graphs_after_each_epoch"] == [6, 6, 6]
    assert result["checkpoint_keys"] == result["plain_keys"]
