"""Saving training states during a run, and saving one when the job is told to stop."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._internal.validation import check_whole_number
from ..checkpoints.state_dirs import list_complete_states
from .events import StopTrainingError, TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer


class SaveTrainingStateCallback(TrainerCallback):
    """Save the full training state into ``save_dir/step-<global step>`` during a run.

    Args:
        save_dir: folder that holds the states; ``train(resume_from=save_dir)`` continues
            from the newest complete one.
        save_every_n_epochs: save after every N-th epoch (after its evaluation).
        save_every_n_steps: save after every N-th optimizer update.
        save_at_end: save when the run ends (also after an early stop).
        max_checkpoints: keep only the newest N states (older ones are deleted after a
            successful save); None keeps all.
        handle_signals: signals that mean "the job is about to be stopped" (preemption). On
            receiving one, every process finishes its current optimizer step, the state is
            saved, and the run ends cleanly through the normal end hooks, so the job can exit
            0 and the next launch resumes. Pass ``()`` to leave signals alone.
        check_signals_every_n_steps: with several processes, how often they agree whether a
            signal arrived (a collective call); with one process, every step (free).
    """

    def __init__(
        self,
        save_dir: str = "training_states",
        save_every_n_epochs: int | None = None,
        save_every_n_steps: int | None = None,
        save_at_end: bool = True,
        max_checkpoints: int | None = None,
        *,
        handle_signals: Iterable[int] = (signal.SIGTERM,),
        check_signals_every_n_steps: int = 10,
    ) -> None:
        owner = "SaveTrainingStateCallback"
        for name, value in (
            ("save_every_n_epochs", save_every_n_epochs),
            ("save_every_n_steps", save_every_n_steps),
            ("max_checkpoints", max_checkpoints),
        ):
            check_whole_number(value, name, optional=True, owner=owner)
        check_whole_number(check_signals_every_n_steps, "check_signals_every_n_steps", owner=owner)
        self.save_dir = Path(save_dir)
        self.save_every_n_epochs = save_every_n_epochs
        self.save_every_n_steps = save_every_n_steps
        self.save_at_end = save_at_end
        self.max_checkpoints = max_checkpoints
        self.handle_signals = tuple(handle_signals)
        self.check_signals_every_n_steps = check_signals_every_n_steps
        self.signal_received: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._last_saved_step: int | None = None
        self._stopped_by_signal = False

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: saving from inside a signal handler could interrupt a collective call.
        self.signal_received = signum

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.signal_received = None
        self._stopped_by_signal = False
        for signum in self.handle_signals:
            try:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: signals cannot be handled here
                break

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        try:
            if self.save_at_end and not self._stopped_by_signal:
                self._save(trainer)
        finally:
            self._restore_handlers()

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    # ------------------------------------------------------------------ saving

    def on_train_step_end(self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any) -> None:
        if not is_update_step:  # inside an accumulation window: nothing to save
            return
        global_step = trainer.progress.global_step
        if self.save_every_n_steps and global_step % self.save_every_n_steps == 0:
            self._save(trainer)
        if self.handle_signals and self._signal_agreed(trainer):
            if self._last_saved_step != global_step:
                self._save(trainer)
            self._stopped_by_signal = True
            trainer.print(f"Received signal {self.signal_received}: saved the training state, stopping.")
            raise StopTrainingError(f"signal {self.signal_received}")

    def _signal_agreed(self, trainer: Trainer) -> bool:
        if trainer.accelerator.num_processes == 1:
            return self.signal_received is not None
        if trainer.progress.global_step % self.check_signals_every_n_steps:
            return False
        return trainer.any_process(self.signal_received is not None)

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        if self.save_every_n_epochs and epoch % self.save_every_n_epochs == 0:
            self._save(trainer)

    def _save(self, trainer: Trainer) -> None:
        trainer.save_training_state(self.save_dir / f"step-{trainer.progress.global_step:08d}")
        self._last_saved_step = trainer.progress.global_step
        if self.max_checkpoints is not None and trainer.is_world_process_zero:
            states = list_complete_states(self.save_dir)
            for _, old in states[: max(0, len(states) - self.max_checkpoints)]:
                shutil.rmtree(old, ignore_errors=True)

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self._last_saved_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last_saved_step = state["last_saved_step"]
