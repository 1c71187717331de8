"""Two processes where one stops taking part: signals, dead peers, collectives that hang.

``--mode``:

* ``signal``: one rank receives SIGTERM (sent to itself, so only it has it), first during the
  first evaluation, then (a second run) during training; both ranks must stop at the same
  point, save once, and return from ``train()``.
* ``peer_dies``: rank 1 dies after update 5 without closing its connections (a forked child
  keeps them open, as a data-loader worker or a vanished machine would), so rank 0 blocks in
  the next gradient all-reduce. torchrun then sends rank 0 SIGTERM; the watchdog of
  ``SaveTrainingStateCallback`` must end it within ``PT_ACC_SIGNAL_GRACE`` seconds.
* ``raise_in_train`` / ``raise_in_eval``: rank 1 raises in a callback, during training or
  during the first evaluation, and stays alive without taking part (as a script that catches
  the error would); rank 0 must fail after ``PT_ACC_COLLECTIVE_TIMEOUT`` seconds, with a note
  naming its rank and where it was. In ``raise_in_train`` rank 0 starts 2.5 collective timeouts
  after rank 1: the group must still form (the timeout counts for collectives, not for the wait
  at the start), and the timeout must still hold for the collective rank 1 never reaches.
* ``sleep_in_callback``: rank 1 sleeps in a callback longer than the collective timeout, then
  carries on; rank 0 must fail after the timeout with a note that rank 1 did not reach the
  collective in time (not that it failed).
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from common import RegressionDataset, make_mlp, parse_args, rank, write_result
from torch import nn

from pytorch_accelerated import Trainer
from pytorch_accelerated.callbacks import SaveTrainingStateCallback, TrainerCallback
from pytorch_accelerated.checkpoints.discovery import list_complete_states


class Inject(TrainerCallback):
    """Calls ``action(trainer)`` on rank ``on_rank`` at the first ``event`` where ``when(trainer)``."""

    def __init__(self, event: str, on_rank: int, action: Any, when: Any = lambda trainer: True) -> None:
        self.event, self.on_rank, self.action, self.when = event, on_rank, action, when
        self.done = False

    def _reached(self, trainer: Any, event: str) -> None:
        if event == self.event and rank() == self.on_rank and not self.done and self.when(trainer):
            self.done = True
            self.action(trainer)

    def on_train_step_end(
        self, trainer: Any, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:
            self._reached(trainer, "on_train_step_end")

    def on_eval_step_end(self, trainer: Any, **kwargs: Any) -> None:
        self._reached(trainer, "on_eval_step_end")


def train(out: Path, inject: Inject, **saver_kwargs: Any) -> Trainer:
    model = make_mlp(seed=0)
    saver = SaveTrainingStateCallback(out / "states", **saver_kwargs)
    trainer = Trainer(
        model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.01), callbacks=(inject, saver)
    )
    data = RegressionDataset(32)
    trainer.train(data, num_epochs=2, eval_dataset=RegressionDataset(16, seed=2), per_device_batch_size=2)
    return trainer


def send_sigterm(trainer: Any) -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def stop_by_signal(out: Path) -> dict[str, Any]:
    result = {}
    for name, inject in {
        "evaluation": Inject("on_eval_step_end", 1, send_sigterm),  # first eval batch, epoch 1
        "training": Inject("on_train_step_end", 0, send_sigterm, lambda t: t.progress.global_step == 3),
    }.items():
        handler_before = signal.getsignal(signal.SIGTERM)
        trainer = train(out / name, inject, save_at_end=False, check_signals_every_n_steps=1)
        result[name] = {
            "global_step": trainer.progress.global_step,
            "states": [path.name for _, path in list_complete_states(out / name / "states")],
            "eval_losses": trainer.run_history.get_metric_values("eval_loss_epoch"),
            "handler_restored": signal.getsignal(signal.SIGTERM) == handler_before,
            "wakeup_fd": signal.set_wakeup_fd(-1),
        }
    # A failure on both ranks: the handler and the wakeup fd are put back on this path too.
    handler_before = signal.getsignal(signal.SIGTERM)
    try:
        train(out / "failure", Inject("on_train_step_end", rank(), raise_error))
    except ValueError:
        pass
    result["failure"] = {
        "handler_restored": signal.getsignal(signal.SIGTERM) == handler_before,
        "wakeup_fd": signal.set_wakeup_fd(-1),
    }
    return result


def die_keeping_connections_open(out: Path) -> None:
    """Exit like a crash, but leave the process's sockets open in a forked child."""
    if os.fork() == 0:  # the child: holds the sockets until rank 0 is gone (at most 60 s)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        survivor, deadline = int((out / "pid0").read_text()), time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(survivor, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        os._exit(0)
    (out / "died_at").write_text(repr(time.time()))
    print(f"rank 1 dies at {time.time():.3f}", flush=True)
    os._exit(1)


def raise_error(trainer: Any) -> None:
    raise ValueError(f"rank {rank()} failed on purpose")


def fail_and_linger(out: Path, event: str, late_start: bool) -> None:
    """Rank 1 raises in ``event`` and stays alive without taking part; rank 0 must time out.

    With ``late_start``, rank 0 creates its Trainer 2.5 collective timeouts after rank 1.
    """
    if late_start and rank() == 0:
        time.sleep(2.5 * float(os.environ["PT_ACC_COLLECTIVE_TIMEOUT"]))
    started = time.monotonic()
    try:
        train(out, Inject(event, 1, raise_error, lambda t: t.progress.global_step >= 3), handle_signals=())
    except Exception as error:
        write_result(out, {"error": repr(error), "notes": getattr(error, "__notes__", []),
                           "failed_after_s": time.monotonic() - started})  # fmt: skip
        if rank() == 1:  # wait for rank 0's verdict (torchrun ends this process once it fails)
            deadline = time.monotonic() + 60
            while not (out / "rank0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        traceback.print_exc()
        raise SystemExit(1) from None


def sleep_in_callback(out: Path) -> None:
    """Rank 1 sleeps in ``on_train_step_end`` for 4 collective timeouts, then carries on."""
    timeout_s = float(os.environ["PT_ACC_COLLECTIVE_TIMEOUT"])
    inject = Inject(
        "on_train_step_end", 1, lambda t: time.sleep(4 * timeout_s), lambda t: t.progress.global_step >= 3
    )
    started = time.monotonic()
    try:
        train(out, inject, handle_signals=())
        write_result(out, {"error": None})
    except Exception as error:
        write_result(out, {"error": repr(error), "notes": getattr(error, "__notes__", []),
                           "failed_after_s": time.monotonic() - started})  # fmt: skip
        raise SystemExit(1) from None


def main() -> None:
    args = parse_args({"mode": "signal"})
    (args.out / f"pid{rank()}").write_text(str(os.getpid()))
    if args.mode == "signal":
        write_result(args.out, stop_by_signal(args.out))
    elif args.mode == "peer_dies":
        inject = Inject("on_train_step_end", 1, lambda t: die_keeping_connections_open(args.out),
                        lambda t: t.progress.global_step == 5)  # fmt: skip
        train(args.out, inject, save_at_end=False)
        write_result(args.out, {"finished": True})  # never reached: rank 1 dies, rank 0 is ended
    elif args.mode == "sleep_in_callback":
        sleep_in_callback(args.out)
    else:
        event = {"raise_in_train": "on_train_step_end", "raise_in_eval": "on_eval_step_end"}[args.mode]
        fail_and_linger(args.out, event, late_start=args.mode == "raise_in_train")


if __name__ == "__main__":
    main()
