"""Callback events and their dispatch."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

#: Every event the Trainer fires, in the order they first fire in a run with evaluation.
TRAINER_EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_training_run_start",
    "on_train_epoch_start",
    "on_train_step_start",
    "on_train_step_end",
    "on_train_epoch_end",
    "on_eval_epoch_start",
    "on_eval_step_start",
    "on_eval_step_end",
    "on_eval_epoch_end",
    "on_training_run_epoch_end",
    "on_training_run_end",
    "on_evaluation_run_start",
    "on_evaluation_run_end",
    "on_stop_training_error",
)


class StopTrainingError(Exception):
    """Raise anywhere in the training loop to end the run cleanly.

    The Trainer fires ``on_stop_training_error``, then the run-end hooks, and ``train()``
    returns normally.
    """


class TrainerCallback:
    """Base class of callbacks: observers of the training loop.

    Override any ``on_*`` method named in :data:`TRAINER_EVENTS`; each receives the trainer and
    keyword arguments that depend on the event. A callback may declare extra events that a
    Trainer subclass fires with ``callback_handler.call_event`` by listing them in
    ``custom_events``. Any other ``on_*`` method is rejected when the callback is added, since
    a misspelt hook would otherwise never run.

    Stateful callbacks define ``state_dict()`` and ``load_state_dict(state)`` so that a resumed
    run restores them.
    """

    custom_events: tuple[str, ...] = ()

    def on_init_end(self, trainer: Any, **kwargs: Any) -> None:
        """After the Trainer's constructor, before anything is prepared for distribution."""

    def on_training_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """At the start of ``train()``, after the data loaders, run config and scheduler exist."""

    def on_train_epoch_start(self, trainer: Any, **kwargs: Any) -> None:
        """At the start of each training epoch, after ``model.train()``."""

    def on_train_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Before the forward pass of each training batch."""

    def on_train_step_end(self, trainer: Any, batch: Any, batch_output: dict, step: int, **kwargs: Any) -> None:
        """After the backward pass of each batch and, when the batch completes an update, after
        the optimizer step, scheduler step and zero-grad. ``step`` is the batch index in the epoch."""

    def on_train_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """After the last training batch of an epoch, once ``train_loss_epoch`` is recorded."""

    def on_eval_epoch_start(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        """At the start of each evaluation epoch, after ``model.eval()``."""

    def on_eval_step_start(self, trainer: Any, **kwargs: Any) -> None:
        """Before the forward pass of each evaluation batch."""

    def on_eval_step_end(self, trainer: Any, batch: Any, batch_output: dict, **kwargs: Any) -> None:
        """After each evaluation batch."""

    def on_eval_epoch_end(self, trainer: Any, is_intermediate: bool = False, **kwargs: Any) -> None:
        """After the last evaluation batch, once the evaluation loss is recorded."""

    def on_training_run_epoch_end(self, trainer: Any, **kwargs: Any) -> None:
        """After each (train + eval) epoch; metrics for the epoch are complete here."""

    def on_training_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """At the end of ``train()``, also after a ``StopTrainingError``."""

    def on_evaluation_run_start(self, trainer: Any, **kwargs: Any) -> None:
        """At the start of ``evaluate()``."""

    def on_evaluation_run_end(self, trainer: Any, **kwargs: Any) -> None:
        """At the end of ``evaluate()``."""

    def on_stop_training_error(self, trainer: Any, **kwargs: Any) -> None:
        """When a ``StopTrainingError`` ends the run, before the run-end hooks."""


def _is_override(callback: TrainerCallback, event: str) -> bool:
    base = getattr(TrainerCallback, event, None)
    return getattr(type(callback), event, None) is not base


class CallbackHandler:
    """Holds the callbacks of a Trainer and calls them, in list order, for each event."""

    def __init__(self, callbacks: Iterable[TrainerCallback | type[TrainerCallback]] = ()) -> None:
        self.callbacks: list[TrainerCallback] = []
        self._custom_events: set[str] = set()
        self._dispatch: dict[str, list[tuple[TrainerCallback, Callable[..., Any]]]] = {}
        self.add_callbacks(callbacks)

    def register_event(self, event: str) -> None:
        """Allow callbacks to handle a custom ``event`` fired with :meth:`call_event`."""
        self._check_event_name(event)
        self._custom_events.add(event)

    def add_callbacks(self, callbacks: Iterable[TrainerCallback | type[TrainerCallback]]) -> None:
        for callback in callbacks:
            self.add_callback(callback)

    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        """Add a callback (an instance, or a class that takes no arguments)."""
        if isinstance(callback, type):
            callback = callback()
        if not isinstance(callback, TrainerCallback):
            raise TypeError(
                f"callbacks must be TrainerCallback instances or classes, got {callback!r} "
                f"({type(callback).__name__}). Subclass pytorch_accelerated.callbacks.TrainerCallback."
            )
        for event in callback.custom_events:
            self.register_event(event)
        self._check_hooks(callback)
        self.callbacks.append(callback)
        self._dispatch.clear()

    def remove_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        """Remove a callback instance, or every callback of a class."""
        if isinstance(callback, type):
            self.callbacks = [cb for cb in self.callbacks if not isinstance(cb, callback)]
        else:
            self.callbacks.remove(callback)
        self._dispatch.clear()

    def get_callback(self, callback_type: type) -> Any:
        """Return the first callback of ``callback_type``, or None."""
        return next((cb for cb in self.callbacks if isinstance(cb, callback_type)), None)

    def call_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        """Call ``event`` on every callback that handles it, in list order.

        An exception raised by a callback reaches the caller unchanged, with a note that names
        the callback and the event.
        """
        handlers = self._dispatch.get(event)
        if handlers is None:
            handlers = self._build_dispatch(event)
        for callback, method in handlers:
            try:
                method(*args, **kwargs)
            except StopTrainingError:
                raise
            except Exception as error:
                _add_note(error, f"raised in callback {type(callback).__name__}.{event}")
                raise

    def _build_dispatch(self, event: str) -> list[tuple[TrainerCallback, Callable[..., Any]]]:
        if event not in TRAINER_EVENTS and event not in self._custom_events:
            self.register_event(event)
        # Only callbacks that override an event are called, so unused events cost nothing.
        handlers = [
            (cb, getattr(cb, event))
            for cb in self.callbacks
            if hasattr(cb, event) and (event not in TRAINER_EVENTS or _is_override(cb, event))
        ]
        self._dispatch[event] = handlers
        return handlers

    def _check_event_name(self, event: str) -> None:
        if not event.startswith("on_") or not event.isidentifier():
            raise ValueError(f"Event names must be identifiers starting with 'on_', got {event!r}.")

    def _check_hooks(self, callback: TrainerCallback) -> None:
        known = set(TRAINER_EVENTS) | self._custom_events
        for name in dir(type(callback)):
            if not name.startswith("on_") or name in known:
                continue
            if not callable(getattr(type(callback), name)):
                continue
            suggestion = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" Did you mean {suggestion[0]!r}?" if suggestion else ""
            raise ValueError(
                f"{type(callback).__name__}.{name} is not a Trainer event, so it would never be "
                f"called.{hint} For a custom event fired with callback_handler.call_event, list it "
                f"in the callback's custom_events, e.g. custom_events = ({name!r},)."
            )


def _add_note(error: BaseException, note: str) -> None:
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10: keep the note where 3.11's traceback printing would look for it
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]
