"""The step metrics are right: checked against plain oracles computed from what each batch gave.

A recording callback keeps every batch's loss and weight (``batch_size``, or
``num_items_in_batch``) and the update it belongs to; the oracle of ``train_loss`` at a point is
their weighted mean over the batches since the previous point. The other metrics are checked
against torch (the gradient norm), the optimizer's learning rates, and the relations between
the metrics of one point (samples = samples_per_second x step_time_seconds x updates).
Resume: a run resumed from a state saved at a step where no point is due, or at an epoch end,
records bitwise the same series as the uninterrupted run. Cost: on the steps where nothing is
logged, step metrics make no device-to-host read (the last section).
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import Dataset

import pytorch_accelerated
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    MoveModulesToDeviceCallback,
    SaveTrainingStateCallback,
    TerminateOnNaNCallback,
    TrackingCallback,
    TrainerCallback,
)
from tests.helpers import AskForStepMetrics, make_regression_data

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
            trainer.loop_state.step_metrics.request(4, grad_norm=max_grad_norm is None)

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
    """Sleeps 20 ms in each ``__getitem__``: the loop mostly waits for data."""

    def __init__(self) -> None:
        self.data = make_regression_data(16)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        time.sleep(0.02)  # long beside a step even on a loaded machine
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


# ---------------------------------------------------------------------------- no device read on unlogged steps
#
# Step metrics cost no device-to-host read on the steps where nothing is logged.
#
# A run of 210 updates (3 epochs of 70) logs every 50 updates with ``TrackingCallback(["csv"])``,
# checks for NaN every 50 updates with ``TerminateOnNaNCallback``, and has no progress bar.
# While it trains, two counters watch every host read of a tensor's value:
#
# - a :class:`~torch.overrides.TorchFunctionMode` sees the Python-level reads: ``item``,
#   ``tolist``, ``__bool__`` (``if tensor:``), ``__float__``, ``__int__``, ``__index__``,
#   ``__format__`` / ``__repr__`` (printing), ``numpy``, ``cpu`` and ``to`` with a CPU device (other than the device trained on:
#   moving a value to the Trainer's own device is not a read, so on a CPU run ``cpu()`` is the
#   form counted);
# - a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees the reads that reach
#   ATen (``_local_scalar_dense``, ``is_nonzero``, ``equal``) and the data-dependent ops that
#   wait for the device (``nonzero``, ``masked_select``, ``unique``), also when they are made
#   inside a torch function rather than by a Python-level method.
#
# A read is the library's when the code that made it (the first frame past the counter and
# torch's own plumbing: ``torch/overrides.py``, ``torch/_tensor.py``, ``torch/_tensor_str.py``,
# ``torch/_compile.py``, ``torch/utils/_python_dispatch.py``, ``torch/_dynamo``) is in the ``pytorch_accelerated``
# package. Reads made inside other packages are not counted as the library's, even when the
# library called that package: ``torch.optim`` (an optimizer reads its own CPU step counters
# by design, e.g. Adam's ``_get_value``; here SGD makes none), ``torch.nn.utils`` and
# accelerate's data loader (``send_to_device`` calls ``to(device)`` on every batch: on a CPU
# device a no-op move, on an accelerator a host-to-device copy, not a read). They are kept in the
# records, so a failure message shows them too.
#
# Each read is tagged with the number of the training batch it happened in (counted by a callback
# at ``on_train_step_start``) and the event being fired. The library may read only on the
# batches that complete an update whose number is a multiple of 50, after the last batch of an
# epoch (the epoch's loss and NaN check), and before the first or after the last batch (run start
# and end). A second test shows the counter catches a callback that reads
# ``trainer.running_loss`` on every step. On a GPU the same run is made under
# ``torch.cuda.set_sync_debug_mode("error")`` for the batches where nothing is due.

EVERY = 50


SYNCS_BATCH_SIZE = 2


BATCHES_PER_EPOCH = 70


NUM_EPOCHS = 3


LIBRARY_DIR = str(Path(pytorch_accelerated.__file__).resolve().parent)


TORCH_DIR = str(Path(torch.__file__).resolve().parent)


# torch's own plumbing between a read and the code that asked for it.
PLUMBING = tuple(
    f"{TORCH_DIR}/{part}"
    for part in (
        "overrides.py",
        "_tensor.py",
        "_tensor_str.py",
        "_compile.py",
        "utils/_python_dispatch.py",
        "_dynamo/",
    )
)


READ_METHODS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
    torch.Tensor.__index__, torch.Tensor.__format__, torch.Tensor.__repr__, torch.Tensor.numpy, torch.Tensor.cpu,
}  # fmt: skip


READ_OPS = (
    "aten::_local_scalar_dense",
    "aten::is_nonzero",
    "aten::equal",
    "aten::nonzero",
    "aten::masked_select",
    "aten::_unique",
)


@dataclass(frozen=True)
class Read:
    """One host read: what read, who made it (package and ``file:line``), and when."""

    what: str
    owner: str  # "library", "accelerate", "torch" or "other"
    where: str
    batch: int  # training batches started so far in the run (0 before the first)
    global_step: int
    batch_index: int
    event: str | None  # the event being fired, else the last one fired (with a "after " prefix)


@functools.cache
def _real_path(filename: str) -> str:
    """The file's path with symlinks resolved (torch may be imported through a symlinked venv)."""
    return str(Path(filename).resolve())


def _caller() -> tuple[str, str]:
    """The package and ``file:line`` of the code that made the read being counted."""
    frame = sys._getframe(2)
    while frame is not None and (
        _real_path(frame.f_code.co_filename).startswith(PLUMBING) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "other", "?"
    filename = _real_path(frame.f_code.co_filename)
    where = f"{filename}:{frame.f_lineno}"
    if filename.startswith(LIBRARY_DIR):
        return "library", where
    if "/accelerate/" in filename:
        return "accelerate", where
    if filename.startswith(TORCH_DIR):
        return "torch", where
    return "other", where


def _is_read(func: Any, args: tuple, kwargs: dict, trainer_device: torch.device) -> bool:
    if func in READ_METHODS:
        return True
    if func is torch.Tensor.to:  # a move to the host, by device, by device name, or like a CPU tensor
        targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
        devices = [
            torch.device(t) if isinstance(t, (str, torch.device)) else t.device
            for t in targets
            if isinstance(t, (str, torch.device, torch.Tensor))
        ]
        # A move to the device the Trainer trains on is not a read (on a CPU run, that is every
        # to(cpu): there, cpu() is the form counted).
        return any(device.type == "cpu" and device != trainer_device for device in devices)
    return False


class HostReadCounter(TrainerCallback):
    """Counts the host reads made while its modes are active (see the module docstring); as a
    callback it counts the training batches started, to tag each read."""

    def __init__(self) -> None:
        self.function_reads: list[Read] = []
        self.dispatch_reads: list[Read] = []
        self.batch = 0
        self.trainer: Trainer | None = None
        counter = self

        class Functions(TorchFunctionMode):
            def __torch_function__(
                self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
            ) -> Any:
                kwargs = kwargs or {}
                if counter.trainer is not None and _is_read(func, args, kwargs, counter.trainer.device):
                    counter.function_reads.append(counter._read(getattr(func, "__name__", str(func))))
                return func(*args, **kwargs)

        class Dispatches(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
            ) -> Any:
                if func.name().startswith(READ_OPS):
                    counter.dispatch_reads.append(counter._read(func.name()))
                return func(*args, **(kwargs or {}))

        self.modes = (Functions(), Dispatches())

    def _read(self, what: str) -> Read:
        owner, where = _caller()
        trainer = self.trainer
        assert trainer is not None
        handler = trainer.callback_handler
        event = handler.current_event or (f"after {handler.last_event}" if handler.last_event else None)
        progress = trainer.progress
        return Read(what, owner, where, self.batch, progress.global_step, progress.batch_index, event)

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.batch += 1

    def train(self, trainer: Trainer, **train_kwargs: Any) -> None:
        self.trainer = trainer
        with self.modes[0], self.modes[1]:
            trainer.train(**train_kwargs)


def make_run(
    tmp_path: Path, *extra_callbacks: TrainerCallback, first: tuple[TrainerCallback, ...] = ()
) -> tuple[Trainer, HostReadCounter]:
    counter = HostReadCounter()
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))
    callbacks = (
        *first,
        counter,
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback(check_every_n_steps=EVERY),
        TrackingCallback(["csv"], log_every_n_steps=EVERY, logging_dir=tmp_path, log_grad_norm=True),
        *extra_callbacks,
    )
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), callbacks=callbacks
    )
    return trainer, counter


def train(
    trainer: Trainer, counter: HostReadCounter, accumulation: int = 1, max_grad_norm: float | None = None
) -> None:
    counter.train(
        trainer,
        train_dataset=make_regression_data(BATCHES_PER_EPOCH * SYNCS_BATCH_SIZE),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=SYNCS_BATCH_SIZE,
        gradient_accumulation_steps=accumulation,
        max_grad_norm=max_grad_norm,
    )


STEP_EVENTS = (
    "on_train_step_start",
    "after on_train_step_start",
    "on_step_metrics",
    "after on_step_metrics",
    "on_train_step_end",
)


def is_allowed(read: Read, accumulation: int) -> bool:
    """Whether the library may read here: before the first batch (run start), in a batch that
    completes a logged update, or after an epoch's last batch has ended (the epoch's end, the
    next one's start, the run's end)."""
    if read.batch == 0 or read.batch % (EVERY * accumulation) == 0:
        return True
    return read.event not in STEP_EVENTS and read.batch % BATCHES_PER_EPOCH == 0


def reads_at_unlogged_steps(reads: list[Read], accumulation: int = 1) -> list[Read]:
    return [read for read in reads if read.owner == "library" and not is_allowed(read, accumulation)]


def describe(reads: list[Read]) -> str:
    return "\n".join(map(str, reads[:20])) + (f"\n... and {len(reads) - 20} more" if len(reads) > 20 else "")


@pytest.mark.parametrize(
    ("accumulation", "max_grad_norm"), [(1, None), (2, 1.0)], ids=["plain", "accumulation_and_clipping"]
)
def test_the_library_reads_no_device_value_on_steps_where_nothing_is_logged(
    tmp_path: Path, accumulation: int, max_grad_norm: float | None
) -> None:
    trainer, counter = make_run(tmp_path)
    train(trainer, counter, accumulation, max_grad_norm)
    updates = NUM_EPOCHS * BATCHES_PER_EPOCH // accumulation
    assert trainer.progress.global_step == updates
    logged = [step for step, _ in trainer.run_history.get_step_metric_values("train_loss")]
    assert logged == list(range(EVERY, updates + 1, EVERY))

    for reads in (counter.function_reads, counter.dispatch_reads):
        unexpected = reads_at_unlogged_steps(reads, accumulation)
        assert not unexpected, (
            f"the library read device values on steps where nothing is due:\n{describe(unexpected)}"
        )
    # The counter sees the reads that are due: the point's one read, the NaN check's, bounded.
    in_steps = [
        r for r in counter.function_reads if r.owner == "library" and r.batch % BATCHES_PER_EPOCH != 0
    ]
    per_point = {step: [r for r in in_steps if r.batch == step * accumulation] for step in logged}
    assert all(1 <= len(reads) <= 3 for reads in per_point.values()), describe(in_steps)
    assert any("step_metrics.py" in r.where and r.what == "tolist" for r in per_point[EVERY]), describe(
        in_steps
    )
    assert any(r.event == "on_train_step_end" for r in per_point[EVERY]), describe(in_steps)  # the NaN check


class ReadsRunningLoss(TrainerCallback):
    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        trainer.running_loss  # noqa: B018 (the read is the point)


def test_the_counter_catches_a_callback_reading_the_running_loss_every_step(tmp_path: Path) -> None:
    trainer, counter = make_run(tmp_path, ReadsRunningLoss())
    train(trainer, counter)
    unexpected = reads_at_unlogged_steps(counter.function_reads)
    batches = NUM_EPOCHS * BATCHES_PER_EPOCH
    steps_with_a_read = {read.batch for read in unexpected}
    assert len(steps_with_a_read) == batches - batches // EVERY  # every batch but the logged ones
    assert {(read.what, Path(read.where.split(":")[0]).name) for read in unexpected} == {
        ("__float__", "run_history.py")
    }
    assert reads_at_unlogged_steps(counter.dispatch_reads)  # the same reads, seen at the ATen level


class SyncsAreErrors(TrainerCallback):
    """Makes every device synchronisation an error from the start of a batch where nothing is
    due to the end of its ``on_train_step_end`` (put one first and one last in the callbacks)."""

    def __init__(self, first: bool) -> None:
        self.first = first

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        if self.first and (trainer.progress.global_step + 1) % EVERY != 0:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_step_end(self, trainer: Trainer, **kwargs: Any) -> None:
        if not self.first:
            torch.cuda.set_sync_debug_mode("default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_steps_where_nothing_is_logged_make_no_device_synchronisation(tmp_path: Path) -> None:
    trainer, counter = make_run(tmp_path, SyncsAreErrors(first=False), first=(SyncsAreErrors(first=True),))
    try:
        train(trainer, counter, max_grad_norm=1.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert trainer.device.type == "cuda"
    assert [step for step, _ in trainer.run_history.get_step_metric_values("train_loss")] == [
        50,
        100,
        150,
        200,
    ]
