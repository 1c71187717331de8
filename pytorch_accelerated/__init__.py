"""pytorch-accelerated: a simple, complete and correct training loop for PyTorch.

The house, read top-down: at run time each module imports only modules listed below it (a test,
tests/unit/test_house.py, checks this order); for typing, the callbacks also name the Trainer
that calls them. docs/architecture.md draws the same map::

    trainer             Trainer: every member in its class (train / evaluate / predict, how a run
                        starts and ends, the loop, one method per ML step, the process utilities,
                        the checkpoint methods); it holds its parts: loaders, state_store
                        (checkpoints/store), the preparation record; TrainerWithTimmScheduler
    train_arguments     TrainArguments: the arguments of one train() call, frozen, with the
                        per-device batch size of training that follows from them
    lr_finder           the learning-rate range test behind Trainer.find_learning_rate: a real
                        train() with a rising learning rate, observed by its own recorder,
                        everything it changes put back afterwards
    loaders             TrainerLoaders: the run's data loaders, what they were made with, the seed,
                        the shuffle sampler
    prediction          what predict does: outputs of every sample, in data-set order, exactly
                        once across processes
    run_config          TrainerRunConfig (frozen settings), RunProgress (where the run is),
                        RunIdentity (which run), LoopState (the loop's own working state)
    callbacks/          events, dispatch and callback state (events), then one file per family
                        of built-ins: defaults, monitoring (best model, early stopping), ema,
                        evaluation, limits, training_state (saving states, preemption),
                        wsd_checkpoints, sync_batchnorm, trackers (TrackingCallback),
                        csv_tracker (CSVTracker), tracker_adapters (MLflow and W&B, resumable),
                        tracker_registry (tracker names, creation, state, flushing), plotting
                        (PlotRunCallback)
    checkpoints/        store (TrainingStateStore: saving, waiting for, loading and resuming
                        training states), layouts (one class per kind of state directory:
                        plain, sharded, 0.1.x), training_objects (what a state saves), resume
                        (ResumePlan: what a resume loads, chosen once), torch_files, directories,
                        discovery, auto_resume, background, rng, finite, file_checks,
                        changed_settings, collective_saves, reshard, sharded, original_states,
                        model_files (listed in the package's own docstring)
    schedulers/         SchedulerBase and friends (base), cosine, wsd (import nothing from the
                        trainer); scheduler_base, cosine_scheduler, wsd_scheduler re-export
                        them under 0.1.61's module paths
    placeholders        TrainerPlaceholderValues, resolved when a run starts
    utils               process decorators, LimitBatches, DataLoaderSlice, ModelEma, padding
    data                samplers (reproducible shuffle, exactly-once evaluation), loader defaults
    step_metrics        StepMetrics: the loop's step-level metrics, no device read between points
    tracking            0.1.61's module path of the run history: it re-exports run_history
    run_history         RunHistory (per-epoch metrics, step-indexed series), InMemoryRunHistory,
                        LossTracker
    finetuning          ModelFreezer, Layer, LayerGroup
    _internal/          small helpers that are not public API: argument_checks (checks of arguments),
                        batch_loss (a batch taken apart, counted and its loss computed),
                        distributed (gathering, the Trainer's process methods), accumulation
                        (window weighting), intervals ("every N updates"), process_group (the
                        collective timeout, a shared seed, clean-up at exit), preparation
                        (model, optimizer and loaders prepared with accelerate), fsdp (what is
                        sharded; what cannot run under FSDP), accelerator_checks (the
                        Accelerator's set-up checked, precision and FSDP that cannot run here),
                        hangs (what a failed collective was doing; the watchdog for a process a
                        stop signal finds stuck), launch_checks (a launch whose processes do not
                        add up fails early), agent_store (under torchrun, a namespace of its own
                        per attempt on the agent's store), errors (StopTrainingError, public
                        through callbacks)

Every public name of pytorch-accelerated 0.1.61 keeps its import path (docs/migration.md lists
them, and what changed; docs/api/ documents the public names); see docs/inside-the-trainer.md
for the loop.
Importing the package changes no random state: call :func:`set_seed` (accelerate's: Python,
NumPy and torch on every device) for a reproducible script. 0.1.61 ran ``set_seed(42)`` on
import, which silently reseeded the importing program.
"""

import logging

from accelerate import notebook_launcher
from accelerate import notebook_launcher as accelerate_notebook_launcher
from accelerate.utils import set_seed

from .placeholders import TrainerPlaceholderValues
from .trainer import Trainer

__version__ = "0.2.0"

#: The package's logger (``logging.getLogger("pytorch_accelerated")``), as in 0.1.61.
logger = logging.getLogger(__name__)

__all__ = [
    "Trainer",
    "TrainerPlaceholderValues",
    "notebook_launcher",
    "accelerate_notebook_launcher",
    "set_seed",
    "logger",
    "__version__",
]
