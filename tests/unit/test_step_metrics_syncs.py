"""Step metrics cost no device-to-host read on the steps where nothing is logged.

A run of 210 updates (3 epochs of 70) logs every 50 updates with ``TrackingCallback(["csv"])``,
checks for NaN every 50 updates with ``TerminateOnNaNCallback``, and has no progress bar.
While it trains, two counters watch every host read of a tensor's value:

- a :class:`~torch.overrides.TorchFunctionMode` sees the Python-level reads: ``item``,
  ``tolist``, ``__bool__`` (``if tensor:``), ``__float__``, ``__int__``, ``__index__``,
  ``__format__`` / ``__repr__`` (printing), ``numpy``, ``cpu`` and ``to`` with a CPU device (other than the device trained on:
  moving a value to the Trainer's own device is not a read, so on a CPU run ``cpu()`` is the
  form counted);
- a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees the reads that reach
  ATen (``_local_scalar_dense``, ``is_nonzero``, ``equal``) and the data-dependent ops that
  wait for the device (``nonzero``, ``masked_select``, ``unique``), also when they are made
  inside a torch function rather than by a Python-level method.

A read is the library's when the code that made it (the first frame past the counter and
torch's own plumbing: ``torch/overrides.py``, ``torch/_tensor.py``, ``torch/_tensor_str.py``,
``torch/_compile.py``, ``torch/utils/_python_dispatch.py``, ``torch/_dynamo``) is in the ``pytorch_accelerated``
package. Reads made inside other packages are not counted as the library's, even when the
library called that package: ``torch.optim`` (an optimizer reads its own CPU step counters
by design, e.g. Adam's ``_get_value``; here SGD makes none), ``torch.nn.utils`` and
accelerate's data loader (``send_to_device`` calls ``to(device)`` on every batch: on a CPU
device a no-op move, on an accelerator a host-to-device copy, not a read). They are kept in the
records, so a failure message shows them too.

Each read is tagged with the number of the training batch it happened in (counted by a callback
at ``on_train_step_start``) and the event being fired. The library may read only on the
batches that complete an update whose number is a multiple of 50, after the last batch of an
epoch (the epoch's loss and NaN check), and before the first or after the last batch (run start
and end). A second test shows the counter catches a callback that reads
``trainer.running_loss`` on every step. On a GPU the same run is made under
``torch.cuda.set_sync_debug_mode("error")`` for the batches where nothing is due.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import make_regression_data
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import pytorch_accelerated
from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import (
    MoveModulesToDeviceCallback,
    TerminateOnNaNCallback,
    TrackingCallback,
    TrainerCallback,
)

EVERY = 50
BATCH_SIZE = 2
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


def _caller() -> tuple[str, str]:
    """The package and ``file:line`` of the code that made the read being counted."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith(PLUMBING) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "other", "?"
    filename = str(Path(frame.f_code.co_filename).resolve())
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
        train_dataset=make_regression_data(BATCHES_PER_EPOCH * BATCH_SIZE),
        num_epochs=NUM_EPOCHS,
        per_device_batch_size=BATCH_SIZE,
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
        ("__float__", "tracking.py")
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
