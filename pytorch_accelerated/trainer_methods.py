"""The Trainer's utility, data-loader and checkpoint methods that only hand over to one of its parts.

``print``, ``gather``, ``gather_for_metrics``, ``any_process``, ``get_model`` (the accelerator),
``running_loss``, ``eval_batch_is_padding``, ``train_dataloader``, ``eval_dataloader`` (the run
state and the loaders) and the checkpoint methods (the model files and the training-state store).
Each is a function taking the Trainer as ``self``, or a property, bound in the Trainer's class body
(``save_checkpoint = trainer_methods.save_checkpoint``): an ordinary method, overridden by a
subclass as any other, so that trainer.py holds the loop. :mod:`.runs` holds the set-up defaults,
``evaluate`` and ``predict``, bound the same way.
"""

from __future__ import annotations

import os
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import runs
from ._internal import distributed
from .checkpoints import model_files

if TYPE_CHECKING:
    from .trainer import Trainer

# ---------------------------------------------------------------------------- processes


def print(self: Trainer, *args: Any, **kwargs: Any) -> None:  # (shadows the built-in in this module)
    """``print`` once per node (on each node's main process), above any open progress bar."""
    distributed.print_once_per_node(self.accelerator, *args, **kwargs)


def gather(self: Trainer, tensor: torch.Tensor, padding_value: Any = None) -> torch.Tensor:
    """Concatenate ``tensor`` from every process along dim 0 (see :func:`.distributed.gather`)."""
    return distributed.gather(self.accelerator, tensor, padding_value)


def gather_for_metrics(self: Trainer, data: Any) -> Any:
    """Gather nested tensors from every process, each sample once (nothing from a padding batch,
    not even a 0-d tensor)."""
    return distributed.gather_ragged(self.accelerator, data, padding=self.loaders.eval_batch_is_padding)


def any_process(self: Trainer, flag: bool | torch.Tensor) -> bool:
    """True on every process if ``flag`` is true on any (every process must call this)."""
    return bool(distributed.ranks_where(self.accelerator, flag))


def get_model(self: Trainer, keep_torch_compile: bool = True) -> nn.Module:
    """Return the model without its distributed wrappers."""
    return self.accelerator.unwrap_model(self.model, keep_torch_compile=keep_torch_compile)


running_loss = property(
    attrgetter("run_state.train_loss.average"),
    doc="The mean training loss of the epoch so far on this process (a device read: a sync point).",
)
eval_batch_is_padding = property(
    attrgetter("loaders.eval_batch_is_padding"),
    doc="True while an evaluation batch is a padding batch of zero rows (that evens out the processes' "
    'batch counts; docs/inside-the-trainer.md, "Evaluation").',
)
train_dataloader = property(
    attrgetter("loaders.train"),
    lambda self, loader: setattr(self.loaders, "train", loader),
    doc="The prepared training loader of the run (one set in ``on_train_epoch_start`` is used).",
)
eval_dataloader = property(
    attrgetter("loaders.eval"),
    lambda self, loader: setattr(self.loaders, "eval", loader),
    doc="The prepared evaluation loader (one set in ``on_eval_epoch_start`` is used).",
)

# ---------------------------------------------------------------------------- checkpoints


def save_checkpoint(
    self: Trainer,
    save_path: str | os.PathLike,
    checkpoint_kwargs: dict[str, Any] | None = None,
    save_optimizer: bool = True,
    save_scheduler: bool = True,
    save_per_node: bool = True,
    *,
    model: nn.Module | None = None,
) -> None:
    """Save the model (and optimizer, scheduler) in one file (see :func:`.model_files.save_checkpoint`)."""
    model_files.save_checkpoint(
        runs.training_objects(self),
        save_path,
        checkpoint_kwargs,
        (save_optimizer, save_scheduler, save_per_node),
        model,
    )


def load_checkpoint(
    self: Trainer,
    checkpoint_path: str | os.PathLike,
    load_optimizer: bool = True,
    load_scheduler: bool = True,
    *,
    model: nn.Module | None = None,
) -> dict[str, Any]:
    """Load a file written by :meth:`save_checkpoint` (see :func:`.model_files.load_checkpoint`)."""
    return model_files.load_checkpoint(
        runs.training_objects(self), checkpoint_path, (load_optimizer, load_scheduler), model
    )


def save_training_state(
    self: Trainer,
    output_dir: str | os.PathLike,
    checkpoint_kwargs: dict[str, Any] | None = None,
    *,
    asynchronous: bool = False,
) -> None:
    """Save all that decides the rest of the run in ``output_dir`` (see :meth:`.TrainingStateStore.save`).

    >>> import tempfile, torch
    >>> from pytorch_accelerated import Trainer
    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    >>> def new_trainer():
    ...     model = nn.Linear(3, 1)
    ...     return Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=())
    >>> trainer = new_trainer()
    >>> trainer.train(data, num_epochs=1, per_device_batch_size=4)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     trainer.save_training_state(f"{folder}/after-epoch-1", checkpoint_kwargs={"note": "hi"})
    ...     resumed = new_trainer()
    ...     resumed.train(data, num_epochs=3, per_device_batch_size=4, resume_from=folder)
    Resumed from .../after-epoch-1, the newest usable state in ... (update 4; training continues with epoch 2)
    >>> resumed.progress.global_step  # 4 updates restored, then 2 more epochs of 4
    12
    """
    self.state_store.save(runs.training_objects(self), output_dir, checkpoint_kwargs, asynchronous)


def wait_for_training_state(self: Trainer) -> None:
    """Wait for a state saved with ``asynchronous=True`` (see :meth:`.TrainingStateStore.wait`)."""
    self.state_store.wait()


def load_training_state(self: Trainer, input_dir: str | os.PathLike) -> dict[str, Any]:
    """Restore a state saved by :meth:`save_training_state` (see :meth:`.TrainingStateStore.load`)."""
    return self.state_store.load(runs.training_objects(self), input_dir)
