"""Callbacks: observers of the training loop, and the built-in ones."""

from .defaults import (
    LogMetricsCallback,
    MoveModulesToDeviceCallback,
    PrintProgressCallback,
    ProgressBarCallback,
    TerminateOnNaNCallback,
)
from .ema import ModelEmaCallback
from .evaluation import LimitEvalStepsCallback, StepBasedEvaluationCallback
from .events import TRAINER_EVENTS, CallbackHandler, StopTrainingError, TrainerCallback
from .limits import LimitBatchesCallback
from .monitoring import EarlyStoppingCallback, SaveBestModelCallback
from .sync_batchnorm import ConvertSyncBatchNormCallback
from .training_state import SaveTrainingStateCallback
from .wsd_checkpoints import WSDCheckpointCallback


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
]
