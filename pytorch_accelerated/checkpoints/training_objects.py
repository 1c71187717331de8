"""What a training state saves and restores: the parts of a run, handed over explicitly.

The checkpoint modules never see the Trainer. For each save or load the Trainer gives them a
:class:`TrainingObjects`, which names the objects that a state holds the state of, as the Trainer
holds them at that moment (the model and optimizer as prepared for the run, the scheduler of the
current run, its progress and working state, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ..data import ReproducibleShuffleSampler
    from ..run_config import LoopState, RunIdentity, RunProgress, TrainerRunConfig
    from ..run_history import RunHistory


class Stateful(Protocol):
    """An object whose state is saved as a dict and loaded back (e.g. the callback handler)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class TrainingObjects:
    """The parts of a run that a training state saves and restores.

    Attributes:
        accelerator: the run's ``accelerate.Accelerator``.
        model: the model as prepared for the run (possibly wrapped, compiled or sharded).
        optimizer: the optimizer as prepared (None: an evaluation-only Trainer).
        scheduler: the scheduler of the current run, or None.
        progress: where the run is (epoch, optimizer step, batch).
        run_identity: which run this is (its id, its earlier ``train()`` calls' updates, ...).
        loop_state: the loop's working state (running losses, loss weighting, step metrics, ...).
        run_history: the metrics recorded so far.
        callbacks: the callback handler (each stateful callback's state, by its ``state_key``).
        run_config: the run's settings (None outside a training run).
        train_dataloader: the run's prepared training loader (None outside a training run).
        train_dataset: the run's training data set.
        train_sampler: the training loader's shuffle sampler (None: it has none).
    """

    accelerator: Accelerator
    model: nn.Module
    optimizer: Any
    scheduler: Any
    progress: RunProgress
    run_identity: RunIdentity
    loop_state: LoopState
    run_history: RunHistory
    callbacks: Stateful
    run_config: TrainerRunConfig | None
    train_dataloader: Any
    train_dataset: Any
    train_sampler: ReproducibleShuffleSampler | None

    def plain_model(self, keep_torch_compile: bool = True) -> nn.Module:
        """The model without its distributed wrappers."""
        return self.accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)

    def stateful(self) -> dict[str, Any]:
        """The objects saved whole, by the name of their file in a training state (None: the run has none)."""
        return {
            "optimizer.pt": self.optimizer,
            "scheduler.pt": self.scheduler,
            "scaler.pt": self.accelerator.scaler,
        }
