"""Checkpoints around the decay phases of a warmup-stable-decay (WSD) learning-rate schedule."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..schedulers.wsd import WSDLrScheduler
from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["WSDCheckpointCallback"]


class WSDCheckpointCallback(TrainerCallback):
    """Save a checkpoint before and after each decay phase of a :class:`WSDLrScheduler`.

    Steps are the scheduler's own update count (``scheduler.num_updates``), which equals
    ``trainer.progress.global_step`` in a fresh run. After the update that reaches a step of
    :meth:`WSDLrScheduler.get_decay_start_steps` the callback writes
    ``{save_dir}/pre_decay_step_{step}.pt`` (weights of the stable branch, never annealed: the
    point to branch from for a longer run); after one that reaches a step of
    :meth:`WSDLrScheduler.get_checkpoint_steps` it writes ``{save_dir}/checkpoint_step_{step}.pt``
    (annealed weights, ready to use). Files are written with :meth:`Trainer.save_checkpoint`,
    with the ``checkpoint_kwargs`` ``step``, ``global_step``, ``epoch`` (counted from 1),
    ``phase`` (``"pre_decay"`` or ``"post_decay"``), ``checkpoint_index`` and
    ``checkpoint_step``. :attr:`saved_checkpoints` lists the files written.

    Weights that hold NaN or infinity (or follow a non-finite training loss) are never saved:
    the save is refused with :class:`~pytorch_accelerated.checkpoints.finite.NonFiniteStateError`,
    which stops the run, and nothing is added to :attr:`saved_checkpoints`.

    ``initial_checkpoint`` is loaded at ``on_training_run_start``: the model and optimizer
    states (the file must hold the optimizer state, as it does by default), and the scheduler
    state when the file has one, so that the old schedule carries on from the saved step (e.g.
    to run the decay from a pre-decay checkpoint). A scheduler created with
    ``is_continuation_from_checkpoint=True`` is a new schedule for the continued run: the saved
    scheduler state is then not loaded. A run resumed with ``train(resume_from=...)`` is not
    restarted from ``initial_checkpoint``.

    Args:
        save_dir: the folder of the checkpoints (created when needed).
        save_optimizer: include the optimizer state.
        save_scheduler: include the scheduler state.
        initial_checkpoint: a file written by :meth:`Trainer.save_checkpoint` to start from.

    Raises:
        TypeError: at the start of a run whose scheduler is not a :class:`WSDLrScheduler`.
    """

    def __init__(
        self,
        save_dir: str | os.PathLike = "checkpoints",
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        initial_checkpoint: str | os.PathLike | None = None,
    ) -> None:
        self.save_dir = Path(save_dir)
        self.save_optimizer = save_optimizer
        self.save_scheduler = save_scheduler
        self.initial_checkpoint = initial_checkpoint
        self.saved_checkpoints: list[str] = []
        self._initial_checkpoint_loaded = False

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        scheduler = self._check_scheduler(trainer.scheduler)
        # A resumed run (train(resume_from=...)) is already past its start: nothing to do here.
        fresh_run = trainer.progress.global_step == 0 and trainer.progress.batch_index == 0
        if fresh_run and self.initial_checkpoint is None:
            self._save_if_due(trainer, scheduler.num_updates)  # a decay that starts at step 0
        elif fresh_run and not self._initial_checkpoint_loaded:
            self._load_initial_checkpoint(trainer, scheduler)

    def _load_initial_checkpoint(self, trainer: Trainer, scheduler: WSDLrScheduler) -> None:
        assert self.initial_checkpoint is not None  # checked by the caller
        trainer.load_checkpoint(
            self.initial_checkpoint,
            load_optimizer=True,
            load_scheduler=not scheduler.is_continuation_from_checkpoint,
        )
        # The optimizer state brought its own learning rates: apply the schedule's again.
        scheduler.step_update(scheduler.num_updates)
        self._initial_checkpoint_loaded = True
        trainer.print(f"Continuing from {str(self.initial_checkpoint)!r} at scheduler step {scheduler.num_updates}")

    def on_train_step_end(self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if is_update_step:  # not when only accumulating
            self._save_if_due(trainer, trainer.scheduler.num_updates)

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._initial_checkpoint_loaded = False  # a later train() starts from it again

    def _save_if_due(self, trainer: Trainer, step: int) -> None:
        scheduler = trainer.scheduler
        for phase, steps, name in (
            ("pre_decay", scheduler.get_decay_start_steps(), "pre_decay_step"),
            ("post_decay", scheduler.get_checkpoint_steps(), "checkpoint_step"),
        ):
            if step not in steps:
                continue
            index = steps.index(step)
            path = self.save_dir / f"{name}_{step}.pt"
            trainer.save_checkpoint(
                path,
                checkpoint_kwargs={
                    "step": step,
                    "global_step": trainer.progress.global_step,
                    "epoch": trainer.progress.epoch + 1,
                    "phase": phase,
                    "checkpoint_index": index,
                    "checkpoint_step": scheduler.get_checkpoint_steps()[index],
                },
                save_optimizer=self.save_optimizer,
                save_scheduler=self.save_scheduler,
            )
            self.saved_checkpoints.append(str(path))

    @staticmethod
    def _check_scheduler(scheduler: Any) -> WSDLrScheduler:
        if not isinstance(scheduler, WSDLrScheduler):
            found = "no scheduler (None)" if scheduler is None else f"a {type(scheduler).__name__}"
            raise TypeError(
                f"WSDCheckpointCallback needs the trainer's scheduler to be a WSDLrScheduler, but "
                f"this run has {found}. Create one with `from pytorch_accelerated.schedulers import "
                f"WSDLrScheduler` and trainer.train(..., create_scheduler_fn="
                f"WSDLrScheduler.create_scheduler_fn(num_checkpoints=3))."
            )
        return scheduler

    def state_dict(self) -> dict[str, Any]:
        return {
            "saved_checkpoints": list(self.saved_checkpoints),
            "initial_checkpoint_loaded": self._initial_checkpoint_loaded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; a resumed run does not load ``initial_checkpoint`` again."""
        self.saved_checkpoints = list(state.get("saved_checkpoints", []))
        self._initial_checkpoint_loaded = bool(state.get("initial_checkpoint_loaded", False))
