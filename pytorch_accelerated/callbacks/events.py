"""Callback events and their dispatch, and the saved state of callbacks (by ``state_key``)."""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._internal.errors import StopTrainingError, add_note

if TYPE_CHECKING:
    from ..trainer import Trainer

#: Every event the Trainer fires, in the order they first fire in a run with evaluation.
TRAINER_EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_training_run_start",
    "on_train_epoch_start",
    "on_train_step_start",
    "on_step_metrics",
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
    "on_exception",
)

#: The :attr:`TrainerCallback.event_order` of :class:`~.training_state.SaveTrainingStateCallback`:
#: after every callback of the default order (0), so that a training state holds every other
#: callback's state as of the update, epoch end or run end it is saved at, wherever the callbacks
#: stand in the list.
STATE_SAVES_ORDER = 100

#: Events that end a run or an evaluation: a ``StopTrainingError`` raised in one of them skips
#: that event's remaining callbacks, and the run still returns normally.
END_EVENTS: tuple[str, ...] = ("on_stop_training_error", "on_training_run_end", "on_evaluation_run_end")


class TrainerCallback:
    """Base class of callbacks: observers of the training loop.

    Override any ``on_*`` method named in :data:`TRAINER_EVENTS`; each receives the trainer and
    keyword arguments that depend on the event. A callback may declare extra events that a
    Trainer subclass fires with ``callback_handler.call_event`` by listing them in
    ``custom_events``; a custom event whose name does not start with ``on_`` (such as
    ``verify_train_batch``) needs no declaration. Any other ``on_*`` method is rejected when the
    callback is added, since a misspelt hook would otherwise never run.

    Hooks receive their arguments by keyword, and ``batch``, ``batch_output`` and ``step``
    default to None, so a hook may declare only the ones it uses, e.g.
    ``def on_train_step_end(self, trainer, step, **kwargs)``.

    A *step* is one optimizer update (``trainer.progress.global_step``, ``on_step_metrics``,
    ``max_num_train_steps``), except in the names kept from pytorch-accelerated 0.1.61 for a
    batch: the events ``on_train_step_*`` and ``on_eval_step_*`` fire once per batch, and the
    ``step`` argument of ``on_train_step_end`` is the batch's index in the epoch.

    A callback is *stateful* when it overrides :meth:`state_dict` (and :meth:`load_state_dict`):
    training states save its state under its :attr:`state_key`, and a resumed run restores it
    into the callback with the same key, wherever it stands in the list.

    Callbacks run in the order of their :attr:`event_order` at every event, and in list order
    among equals: every callback has 0 but :class:`~.training_state.SaveTrainingStateCallback`,
    which has :data:`STATE_SAVES_ORDER` (100), so that its states are saved once every other
    callback has handled the event they are saved at (an EMA updated after the update a state is
    saved at, say). A callback that must run after those saves (one that copies each new state
    elsewhere) sets a larger ``event_order``.
    """

    custom_events: tuple[str, ...] = ()
    #: Where this callback runs among the others at every event: lower first, list order among equals.
    event_order: int = 0

    @property
    def state_key(self) -> str:
        """The name a training state saves this callback's state under.

        Default: the class's qualified name (a second callback of the same key gets ``-2``, and
        so on, in list order). Override it when a run has several callbacks of one class whose
        order may change, e.g. ``return f"SaveBestModel[{self.watch_metric}]"``.
        """
        return type(self).__qualname__

    def state_dict(self) -> dict[str, Any]:
        """Return what a resumed run needs to restore this callback (override with
        :meth:`load_state_dict`); the default, for callbacks without state, is empty."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; called after ``on_training_run_start`` on resume."""

    def on_init_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """After the Trainer's constructor, before anything is prepared for distribution."""

    def on_training_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """At the start of ``train()``, after the data loaders, run config and scheduler exist."""

    def on_train_epoch_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """At the start of each training epoch, after ``model.train()``."""

    def on_train_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Before the forward pass of each training batch."""

    def on_step_metrics(
        self, trainer: Trainer, step: int = 0, metrics: dict[str, float] | None = None, **kwargs: Any
    ) -> None:
        """After an optimizer update where a step-metrics point is due (only in runs where a
        callback asked for them, see :mod:`pytorch_accelerated.step_metrics`), before
        ``on_train_step_end``. ``step`` is the number of completed updates; ``metrics`` maps
        names to floats, already recorded in ``trainer.run_history`` as step-indexed series."""

    def on_train_step_end(
        self,
        trainer: Trainer,
        batch: Any = None,
        batch_output: dict[str, Any] | None = None,
        step: int | None = None,
        *,
        is_update_step: bool = False,
        **kwargs: Any,
    ) -> None:
        """After the backward pass of each batch and, when the batch completes an update
        (``is_update_step``), after the optimizer step, scheduler step and zero-grad.
        ``step`` is the batch index in the epoch, counted from 0 (0.1.61's name for it; the
        number of updates is ``trainer.progress.global_step``)."""

    def on_train_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """After the last training batch of an epoch, once ``train_loss_epoch`` is recorded."""

    def on_eval_epoch_start(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        """At the start of each evaluation epoch, after ``model.eval()``."""

    def on_eval_step_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """Before the forward pass of each evaluation batch."""

    def on_eval_step_end(
        self, trainer: Trainer, batch: Any = None, batch_output: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """After each evaluation batch."""

    def on_eval_epoch_end(self, trainer: Trainer, is_intermediate: bool = False, **kwargs: Any) -> None:
        """After the last evaluation batch, once the evaluation loss is recorded."""

    def on_training_run_epoch_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """After each (train + eval) epoch; metrics for the epoch are complete here."""

    def on_training_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """At the end of ``train()``, also after a ``StopTrainingError``."""

    def on_evaluation_run_start(self, trainer: Trainer, **kwargs: Any) -> None:
        """At the start of ``evaluate()``."""

    def on_evaluation_run_end(self, trainer: Trainer, **kwargs: Any) -> None:
        """At the end of ``evaluate()``."""

    def on_stop_training_error(self, trainer: Trainer, **kwargs: Any) -> None:
        """When a ``StopTrainingError`` ends a run or an evaluation, before its end hooks."""

    def on_exception(self, trainer: Trainer, exception: BaseException, **kwargs: Any) -> None:
        """When any other exception (``KeyboardInterrupt`` included) escapes ``train()`` or
        ``evaluate()``, before it reaches the caller unchanged: release what the callback holds."""


def _is_override(callback: TrainerCallback, event: str) -> bool:
    base = getattr(TrainerCallback, event, None)
    return getattr(type(callback), event, None) is not base


class CallbackHandler:
    """Holds the callbacks of a Trainer and calls them, in list order, for each event."""

    def __init__(self, callbacks: Iterable[TrainerCallback | type[TrainerCallback]] = ()) -> None:
        self.callbacks: list[TrainerCallback] = []
        self._custom_events: set[str] = set()
        self._dispatch: dict[str, list[tuple[TrainerCallback, Callable[..., Any]]]] = {}
        #: The event being fired (None between events) and the last one fired: messages about a
        #: failure say where it happened.
        self.current_event: str | None = None
        self.last_event: str | None = None
        self.add_callbacks(callbacks)

    @property
    def callback_list(self) -> list[str]:
        """The class names of the callbacks, in the order given (each event calls them by their
        ``event_order``, and in this order among equals)."""
        return [type(callback).__name__ for callback in self.callbacks]

    def clear_callbacks(self) -> None:
        """Remove every callback."""
        self.callbacks = []
        self._dispatch.clear()

    def register_event(self, event: str) -> None:
        """Allow callbacks to handle a custom ``event`` fired with :meth:`call_event`.

        Only needed for custom events whose name starts with ``on_`` (a callback declaring such
        a method is otherwise rejected as a misspelt hook); any other name needs no registration.
        """
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
        _check_event_order(callback)
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
        """Call ``event`` on every callback that handles it, by their ``event_order``, in list order
        among equals (so training states are saved after every other callback has handled it).

        ``event`` is a Trainer event (:data:`TRAINER_EVENTS`) or any other identifier: a custom
        event, e.g. ``call_event("verify_train_batch", trainer=self, xb=xb, yb=yb)`` from a Trainer
        subclass, calls the callbacks that define a method of that name and skips the others.
        An exception raised by a callback reaches the caller unchanged, with a note that names
        the callback and the event.
        """
        self.current_event = self.last_event = event
        handlers = self._dispatch.get(event)
        if handlers is None:
            handlers = self._build_dispatch(event)
        for callback, method in handlers:
            try:
                method(*args, **kwargs)
            except StopTrainingError:
                raise
            except Exception as error:
                add_note(error, f"raised in callback {type(callback).__name__}.{event}")
                raise
        self.current_event = None

    def _build_dispatch(self, event: str) -> list[tuple[TrainerCallback, Callable[..., Any]]]:
        if event not in TRAINER_EVENTS and event not in self._custom_events:
            self.register_event(event)
        # Only callbacks that override an event are called, so unused events cost nothing.
        handlers = [
            (cb, getattr(cb, event))
            for cb in sorted(self.callbacks, key=lambda callback: callback.event_order)  # stable: list order
            if callable(getattr(cb, event, None)) and (event not in TRAINER_EVENTS or _is_override(cb, event))
        ]
        self._dispatch[event] = handlers
        return handlers

    def call_exception_event(self, trainer: Trainer, exception: BaseException) -> None:
        """Call ``on_exception`` on every callback, even when one of them raises.

        What a callback raises here is added as a note to ``exception``, which the caller then
        re-raises unchanged. An exception is announced once, even when it passes through a
        nested ``evaluate()`` and then ``train()``.
        """
        if getattr(exception, "_pytorch_accelerated_announced", False):
            return
        try:
            exception._pytorch_accelerated_announced = True  # type: ignore[attr-defined]
        except AttributeError:  # an exception type with __slots__: announce it every time
            pass
        for callback, method in self._dispatch.get("on_exception") or self._build_dispatch("on_exception"):
            try:
                method(trainer, exception=exception)
            except Exception as error:
                add_note(exception, f"{type(callback).__name__}.on_exception also raised {error!r}")

    # ------------------------------------------------------------------ callback state

    def stateful_callbacks(self) -> dict[str, TrainerCallback]:
        """The callbacks that override ``state_dict``, by the key their state is saved under."""
        keyed: dict[str, TrainerCallback] = {}
        for callback in self.callbacks:
            if not _is_override(callback, "state_dict"):
                continue
            base = key = callback.state_key
            repeat = 1
            while key in keyed:
                repeat += 1
                key = f"{base}-{repeat}"
            keyed[key] = callback
        return keyed

    def state_dict(self) -> dict[str, Any]:
        """Every stateful callback's ``state_dict()``, by its key."""
        return {key: callback.state_dict() for key, callback in self.stateful_callbacks().items()}

    def load_state_dict(self, states: Mapping[str, Any]) -> None:
        """Restore each stateful callback whose key has a saved state.

        A saved state that no callback claims, and a stateful callback that finds none, each get
        a warning naming them. States saved by position (``"0:EarlyStoppingCallback"``, by
        earlier versions) are matched by class name, in list order.
        """
        keyed = self.stateful_callbacks()
        states = _keys_from_positions(states, keyed)
        for key, callback in keyed.items():
            if key in states:
                callback.load_state_dict(states[key])
            else:
                warnings.warn(
                    f"The training state holds no state for the callback {key!r}, so it starts "
                    f"afresh: it was not in the run that saved the state (or had another state_key).",
                    stacklevel=2,
                )
        for key in sorted(set(states) - set(keyed)):
            warnings.warn(
                f"The training state holds a state for the callback {key!r}, but no callback of "
                f"this run has that state_key, so it was not restored. Pass that callback to the "
                f"Trainer again to restore it.",
                stacklevel=2,
            )

    def _check_event_name(self, event: str) -> None:
        if not isinstance(event, str) or not event.isidentifier():
            raise ValueError(
                f"Event names must be Python identifiers (the name of the callbacks' method), got {event!r}."
            )

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


def _check_event_order(callback: TrainerCallback) -> None:
    order = callback.event_order
    if isinstance(order, bool) or not isinstance(order, int):
        raise TypeError(
            f"{type(callback).__name__}.event_order must be an int (where the callback runs among the others "
            f"at every event, lower first: 0 by default, {STATE_SAVES_ORDER} for SaveTrainingStateCallback), got "
            f"{order!r}. Rename the attribute if it means something else in your callback."
        )


_POSITIONAL_KEY = re.compile(r"^(\d+):(.+)$")


def _keys_from_positions(states: Mapping[str, Any], keyed: Mapping[str, TrainerCallback]) -> dict[str, Any]:
    """Map keys of the older positional scheme ("<index>:<class name>") onto state keys: the
    n-th saved state of a class goes to the n-th stateful callback of that class."""
    positional = sorted(
        (int(match.group(1)), match.group(2), state)
        for key, state in states.items()
        if (match := _POSITIONAL_KEY.match(key))
    )
    if not positional:
        return dict(states)
    by_class: dict[str, list[str]] = {}
    for key, callback in keyed.items():
        by_class.setdefault(type(callback).__name__, []).append(key)
    converted: dict[str, Any] = {
        key: state for key, state in states.items() if not _POSITIONAL_KEY.match(key)
    }
    for index, class_name, state in positional:
        keys = by_class.get(class_name)
        converted[keys.pop(0) if keys else f"{index}:{class_name}"] = state
    return converted
