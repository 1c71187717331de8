"""The exception that ends a run cleanly, defined below every layer that raises it.

It is public as :class:`pytorch_accelerated.callbacks.StopTrainingError`; it lives here so
that the checkpoint layer, which may not import the callbacks, can raise stops of its own.
"""

from __future__ import annotations


class StopTrainingError(Exception):
    """Raise anywhere in the training loop or an evaluation to end it cleanly.

    From any event or overridable method of ``train()``, the Trainer fires
    ``on_stop_training_error``, then the run-end hooks, and ``train()`` returns normally; in
    ``evaluate()`` the evaluation ends at that batch (no partial loss is recorded), then
    ``on_stop_training_error`` and the evaluation-end hooks fire, and ``evaluate()`` returns
    what was recorded. Raised inside an end event, it skips that event's remaining callbacks.
    """


StopTrainingError.__module__ = "pytorch_accelerated.callbacks"
