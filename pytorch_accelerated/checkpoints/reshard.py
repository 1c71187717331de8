"""Resuming a training state on other settings: another number of processes, per-device batch
size or accumulation.

The shuffle order of an epoch is global (:class:`~pytorch_accelerated.data.ReproducibleShuffleSampler`:
one permutation, cut into batches that accelerate deals to the processes in turn), so a
position saved mid-epoch is a number of samples of that order: after batch *k* of P processes
of per-device batch B, the first ``k * P * B`` (plus any the epoch's order started after, when
it was itself resumed on other settings). On the new settings (P' processes, batch B',
accumulation A'), the resumed epoch:

- starts its order after ``skip = consumed - k' * P' * B'`` samples, where ``k'`` is the
  largest multiple of A' with ``k' * P' * B' <= consumed`` (whole accumulation windows);
- sets the position to batch ``k'``, whose first ``k'`` batches per process (samples ``skip``
  to ``consumed``, already seen) are skipped at the sampler level, as in any resume, so the
  rest of the epoch is exactly the unseen samples, cut into batches and dealt out again;
  windows stay aligned on multiples of A'. When ``consumed`` is not a multiple of the new
  global batch, nothing is split: the new batches start at the first unseen sample and, as
  in every epoch, the last one may be partial (accelerate completes its last round with
  samples from the round it started with, unless ``drop_last``).

Each process's share of the epoch's loss so far (saved per rank) is summed into rank 0, so the
epoch's mean is unchanged; RNG states go to the rank that saved them, and a new rank r gets
those of rank ``r mod P``, reseeded by r. Step counters and the scheduler count updates and
are kept as saved. Knows nothing of the Trainer: it is given numbers and states.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Marks the RNG states given to a rank that did not save any (see :func:`remap_process_states`).
RESEED_KEY = "reseed_for_rank"


@dataclass(frozen=True)
class BatchSettings:
    """What decides how an epoch's order is cut into batches and updates."""

    num_processes: int
    per_device_batch_size: int
    gradient_accumulation_steps: int

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> BatchSettings:
        """The settings a manifest records (0 for one saved outside a training run)."""
        return cls(
            *(
                int(manifest.get(key) or 0)
                for key in ("num_processes", "per_device_batch_size", "gradient_accumulation_steps")
            )
        )

    @property
    def global_batch(self) -> int:
        """Samples of the epoch's order taken by one batch index (one batch on every process)."""
        return self.num_processes * self.per_device_batch_size

    def describe(self) -> str:
        return (
            f"{self.num_processes} process(es) x per_device_batch_size {self.per_device_batch_size} x "
            f"gradient_accumulation_steps {self.gradient_accumulation_steps}"
        )


@dataclass(frozen=True)
class MappedPosition:
    """Where a resumed epoch continues: batch ``batch_index`` of an order that starts after
    ``skip`` samples; ``consumed`` samples of the epoch had been seen."""

    consumed: int
    batch_index: int
    skip: int


def map_position(
    consumed: int, now: BatchSettings, num_samples: int, batches_per_epoch: int
) -> MappedPosition:
    """The position on the settings ``now`` after ``consumed`` samples of an epoch of
    ``num_samples`` (``batches_per_epoch`` per process on ``now``, used when all were seen).

    >>> now = BatchSettings(num_processes=4, per_device_batch_size=2, gradient_accumulation_steps=1)
    >>> map_position(12, now, 28, 4)  # 12 seen: batch 1 (8 samples) of an order starting at 4
    MappedPosition(consumed=12, batch_index=1, skip=4)
    >>> map_position(28, now, 28, 4)  # the epoch's training is done
    MappedPosition(consumed=28, batch_index=4, skip=0)
    """
    if consumed >= num_samples:
        return MappedPosition(consumed, batches_per_epoch, 0)
    window = now.global_batch * now.gradient_accumulation_steps
    batch_index = (consumed // window) * now.gradient_accumulation_steps
    return MappedPosition(consumed, batch_index, consumed - batch_index * now.global_batch)


def kept_accumulation(
    saved: BatchSettings, saved_asked: int | None, now: BatchSettings, directory: Path
) -> int | None:
    """The accumulation that keeps the global batch of a state ``saved`` on another number of
    processes, when the run's settings ``now`` (its accumulation: the one ``train()`` was given)
    are the script's that saved it (the same per-device batch, and the accumulation asked then,
    ``saved_asked``); None when the processes or those settings differ (``now`` applies).

    >>> saved = BatchSettings(2, 8, 1)  # 16 samples per update
    >>> kept_accumulation(saved, 1, BatchSettings(1, 8, 1), Path("s"))
    2
    >>> kept_accumulation(BatchSettings(1, 8, 2), 1, BatchSettings(2, 8, 1), Path("s"))  # and back
    1

    Raises:
        ValueError: naming the numbers and the fixes, when ``now``'s processes x per-device batch
            does not divide the saved global batch.
    """
    # The accumulation asked then: the one saved, unless the saving run kept a global batch itself.
    if saved.num_processes in (0, now.num_processes) or (
        now.per_device_batch_size,
        now.gradient_accumulation_steps,
    ) != (saved.per_device_batch_size, saved_asked or saved.gradient_accumulation_steps):
        return None
    samples = saved.global_batch * saved.gradient_accumulation_steps
    if samples % now.global_batch == 0:
        return samples // now.global_batch
    fitting = [
        n
        for n in range(1, samples // saved.per_device_batch_size + 1)
        if samples % (n * saved.per_device_batch_size) == 0
    ]
    raise ValueError(
        f"Cannot resume {directory} on {now.num_processes} process(es) with the same global batch: it was "
        f"saved with {saved.describe()} ({samples} samples per update), and {samples} is not a multiple of "
        f"{now.num_processes} x per_device_batch_size {now.per_device_batch_size} = {now.global_batch}, so no "
        f"gradient_accumulation_steps keeps it. Launch on {' or '.join(map(str, fitting))} process(es), or "
        f"choose the new global batch yourself: pass another per_device_batch_size or "
        f"gradient_accumulation_steps to train(), or name the state (resume_from={str(directory)!r}), "
        f"which keeps the settings train() is given."
    )


def unmappable_loader_reason(train_dl_kwargs: dict[str, Any], dataset: Any, map_style: bool) -> str:
    """Why the training loader has no global order to map a position through."""
    if not map_style:
        return f"the training set ({type(dataset).__name__}) is a stream (an IterableDataset), whose position is not a sample count"
    for key in ("batch_sampler", "sampler"):
        if train_dl_kwargs.get(key) is not None:
            return f"train_dataloader_kwargs gives a custom {key} ({type(train_dl_kwargs[key]).__name__}), whose order the Trainer does not know"
    if train_dl_kwargs.get("shuffle") is False:
        return "train_dataloader_kwargs has shuffle=False, so the Trainer's reproducible shuffle sampler is not used"
    return "the training loader does not use the Trainer's ReproducibleShuffleSampler (create_train_dataloader was overridden?)"


def check_same_training_set(
    state: dict[str, Any], manifest: dict[str, Any], num_samples: int, saved: BatchSettings, directory: Path
) -> None:
    """Raise unless the state was saved over a training set of ``num_samples`` samples: the
    recorded length, or (older states) one consistent with the recorded batches per epoch."""
    recorded, batches = state.get("train_samples"), manifest.get("num_batches_per_epoch")
    fits = (
        int(recorded) == num_samples
        if recorded is not None
        else batches in (math.ceil(num_samples / saved.global_batch), num_samples // saved.global_batch)
    )
    found = (
        f"{recorded} training samples"
        if recorded is not None
        else f"{batches} batches per epoch (on {saved.num_processes} process(es) of {saved.per_device_batch_size})"
    )
    if not fits:
        raise ValueError(
            f"{directory} was saved mid-epoch with {found}, but this run's training set has {num_samples} samples: "
            f"the training set differs, so the saved position means nothing here. Resume with the same data set."
        )


def remap_process_states(saved: list[dict[str, Any]], rank: int, num_processes: int) -> dict[str, Any]:
    """Process ``rank``'s own state (RNGs, share of the epoch's loss) when ``saved`` (one per
    saved rank) was written by another number of processes than ``num_processes``.

    The shares of the epoch's loss (and of the loss since the last step-metrics point) are
    summed into rank 0, the others start at zero, so sums over the processes are unchanged.
    Rank r takes the RNG states of rank ``r mod len(saved)``; a rank that saved none is marked
    (:data:`RESEED_KEY`) to reseed from them, so no two ranks draw the same numbers.
    """
    own = saved[rank % len(saved)]
    points = [(state.get("step_metrics") or {}).get("loss_since_point") for state in saved]
    return {
        **own,
        "rng": {**own["rng"], **({RESEED_KEY: rank} if rank >= len(saved) else {})},
        "train_loss": _summed([state.get("train_loss") for state in saved]) if rank == 0 else None,
        "step_metrics": {"loss_since_point": _summed(points)} if rank == 0 and any(points) else None,
    }


def _summed(shares: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    present = [share for share in shares if share is not None]
    return (
        {
            "total": sum((share["total"] for share in present), 0.0),
            "count": sum((share["count"] for share in present), 0),
        }
        if present
        else None
    )
