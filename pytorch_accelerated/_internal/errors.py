"""The exception that ends a run cleanly, defined below every layer that raises it,
:func:`ends_run_on_purpose` and :func:`add_note`.

It is public as :class:`pytorch_accelerated.callbacks.StopTrainingError`; it lives here so
that the checkpoint layer, which may not import the callbacks, can raise stops of its own.
"""

from __future__ import annotations

import sys


class StopTrainingError(Exception):
    """Raise anywhere in the training loop or an evaluation to end it cleanly.

    From any event or overridable method of ``train()``, the Trainer fires
    ``on_stop_training_error``, then the run-end hooks, and ``train()`` returns normally; in
    ``evaluate()`` the evaluation ends at that batch (no partial loss is recorded), then
    ``on_stop_training_error`` and the evaluation-end hooks fire, and ``evaluate()`` returns
    what was recorded. Raised inside an end event, it skips that event's remaining callbacks.

    ``exit_code``: once the run has ended, ``train()`` raises ``SystemExit(exit_code)`` (a stop by a
    signal under torchrun with restarts left, which must exit non-zero to be restarted).
    """

    def __init__(self, *args: object, exit_code: int | None = None) -> None:
        super().__init__(*args)
        self.exit_code = exit_code


StopTrainingError.__module__ = "pytorch_accelerated.callbacks"


def ends_run_on_purpose(error: BaseException) -> bool:
    """Whether ``error`` ends a run on purpose rather than failing it: a :class:`StopTrainingError`,
    or Optuna's ``TrialPruned`` (its study pruned the trial; ``train()`` raises it for the objective).
    Optuna is an extra: it is looked up only where it is imported, as it is wherever one was raised."""
    pruned = getattr(sys.modules.get("optuna"), "TrialPruned", None)
    return isinstance(error, StopTrainingError) or (pruned is not None and isinstance(error, pruned))


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``; on Python 3.10, the note where 3.11's traceback would look for it."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]
