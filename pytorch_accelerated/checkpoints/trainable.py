"""Which parameters of the model require gradients: recorded in every training state, restored on load.

Fine-tuning freezes parameters (``requires_grad=False``) and often unfreezes them during the run: a
callback that unfreezes the backbone when epoch 2 starts, say. Neither the weights nor the
optimizer's state record that, and a resumed run never passes that epoch's start again, so a state
records the names of the frozen parameters (``trainer_state.pt``'s ``frozen_parameters``) and a load
sets every parameter's ``requires_grad`` as it was when the state was saved.

On resume this is done with the callbacks' states, after ``on_training_run_start``: whatever the
script or a callback set up for a new run (freezing the backbone before ``train()``, a
``ModelFreezer`` created when the run starts), the resumed run trains the parameters that the saved
run trained at that point. A resume that changes a parameter's ``requires_grad`` says so in one
warning, naming the parameters. Knows nothing of the Trainer: it is given the model.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .state_checks import UnusableStateError, few

#: Segments that wrappers add to the names of parameters inside the model (``torch.compile``, FSDP1,
#: activation checkpointing): a name is recorded without them, as the plain model's.
_WRAPPER_SEGMENTS = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def plain_name(name: str) -> str:
    """``name`` without the segments that wrappers add (see :data:`_WRAPPER_SEGMENTS`)."""
    for segment in _WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


def frozen_parameters(model: nn.Module) -> list[str]:
    """The names of ``model``'s parameters that do not require gradients (what a state records)."""
    return [plain_name(name) for name, param in model.named_parameters() if not param.requires_grad]


def read_record(state: dict[str, Any], where: Path) -> frozenset[str] | None:
    """The frozen parameters that ``trainer_state.pt`` (``state``, read from ``where``) records
    (None: a state of an earlier version, which records none).

    Raises:
        UnusableStateError: when the record is not a list of parameter names.
    """
    record = state.get("frozen_parameters")
    if record is None:
        return None
    if not isinstance(record, list) or not all(isinstance(name, str) for name in record):
        raise UnusableStateError(
            f"{where} records frozen_parameters as {type(record).__name__}, not a list of parameter names: "
            f"it was not written by this library, or was changed."
        )
    return frozenset(record)


def to_restore(
    model: nn.Module, state: dict[str, Any], directory: Path, announce: bool
) -> TrainableParameters | None:
    """What a load of the state ``directory`` (its ``trainer_state.pt``: ``state``) sets on ``model``,
    the plain model; None for a state that records nothing (an earlier version's, or 0.1.x's)."""
    frozen = read_record(state, directory / "trainer_state.pt")
    return None if frozen is None else TrainableParameters(model, frozen, directory, announce)


@dataclass(frozen=True)
class TrainableParameters:
    """A state's record of which parameters require gradients, to set on ``model``.

    Attributes:
        model: the plain model (without its distributed wrappers).
        frozen: the names of the parameters that were frozen when the state was saved.
        directory: the state, for the warning.
        announce: whether to warn when the record changes a parameter (on resume).
    """

    model: nn.Module
    frozen: frozenset[str]
    directory: Path
    announce: bool

    def restore(self) -> None:
        """Set every parameter's ``requires_grad`` as recorded; warn (``announce``) naming those it changed."""
        changed = [
            (name, param)
            for name, param in ((plain_name(name), param) for name, param in self.model.named_parameters())
            if param.requires_grad == (name in self.frozen)
        ]
        for name, param in changed:
            param.requires_grad_(name not in self.frozen)
        if self.announce and changed:
            warnings.warn(self._describe([name for name, _ in changed]), stacklevel=2)

    def _describe(self, changed: list[str]) -> str:
        trainable = [name for name in changed if name not in self.frozen]
        frozen = [name for name in changed if name in self.frozen]
        parts = [
            f"{what}, as when it was saved (this run had {had}): {few(names, limit=8)}"
            for what, had, names in (
                ("trainable", "frozen them", trainable),
                ("frozen", "them trainable", frozen),
            )
            if names
        ]
        return (
            f"Resuming {self.directory}: requires_grad restored as saved for {len(changed)} parameter(s): "
            + "; ".join(parts)
            + ". A resumed run trains the parameters its state trained (a callback that changed them in an "
            "earlier epoch does not run again); to train others, set requires_grad once the run has resumed, "
            "e.g. in a callback's on_train_epoch_start (docs: 'Frozen parameters')."
        )
