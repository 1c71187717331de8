"""Runs that must end with exit code 0 on every process, under real ``torchrun`` (the interpreter's
own exit is what is tested: a forked process ends without finalizing the interpreter).

``--kind``:

- ``evaluate``: ``Trainer(model, loss, None).evaluate(...)`` on 101 samples, batch size 1;
- ``train-eval-predict``: one epoch of training with evaluation, then ``evaluate()`` and ``predict()``;
- ``async-save``: one epoch of training with ``SaveTrainingStateCallback(..., asynchronous=True)``;
- ``freed-at-exit`` (with a Trainer) and ``plain-freed-at-exit`` (plain torch): the last collective's
  tensors are freed by gloo's worker thread while the interpreter finalizes, every time (see
  :func:`collective_freed_at_exit`);
- ``plain``: a plain torch gloo script (50 all-reduces, then a barrier), no library code;
- ``plain-destroyed``: the same, ending with ``torch.distributed.destroy_process_group()``, as
  docs/launching.md asks of a user's own gloo code.

scripts/stress_exit.py launches these many times and counts the aborts.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

KINDS = (
    "evaluate",
    "train-eval-predict",
    "async-save",
    "freed-at-exit",
    "plain-freed-at-exit",
    "plain",
    "plain-destroyed",
)


class ReleasesTheGilWhileFinalizing:
    """Deleted with the module's globals, after the interpreter has begun to finalize."""

    def __del__(self) -> None:
        time.sleep(0.2)


def collective_freed_at_exit() -> None:
    """The abort at exit made certain: a collective whose only owner is gloo's worker thread (its
    Work dropped at once) completes while the main thread holds the GIL (a switch interval of
    100 s, a busy wait); the worker thread waits for the GIL to free the collective's tensor. The
    main thread then finishes the script, and while the interpreter finalizes it releases the GIL
    (:class:`ReleasesTheGilWhileFinalizing`): Python ends the worker thread, whose stack unwinds
    through the collective's ``noexcept`` destructor, and ``std::terminate`` aborts the process."""
    globals()["releases_the_gil"] = ReleasesTheGilWhileFinalizing()
    total = torch.ones(3)
    globals()["total"] = total  # a tensor Python knows, so freeing it needs the GIL
    sys.setswitchinterval(100)
    dist.all_reduce(total, async_op=True)
    end = time.monotonic() + 2
    while time.monotonic() < end:  # keeps the GIL while the collective completes
        pass


def with_trainer(kind: str, folder: Path) -> None:
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import DEFAULT_CALLBACKS, SaveTrainingStateCallback

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(101, 4, generator=generator), torch.randn(101, 1, generator=generator))
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    if kind == "freed-at-exit":  # its model, now a DistributedDataParallel, holds the process group
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=())
        trainer.train(data, num_epochs=1, per_device_batch_size=50)
        globals()["trainer"] = trainer
        return
    if kind == "evaluate":
        Trainer(model, nn.MSELoss(), None).evaluate(data, per_device_batch_size=1)
        return
    callbacks = DEFAULT_CALLBACKS
    if kind == "async-save":
        saves = SaveTrainingStateCallback(folder / "states", save_every_n_steps=5, asynchronous=True)
        callbacks = (*DEFAULT_CALLBACKS, saves)
    trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=callbacks)
    trainer.train(data, num_epochs=1, eval_dataset=data, per_device_batch_size=4)
    if kind == "train-eval-predict":
        trainer.evaluate(data, per_device_batch_size=4)
        trainer.predict(data, per_device_batch_size=4)


def plain(destroy: bool) -> None:
    dist.init_process_group("gloo")
    total = torch.ones(3)
    for _ in range(50):
        dist.all_reduce(total)
    dist.barrier()
    if destroy:
        dist.destroy_process_group()


def main() -> None:
    from common import parse_args, write_result

    args = parse_args({"kind": "evaluate"})
    if args.kind not in KINDS:
        raise SystemExit(f"--kind must be one of {KINDS}, got {args.kind!r}")
    if args.kind in ("plain", "plain-destroyed"):
        plain(destroy=args.kind == "plain-destroyed")
    elif args.kind == "plain-freed-at-exit":
        dist.init_process_group("gloo")
    else:
        with_trainer(args.kind, args.out)
    write_result(args.out, {"kind": args.kind, "pid": os.getpid()})
    if args.kind.endswith("freed-at-exit"):
        collective_freed_at_exit()


if __name__ == "__main__":
    main()
