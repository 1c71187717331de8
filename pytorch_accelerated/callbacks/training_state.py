"""Saving training states during a run, and saving one when the job is told to stop."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._internal.agent_store import torchrun_restarts_left
from .._internal.argument_checks import check_whole_number
from .._internal.distributed import per_process
from .._internal.fsdp import uses_fsdp
from .._internal.hangs import SignalWatchdog, describe_position, signal_grace_s
from .._internal.intervals import every
from ..checkpoints import sharded
from ..checkpoints.collective_saves import writes_shared_files
from ..checkpoints.directories import read_manifest, remove_entry
from ..checkpoints.discovery import list_complete_states, save_order
from ..checkpoints.finite import NonFiniteStateError
from .events import STATE_SAVES_ORDER, CallbackHandler, StopTrainingError, TrainerCallback

if TYPE_CHECKING:
    from ..trainer import Trainer


class SaveTrainingStateCallback(TrainerCallback):
    """Save the full training state into directories of ``save_dir`` during a run.

    The directories are named as in pytorch-accelerated 0.1.61:

    - ``save_dir/step_{N}`` after the N-th optimizer update, every ``save_every_n_steps``
      (N counts updates, so batches that only accumulate gradients are never saved; a ``train()``
      call that keeps the run history, ``reset_run_history=False``, counts on from the earlier
      calls' updates, so its states never replace theirs);
    - ``save_dir/epoch_{E}`` at the end of epoch E (``run_history.current_epoch``), after its
      evaluation, so a run resumed from it starts epoch E + 1;
    - ``save_dir/final`` when the run ends.

    A step save and an epoch save at the same update both exist (``step_{N}`` holds the state
    before the evaluation, ``epoch_{E}`` the one after it). Each state's ``checkpoint_kwargs``
    are ``{"global_step": N}``. ``train(resume_from=save_dir)`` continues the run that wrote the
    newest state, from its newest complete state (highest N, then the last written);
    ``resume_from=save_dir / "epoch_5"`` from that one.

    The run holds ``save_dir`` from its start to its end (a lock file, ``save_dir/.run.lock``): a
    second run pointed at it while it runs fails before training, naming the holder. See
    docs/checkpoints.md, "One run per folder".

    Wherever it stands in the list, it runs after the other callbacks at every event (its
    ``event_order`` is :data:`~.events.STATE_SAVES_ORDER`), so a state holds every callback's state
    as of the update, epoch end or run end it is saved at: an EMA listed after it has been updated
    with that update, an early-stopping count with that epoch. (Had it run first, a resume would
    lose what the callbacks after it did there.)

    Args:
        save_dir: folder that holds the states.
        save_every_n_epochs: save after every N-th epoch (after its evaluation).
        save_every_n_steps: save after every N-th optimizer update.
        save_at_end: save ``final`` when the run ends (also after an early stop).
        max_checkpoints: keep only the newest N states (older ones are deleted, in the order
            they were saved, after a successful save, but never the one just saved nor the
            newest finite one); None keeps all.
        handle_signals: signals that mean "the job is about to be stopped" (preemption;
            ``signal.SIGINT`` too, if named). On receiving one, the run stops at the next safe
            point (after an optimizer update, an evaluation batch, at the end of an epoch, or
            after the last step), every process at the same one; the state is saved there, a
            line names the signal and the directory, and the run ends cleanly through the
            normal end hooks, so the job can exit 0 and the next launch resumes (the state is
            ``step_{N}`` after an update or during an evaluation, ``epoch_{E}`` at an epoch end,
            ``final`` after the last step; one saved there already is reused). Under torchrun
            with restarts left, ``train()`` then raises ``SystemExit(128 + signum)``, so that
            torchrun restarts the job (docs/checkpoints.md, "Restarts under torchrun"). With several
            processes, a process the signal finds stuck (in a collective whose peer died) exits
            after ``PT_ACC_SIGNAL_GRACE`` seconds (default 10). Pass ``()`` to leave signals
            alone. See docs/checkpoints.md, "Signals and preemption".
        check_signals_every_n_steps: with several processes, how often (in optimizer updates,
            and in evaluation batches) they agree whether a signal arrived (a collective call);
            also at every epoch end and at the end of the run. With one process, every time
            (free).
        asynchronous: write the step and epoch states in the background
            (``trainer.save_training_state(..., asynchronous=True)``): the loop waits only
            while the state is copied to host memory; each state is published once it is on
            disk. The next save and the end of the run wait for it (and raise its error). The
            ``final`` state and a state saved on a signal are written synchronously. See
            docs/checkpoints.md, "Asynchronous training states".
    """

    event_order = STATE_SAVES_ORDER

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
        asynchronous: bool = False,
    ) -> None:
        owner = "SaveTrainingStateCallback"
        for name, value in (
            ("save_every_n_epochs", save_every_n_epochs),
            ("save_every_n_steps", save_every_n_steps),
            ("max_checkpoints", max_checkpoints),
        ):
            check_whole_number(value, name, optional=True, owner=owner)
        check_whole_number(check_signals_every_n_steps, "check_signals_every_n_steps", owner=owner)
        if not isinstance(asynchronous, bool):
            raise TypeError(f"{owner}: asynchronous must be True or False, got {asynchronous!r}.")
        self.asynchronous = asynchronous
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
        self._saved_at: tuple[Any, ...] | None = None  # the position of the last save
        self._saved_dir: Path | None = None  # and its directory
        self._eval_batches = 0  # evaluation batches of the current evaluation epoch
        self._watchdog: SignalWatchdog | None = None

    # ------------------------------------------------------------------ signals

    def _on_signal(self, signum: int, frame: Any) -> None:
        # Only note it: saving from inside a signal handler could interrupt a collective call.
        self.signal_received = signum

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        self.signal_received = None
        self._stopped_by_signal = False
        self._saved_at = self._saved_dir = None
        self._eval_batches = 0
        if self.asynchronous and uses_fsdp(trainer.accelerator):  # refused now, not at the first save
            sharded.check_can_save(
                trainer.accelerator, self.save_dir, asynchronous=True, saves_on_each_node=False
            )
        trainer.state_store.hold(self.save_dir, trainer.run_identity.run_id)  # one run per folder
        self._install(trainer)

    def _install(self, trainer: Trainer) -> None:
        """Handle the signals (possible in the main thread only) and, with several processes,
        start the watchdog that ends a process a signal finds stuck in a collective."""
        grace = signal_grace_s() if self.handle_signals and trainer.accelerator.num_processes > 1 else None
        for signum in self.handle_signals:
            try:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
            except ValueError:  # not the main thread: signals cannot be handled here
                return
        if grace is not None:
            self._watchdog = SignalWatchdog(
                self.handle_signals,
                grace,
                lambda: describe_position(trainer.callback_handler, trainer.progress),
            )
            self._watchdog.start()

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        try:
            if self.asynchronous:  # publish the last state written in the background, then rotate
                trainer.wait_for_training_state()
                self._rotate(trainer, None)
            if self.save_at_end and not self._stopped_by_signal:
                self._save_here(trainer, "final", at_end=True)
            self._honour_signal_after_last_step(trainer)
        finally:
            self._release()

    def _honour_signal_after_last_step(self, trainer: Trainer) -> None:
        """A signal that arrived after the last check (the last step, the end save): the state
        saved at the end covers it (one is saved now if ``save_at_end`` is off); say so."""
        if self._stopped_by_signal or (signum := self._agreed_signal(trainer)) is None:
            return
        if self._watchdog is not None:
            self._watchdog.settle()
        directory = self._save_here(trainer, "final", at_end=True)
        saved = (
            f"the training state saved to {directory} covers it"
            if directory
            else "no training state was saved"
        )
        trainer.print(f"Received {signal.Signals(signum).name} after the last step: {saved}.")

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        self._release()

    def _release(self) -> None:
        """Put back the signal handlers (and the wakeup fd) that were there before the run."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()

    def _agreed_signal(self, trainer: Trainer, count: int | None = None) -> int | None:
        """The signal that any process received, the same answer on every process, or None.

        With several processes this is a collective call, made when ``count`` (of updates or
        evaluation batches) is a multiple of ``check_signals_every_n_steps``, and always
        without a count (epoch ends, the end of the run).
        """
        if not self._previous_handlers:  # not handling signals (or not in a training run)
            return None
        if trainer.accelerator.num_processes == 1:
            return self.signal_received
        if count is not None and not every(self.check_signals_every_n_steps, count):
            return None
        received = per_process(trainer.accelerator, [self.signal_received or 0])
        return next((int(signum) for (signum,) in received if signum), None)

    def _stop_on(self, trainer: Trainer, signum: int | None, directory_name: str | None = None) -> None:
        """On a signal (``signum`` not None): save the state here (unless it just was) and end the
        run cleanly, on every process."""
        if signum is None:
            return
        if self._watchdog is not None:
            self._watchdog.settle()
        self._stopped_by_signal = True
        name = signal.Signals(signum).name
        try:
            directory = self._save_here(trainer, directory_name)
        except NonFiniteStateError:
            trainer.print(f"Received {name}, but the training state was not saved (see below); stopping.")
            raise
        restart, exit_code = "", None
        if left := torchrun_restarts_left():  # exit non-zero, or torchrun would take the job as done
            exit_code = 128 + signum
            restart = (
                f"; exiting with code {exit_code} after the end hooks so that torchrun restarts the "
                f"job ({left} restart(s) left), and the relaunch resumes from it"
            )
        raise StopTrainingError(
            f"received {name}; saved the training state to {directory}{restart}", exit_code=exit_code
        )

    # ------------------------------------------------------------------ safe points

    def on_train_step_end(
        self, trainer: Trainer, *args: Any, is_update_step: bool = False, **kwargs: Any
    ) -> None:
        if not is_update_step:  # inside an accumulation window: nothing to save
            return
        global_step = trainer.progress.global_step
        if every(self.save_every_n_steps, global_step):
            self._save_here(trainer, _step_name(trainer), asynchronous=self.asynchronous)
        self._stop_on(trainer, self._agreed_signal(trainer, global_step))

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        self._eval_batches = 0

    def on_eval_step_end(self, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        # An evaluation batch boundary is a safe point, when training is at an update boundary
        # (an intermediate evaluation inside an accumulation window waits for the update).
        self._eval_batches += 1
        config = trainer.run_config
        # At an update boundary, or the epoch's training is done (its last window, however short,
        # ended with an update).
        if (
            self._previous_handlers
            and config is not None
            and (
                trainer.progress.batch_index % config.gradient_accumulation_steps == 0
                or trainer.loop_state.epoch_trained
            )
        ):
            self._stop_on(trainer, self._agreed_signal(trainer, self._eval_batches))

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        epoch = trainer.run_history.current_epoch
        if every(self.save_every_n_epochs, epoch):
            self._save_here(trainer, f"epoch_{epoch}", asynchronous=self.asynchronous)
        self._stop_on(trainer, self._agreed_signal(trainer), f"epoch_{epoch}")

    # ------------------------------------------------------------------ saving

    def _save_here(
        self, trainer: Trainer, name: str | None = None, at_end: bool = False, asynchronous: bool = False
    ) -> Path | None:
        """Save a state named ``name`` (default ``step_{N}``) at the current position, unless
        one was saved there already (under this name, or under any name when ``name`` is None),
        then delete the oldest beyond ``max_checkpoints``; return its directory (``asynchronous``:
        being written), or None when none was written.

        A state with NaN or infinity is not written (:class:`NonFiniteStateError`, which stops a
        run); at the end of the run, when it is stopping anyway, that is only printed, so the
        other end hooks still run. Rotation counts published states only, so a state still
        being written in the background is neither counted nor deleted.
        """
        position = (*trainer.progress.state_dict().values(), trainer.loop_state.epoch_finished)
        if (
            position == self._saved_at
            and self._saved_dir is not None
            and name in (None, self._saved_dir.name)
        ):
            return self._saved_dir
        directory = self.save_dir / (name or _step_name(trainer))
        # Passed only when asked for, so that an override of the 0.1.61 signature still works.
        options = {"asynchronous": True} if asynchronous else {}
        if self._watchdog is not None:  # a save's barriers may take long: not a hang
            self._watchdog.pause()
        try:
            trainer.save_training_state(
                directory,
                checkpoint_kwargs={"global_step": trainer.run_identity.run_step(trainer.progress)},
                **options,
            )
            self._last_saved_step = trainer.progress.global_step
            self._rotate(trainer, directory)
        except NonFiniteStateError as error:
            if not at_end:
                raise
            trainer.print(str(error))
            return None
        finally:
            if self._watchdog is not None:
                self._watchdog.resume()
        self._saved_at, self._saved_dir = position, directory
        return directory

    def _rotate(self, trainer: Trainer, just_saved: Path | None) -> None:
        if self.max_checkpoints is not None and writes_shared_files(trainer.accelerator):  # on each machine
            _delete_old_states(self.save_dir, self.max_checkpoints, just_saved=just_saved)

    def state_dict(self) -> dict[str, Any]:
        return {"last_saved_step": self._last_saved_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last_saved_step = state["last_saved_step"]


def _step_name(trainer: Trainer) -> str:
    """``step_{N}``, N the run's updates so far (over its ``train()`` calls)."""
    return f"step_{trainer.run_identity.run_step(trainer.progress)}"


def _delete_old_states(save_dir: Path, keep: int, just_saved: Path | None) -> None:
    """Delete the oldest complete training states of ``save_dir`` until ``keep`` are left,
    never ``just_saved`` nor the newest finite state.

    States are ordered as they were saved: by global step, then by when their manifest was
    written (``step_{N}``, then ``epoch_{E}``, then ``final`` at the same step).

    A state is known to be finite when its manifest says ``"finite": true`` (every state this
    version writes; it refuses to write any other) or it is ``just_saved``. States of older
    versions, without that key, and states marked ``"finite": false`` may be deleted, but they
    never make rotation delete the newest finite one, even when they are newer.
    """
    states = sorted((path for _, path in list_complete_states(save_dir)), key=save_order)  # oldest first
    finite = [
        path for path in states if path == just_saved or (read_manifest(path) or {}).get("finite") is True
    ]
    protected = {just_saved, *finite[-1:]}
    # the oldest unprotected states, as many as there are states beyond ``keep``
    for path in [path for path in states if path not in protected][: max(len(states) - keep, 0)]:
        # A linked state: the link, never what it points to. One that cannot be removed is tried again later.
        remove_entry(path, ignore_errors=True)


def stopped_by_signal(callback_handler: CallbackHandler) -> bool:
    """Whether a :class:`SaveTrainingStateCallback` of the Trainer stopped its last run on a signal
    (the same answer on every process: the stop is agreed)."""
    return any(
        isinstance(callback, SaveTrainingStateCallback) and callback._stopped_by_signal
        for callback in callback_handler.callbacks
    )


def auto_resume_folder(callback_handler: CallbackHandler) -> Path:
    """The folder that ``resume_from="auto"`` resumes from: the ``save_dir`` of the Trainer's
    :class:`SaveTrainingStateCallback` (or subclass).

    Raises:
        ValueError: when the Trainer has none, or several with different folders.
    """
    folders = {
        Path(os.path.abspath(callback.save_dir)): callback.save_dir
        for callback in callback_handler.callbacks
        if isinstance(callback, SaveTrainingStateCallback)
    }
    if len(folders) == 1:
        return next(iter(folders.values()))
    if not folders:
        raise ValueError(
            f'resume_from="auto" resumes from the folder of the run\'s SaveTrainingStateCallback, but this '
            f"Trainer has none (its callbacks: {', '.join(callback_handler.callback_list) or 'none'}). "
            f'Add one, e.g. callbacks=(*DEFAULT_CALLBACKS, SaveTrainingStateCallback(save_dir="checkpoints", '
            f"save_every_n_steps=100)), or pass resume_from a folder of states, or None."
        )
    raise ValueError(
        f'resume_from="auto" needs one folder of training states, but the Trainer\'s SaveTrainingStateCallbacks '
        f"save into {len(folders)}: {', '.join(str(folder) for folder in folders.values())}. Save into one "
        f"folder, or pass resume_from the folder to resume from."
    )
