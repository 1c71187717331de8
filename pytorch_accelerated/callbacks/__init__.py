"""Callbacks: observers of the training loop, and the built-in ones.

- :mod:`.events`: the events, their dispatch (``CallbackHandler``), ``TrainerCallback``, and the
  saved state of callbacks (by ``state_key``);
- :mod:`.defaults`: the five callbacks every Trainer gets unless told otherwise;
- :mod:`.monitoring`: keeping the best model, stopping early;
- :mod:`.ema`: an exponential moving average of the weights, evaluated and saved;
- :mod:`.evaluation`: evaluating during an epoch, and shortening those evaluations;
- :mod:`.limits`: fewer batches per epoch, for quick debugging runs;
- :mod:`.training_state`: saving training states during a run, and when the job is told to stop;
- :mod:`.wsd_checkpoints`: checkpoints around the decays of a WSD schedule;
- :mod:`.sync_batchnorm`: batch-norm statistics synchronised across processes;
- :mod:`.trackers`: ``TrackingCallback``, which logs a run to experiment trackers;
- :mod:`.tracker_registry`: the trackers known by name: creating one, its state, flushing it;
- :mod:`.tracker_adapters`: accelerate's MLflow and W&B trackers, continuing a resumed run;
- :mod:`.csv_tracker`: ``CSVTracker``, a tracker with no dependencies;
- :mod:`.plotting`: ``PlotRunCallback``, a PNG of the run's curves;
- :mod:`.optuna_pruning`: ``OptunaPruningCallback``, Optuna's pruning on any number of processes
  (optuna is imported only when it is created).

``LossTracker``, ``ModelEma``, ``DataLoaderSlice`` and ``CallbackMethodNotImplementedError`` are
also importable from here, as they were in pytorch-accelerated 0.1.61.
"""

from ..tracking import LossTracker
from ..utils import DataLoaderSlice, ModelEma
from .csv_tracker import CSVTracker
from .defaults import (
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
)
from .ema import ModelEmaCallback
from .evaluation import LimitEvalStepsCallback, StepBasedEvaluationCallback
from .events import STATE_SAVES_ORDER, TRAINER_EVENTS, CallbackHandler, StopTrainingError, TrainerCallback
from .limits import LimitBatchesCallback
from .monitoring import EarlyStoppingCallback, SaveBestModelCallback
from .optuna_pruning import OptunaPruningCallback
from .plotting import PlotRunCallback
from .sync_batchnorm import ConvertSyncBatchNormCallback
from .tracker_registry import tracker_names
from .trackers import TrackingCallback
from .training_state import SaveTrainingStateCallback
from .wsd_checkpoints import WSDCheckpointCallback


class CallbackMethodNotImplementedError(NotImplementedError):
    """Kept from pytorch-accelerated 0.1.61, whose callbacks module exported it.

    Nothing in this library raises it; code that raises or catches it keeps working. (A hook
    that is not implemented is simply not called; a misspelt ``on_*`` method is rejected with
    a ``ValueError`` when the callback is added.)
    """


def get_default_callbacks(progress_bar: bool = True) -> tuple[type[TrainerCallback], ...]:
    """The default callback classes, with or without the progress bar."""
    bar: tuple[type[TrainerCallback], ...] = (ProgressBarCallback,) if progress_bar else ()
    return (
        MoveModulesToDeviceCallback,
        TerminateOnNaNCallback,
        PrintProgressCallback,
        *bar,
        LogMetricsCallback,
    )


#: MoveModulesToDevice, TerminateOnNaN, PrintProgress, ProgressBar, LogMetrics.
DEFAULT_CALLBACKS = get_default_callbacks()

__all__ = [
    "TRAINER_EVENTS",
    "STATE_SAVES_ORDER",
    "TrainerCallback",
    "CallbackHandler",
    "StopTrainingError",
    "get_default_callbacks",
    "DEFAULT_CALLBACKS",
    "MoveModulesToDeviceCallback",
    "TerminateOnNaNCallback",
    "PrintProgressCallback",
    "ProgressBarCallback",
    "LogMetricsCallback",
    "SaveTrainingStateCallback",
    "StepBasedEvaluationCallback",
    "LimitEvalStepsCallback",
    "LimitBatchesCallback",
    "ConvertSyncBatchNormCallback",
    "SaveBestModelCallback",
    "EarlyStoppingCallback",
    "ModelEmaCallback",
    "WSDCheckpointCallback",
    "TrackingCallback",
    "CSVTracker",
    "tracker_names",
    "PlotRunCallback",
    "OptunaPruningCallback",
    "CallbackMethodNotImplementedError",
    "LossTracker",
    "ModelEma",
    "DataLoaderSlice",
]
