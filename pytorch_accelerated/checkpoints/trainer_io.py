"""The Trainer's checkpoint methods (:class:`CheckpointMethods`, a base class of the Trainer):
single-file checkpoints (:mod:`.model_files`) and training states (:mod:`.store`), given the
run's objects (:class:`~.training_objects.TrainingObjects`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from . import model_files
from .store import TrainingStateStore
from .training_objects import TrainingObjects

if TYPE_CHECKING:
    from ..trainer import Trainer


class CheckpointMethods:
    """The Trainer's checkpoint methods (a base class of the Trainer); the work is done by the
    functions of this module."""

    state_store: TrainingStateStore

    def _training_objects(self) -> TrainingObjects:
        trainer = cast("Trainer", self)
        return TrainingObjects(
            trainer.accelerator,
            trainer.model,
            trainer.optimizer,
            trainer.scheduler,
            trainer.progress,
            trainer.run_state,
            trainer.run_history,
            trainer.callback_handler,
            trainer.run_config,
            trainer.train_dataloader,
            trainer.train_dataset,
        )

    def save_checkpoint(
        self,
        save_path: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        save_optimizer: bool = True,
        save_scheduler: bool = True,
        save_per_node: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> None:
        """Save model (and optimizer, scheduler) state with ``checkpoint_kwargs`` to one file.

        The file is written by each node's main process when ``save_per_node`` (for nodes that
        do not share a file system), else by the main process only; it is written to a
        temporary name first, so an interrupted save never leaves a truncated file. Numpy
        values and paths in ``checkpoint_kwargs`` are stored as safe equivalents (numbers,
        tensors, strings). ``model`` saves the weights of another model (e.g. an EMA copy) in
        the same layout. Every process must call this.

        Raises:
            CheckpointWriteError: (an ``OSError``, from :mod:`pytorch_accelerated.checkpoints.files`)
                on every process when the file could not be written, naming it and the OS
                error; an earlier file at ``save_path`` is kept and no temporary file is left.
        """
        options = (save_optimizer, save_scheduler, save_per_node)
        model_files.save_checkpoint(self._training_objects(), save_path, checkpoint_kwargs, options, model)

    def load_checkpoint(
        self,
        checkpoint_path: str | os.PathLike,
        load_optimizer: bool = True,
        load_scheduler: bool = True,
        *,
        model: nn.Module | None = None,
    ) -> dict[str, Any]:
        """Load a file written by :meth:`save_checkpoint` (never running code from it) and
        return its whole dictionary: ``model_state_dict``, ``optimizer_state_dict`` and
        ``scheduler_state_dict`` when saved, and the ``checkpoint_kwargs``. ``model`` loads the
        weights into another model.

        A state the file lacks, or that the trainer has no object for (an evaluation-only
        Trainer has no optimizer, a fresh one no scheduler), is skipped. Weights saved from a
        ``torch.compile``'d model load into the plain one and the reverse. Everything is checked
        (the file, the model's keys and shapes, the optimizer's parameter groups) before
        anything is loaded, so a file that does not fit changes nothing.
        """
        options = (load_optimizer, load_scheduler)
        return model_files.load_checkpoint(self._training_objects(), checkpoint_path, options, model)

    def save_training_state(
        self,
        output_dir: str | os.PathLike,
        checkpoint_kwargs: dict[str, Any] | None = None,
        *,
        asynchronous: bool = False,
    ) -> None:
        """Save everything that decides the rest of the run into the directory ``output_dir``.

        Model, optimizer, scheduler, gradient scaler, every process's RNG states, the run
        history, every stateful callback's ``state_dict()`` (by its ``state_key``), and the
        exact position (epoch, optimizer step, batch). The directory appears only once
        complete. Every process must call this, between optimizer updates (not inside an
        accumulation window). Continue a run with ``train(..., resume_from=output_dir)``.
        A save that fails (disk full, a parent that is a file) removes what it wrote and raises
        ``CheckpointWriteError`` on every process, naming the directory and the OS error.

        ``asynchronous=True`` copies the state to host memory and returns; a background thread
        writes it, and publishes it only once every process's files are on disk. The next
        save, :meth:`load_training_state`, :meth:`wait_for_training_state` and the end of the
        run wait for it, and raise its ``CheckpointWriteError`` on every process if it failed.
        See docs/checkpoints.md, "Asynchronous training states".

        Under FSDP, every process writes its shards of the model and optimizer (accelerate's
        ``save_fsdp_model`` / ``save_fsdp_optimizer``), and ``asynchronous=True`` is refused;
        see docs/checkpoints.md, "Sharded models (FSDP)".

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
        >>> resumed.progress.global_step  # 4 updates restored, then 2 more epochs of 4
        12
        """
        self.state_store.save(self._training_objects(), output_dir, checkpoint_kwargs, asynchronous)

    def wait_for_training_state(self) -> None:
        """Wait until a state saved with ``asynchronous=True`` is written and published (at
        once when none is being written). Every process must call this.

        Raises:
            CheckpointWriteError: on every process, when the background write failed on any,
                naming the state and the error; the previous states are intact.
        """
        self.state_store.wait()

    def load_training_state(self, input_dir: str | os.PathLike) -> dict[str, Any]:
        """Restore a state saved by :meth:`save_training_state`; return ``{"current_epoch": E,
        **checkpoint_kwargs}``, E the epoch (counted from 1) the state was saved in.

        ``input_dir`` may be a state directory or a folder of them (the newest good one is
        taken: a newer one that is damaged or holds non-finite weights is skipped with a
        warning), or a directory written by pytorch-accelerated 0.1.x (``trainer_metadata.pt``;
        see :mod:`pytorch_accelerated.checkpoints.original_states`). Every file is checked
        before anything is loaded, so a bad state changes nothing. A state saved sharded under
        FSDP loads only under the same FSDP configuration (on any number of processes); a plain
        state loads under FSDP too (see :mod:`pytorch_accelerated.checkpoints.sharded`). To continue training from
        it, use ``train(..., resume_from=input_dir)``: it calls this method, so an override
        runs there too (inside ``train`` the state is restored as a resume, at its exact
        position; see :meth:`.store.TrainingStateStore.resuming`).
        """
        return self.state_store.load(self._training_objects(), input_dir)
