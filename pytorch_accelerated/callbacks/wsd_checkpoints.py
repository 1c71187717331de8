"""Checkpoints around the decay phases of a warmup-stable-decay (WSD) learning-rate schedule."""

from __future__ import annotations

import datetime
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..checkpoints.finite import NonFiniteStateError
from .events import TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["WSDCheckpointCallback"]

PRE_DECAY = "wsd_pre_decay"
POST_DECAY = "wsd_post_decay"


class WSDCheckpointCallback(TrainerCallback):
    """Save checkpoints before and after each decay phase of a WSD learning-rate schedule.

    Steps are the scheduler's own update count (``scheduler.num_updates``, which equals
    ``trainer.progress.global_step`` in a fresh run). After the update that reaches step ``s``:

    - ``s`` is a decay's ``pre_decay_step`` (:meth:`WSDLrScheduler.get_decay_info`): the full
      training state goes to the **directory** ``save_dir/checkpoint_{s}_wsd_pre_decay``
      (:meth:`Trainer.save_training_state`): the stable branch, never annealed, the point to
      continue a longer run from;
    - ``s`` is a checkpoint step (``period_end``, :meth:`WSDLrScheduler.get_checkpoint_steps`):
      the **file** ``save_dir/checkpoint_{s}_wsd_post_decay.pt`` (:meth:`Trainer.save_checkpoint`
      with ``save_optimizer`` and ``save_scheduler``): annealed weights, ready to use.

    If the file of the last checkpoint step is missing when a run ends inside its last decay
    (or after it), it is written then, with the weights of the end of the run and the step
    reached; a run that ends before its last decay started writes none. Both kinds carry
    the ``checkpoint_kwargs`` ``step``, ``checkpoint_type`` (``"wsd_pre_decay"`` or
    ``"wsd_post_decay"``), ``total_steps`` (the schedule's length), ``decay_fraction`` (its
    ``decay_phase_ratio``), ``timestamp`` (ISO 8601), ``global_step`` and ``epoch`` (counted
    from 1). :attr:`saved_checkpoints` lists what was written; :attr:`last_checkpoint_step` is
    the step of the last one (or of the ``initial_checkpoint``).

    Weights that hold NaN or infinity (or follow a non-finite training loss) are never saved:
    the save is refused with :class:`~pytorch_accelerated.checkpoints.finite.NonFiniteStateError`,
    which stops the run (at its end, the refusal is printed).

    ``initial_checkpoint``, when it exists, is loaded at ``on_training_run_start`` of a fresh
    run: a **directory** (a pre-decay state) with :meth:`Trainer.load_training_state`, whose
    weights, optimizer, scheduler, callback and RNG states are restored while the run still
    starts at its first batch; a **file** with :meth:`Trainer.load_checkpoint` (the scheduler
    state is not loaded into a scheduler created with ``is_continuation_from_checkpoint=True``,
    a new schedule for the continued run). Its ``step`` sets :attr:`last_checkpoint_step`. A run
    resumed with ``train(resume_from=...)`` is not restarted from ``initial_checkpoint``.

    Args:
        save_dir: the folder of the checkpoints (created when needed).
        save_optimizer: include the optimizer state in the post-decay files.
        save_scheduler: include the scheduler state in the post-decay files.
        initial_checkpoint: a pre-decay directory or a post-decay file to start from.

    Attributes:
        checkpoint_steps: the set of checkpoint (post-decay) steps of the run's scheduler.
        decay_info: the scheduler's ``get_decay_info()``: one dict per period with
            ``period_start``, ``period_end``, ``decay_steps`` and ``pre_decay_step``.
        decay_fraction: the scheduler's ``decay_phase_ratio``.

    Raises:
        ValueError: at the start of a run whose scheduler has no ``get_checkpoint_steps``.
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
        self.last_checkpoint_step: int | None = None
        self.checkpoint_steps: set[int] = set()
        self.decay_info: list[dict[str, int]] = []
        self.decay_fraction: float | None = None
        self._total_steps: int | None = None
        self._initial_checkpoint_loaded = False

    # ------------------------------------------------------------------ run start

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        scheduler = self._read_schedule(trainer.scheduler)
        # A resumed run (train(resume_from=...)) is already past its start: nothing to do here.
        fresh_run = trainer.progress.global_step == 0 and trainer.progress.batch_index == 0
        if fresh_run and self.initial_checkpoint is None:
            self._save_if_due(trainer, self._scheduler_step(trainer))  # a decay that starts at step 0
        elif fresh_run and not self._initial_checkpoint_loaded:
            self._load_initial_checkpoint(trainer, scheduler)
            self._read_schedule(scheduler)  # a loaded scheduler state may change the layout

    def _read_schedule(self, scheduler: Any) -> Any:
        """Check the scheduler (duck-typed) and read its checkpoint layout into the attributes."""
        if not callable(getattr(scheduler, "get_checkpoint_steps", None)):
            found = "no scheduler (None)" if scheduler is None else f"a {type(scheduler).__name__}"
            raise ValueError(
                f"WSDCheckpointCallback needs a scheduler with get_checkpoint_steps(), such as "
                f"WSDLrScheduler, but this run has {found}. Pass trainer.train(..., create_scheduler_fn="
                f"WSDLrScheduler.create_scheduler_fn(num_checkpoints=3)), with `from "
                f"pytorch_accelerated.schedulers import WSDLrScheduler`."
            )
        steps = [int(step) for step in scheduler.get_checkpoint_steps()]
        self.checkpoint_steps = set(steps)
        self.decay_info = _decay_info(scheduler, steps)
        ratio = getattr(scheduler, "decay_phase_ratio", None)
        self.decay_fraction = float(ratio) if ratio is not None else None
        total = getattr(scheduler, "total_steps", None)
        self._total_steps = int(total) if total is not None else max(steps, default=None)
        return scheduler

    def _load_initial_training_state(self, trainer: Trainer, path: Path) -> dict[str, Any]:
        """Load the weights, optimizer, scheduler, callback (this one's too) and RNG states of the
        training state ``path`` while the run keeps its own position, identity, history, epoch loss,
        shuffle seed and list of saves: it starts afresh."""
        saved, position, identity, loop, history = (
            list(self.saved_checkpoints),
            trainer.progress.state_dict(),
            trainer.run_identity.state_dict(),
            trainer.loop_state.state_dict(),
            trainer.run_history.state_dict(),
        )
        sampler = trainer.loaders.train_sampler
        seed = sampler.seed if sampler is not None else None
        loaded = dict(trainer.load_training_state(path))
        self.saved_checkpoints = saved
        trainer.progress.load_state_dict(position)
        trainer.run_identity.load_state_dict(identity)
        trainer.loop_state.load_state_dict(loop)
        trainer.loop_state.train_loss.reset()
        if sampler is not None and seed is not None:
            sampler.seed = seed
        trainer.run_history.load_state_dict(history)
        return loaded

    def _load_initial_checkpoint(self, trainer: Trainer, scheduler: Any) -> None:
        assert self.initial_checkpoint is not None  # checked by the caller
        path = Path(self.initial_checkpoint)
        if not path.exists():
            warnings.warn(
                f"WSDCheckpointCallback: initial_checkpoint={str(path)!r} does not exist, so the run "
                f"starts from the model as it is. Pass a directory checkpoint_<step>_wsd_pre_decay or "
                f"a file checkpoint_<step>_wsd_post_decay.pt written by an earlier run.",
                stacklevel=2,
            )
            return
        if path.is_dir():
            loaded = self._load_initial_training_state(trainer, path)
        else:
            loaded = trainer.load_checkpoint(
                path,
                load_optimizer=True,
                load_scheduler=not bool(getattr(scheduler, "is_continuation_from_checkpoint", False)),
            )
            if callable(getattr(scheduler, "step_update", None)):
                # The optimizer state brought its own learning rates: apply the schedule's again.
                scheduler.step_update(self._scheduler_step(trainer))
        self._initial_checkpoint_loaded = True
        step = loaded.get("step") if isinstance(loaded, dict) else None
        self.last_checkpoint_step = int(step) if step is not None else None
        trainer.print(f"Continuing from {str(path)!r} at scheduler step {self._scheduler_step(trainer)}")

    # ------------------------------------------------------------------ saving

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if is_update_step:  # not when only accumulating
            self._save_if_due(trainer, self._scheduler_step(trainer))

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        self._initial_checkpoint_loaded = False  # a later train() starts from it again
        if not self.checkpoint_steps:
            return
        final, step = self._post_decay_path(max(self.checkpoint_steps)), self._scheduler_step(trainer)
        last_decay_start = max((info["pre_decay_step"] for info in self.decay_info), default=0)
        if final.exists() or str(final) in self.saved_checkpoints or step < last_decay_start:
            return
        try:
            self._save_post_decay(trainer, final, step)
            trainer.print(f"Saved the final post-decay checkpoint {str(final)!r} at the end of the run")
        except NonFiniteStateError as error:  # the run ends anyway: the other end hooks run
            trainer.print(str(error))

    def _save_if_due(self, trainer: Trainer, step: int) -> None:
        if step in {info["pre_decay_step"] for info in self.decay_info}:
            directory = self.save_dir / f"checkpoint_{step}_{PRE_DECAY}"
            trainer.save_training_state(directory, checkpoint_kwargs=self._kwargs(trainer, step, PRE_DECAY))
            self._saved(directory, step)
        if step in self.checkpoint_steps:
            self._save_post_decay(trainer, self._post_decay_path(step), step)

    def _save_post_decay(self, trainer: Trainer, path: Path, step: int) -> None:
        trainer.save_checkpoint(
            path,
            checkpoint_kwargs=self._kwargs(trainer, step, POST_DECAY),
            save_optimizer=self.save_optimizer,
            save_scheduler=self.save_scheduler,
        )
        self._saved(path, step)

    def _saved(self, path: Path, step: int) -> None:
        self.saved_checkpoints.append(str(path))
        self.last_checkpoint_step = step

    def _post_decay_path(self, step: int) -> Path:
        return self.save_dir / f"checkpoint_{step}_{POST_DECAY}.pt"

    def _kwargs(self, trainer: Trainer, step: int, checkpoint_type: str) -> dict[str, Any]:
        return {
            "step": step,
            "checkpoint_type": checkpoint_type,
            "total_steps": self._total_steps,
            "decay_fraction": self.decay_fraction,
            "timestamp": datetime.datetime.now().isoformat(),
            "global_step": trainer.progress.global_step,
            "epoch": trainer.progress.epoch + 1,
        }

    @staticmethod
    def _scheduler_step(trainer: Trainer) -> int:
        """The scheduler's count of updates, or the run's when it keeps none."""
        step = getattr(trainer.scheduler, "num_updates", None)
        return step if isinstance(step, int) else trainer.progress.global_step

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        return {
            "saved_checkpoints": list(self.saved_checkpoints),
            "initial_checkpoint_loaded": self._initial_checkpoint_loaded,
            "last_checkpoint_step": self.last_checkpoint_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; a resumed run does not load ``initial_checkpoint`` again."""
        self.saved_checkpoints = list(state.get("saved_checkpoints", []))
        self._initial_checkpoint_loaded = bool(state.get("initial_checkpoint_loaded", False))
        self.last_checkpoint_step = state.get("last_checkpoint_step")


def _decay_info(scheduler: Any, checkpoint_steps: list[int]) -> list[dict[str, int]]:
    """The scheduler's ``get_decay_info()``, or the same built from ``get_decay_start_steps()``;
    empty (no pre-decay saves) for a scheduler that has neither."""
    if callable(getattr(scheduler, "get_decay_info", None)):
        return [dict(info) for info in scheduler.get_decay_info()]
    if not callable(getattr(scheduler, "get_decay_start_steps", None)):
        return []
    starts = [int(step) for step in scheduler.get_decay_start_steps()]
    return [
        {"period_start": begin, "period_end": end, "decay_steps": end - start, "pre_decay_step": start}
        for begin, end, start in zip([0, *checkpoint_steps[:-1]], checkpoint_steps, starts, strict=True)
    ]
