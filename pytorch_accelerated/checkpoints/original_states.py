"""Training-state directories written by pytorch-accelerated 0.1.x (read only; we write ours).

Knows nothing of the Trainer. Such a directory is accelerate's ``save_state`` layout plus
``trainer_metadata.pt`` (``{"current_epoch": E, **checkpoint_kwargs}``), with no manifest::

    model.safetensors (or pytorch_model.bin)   weights
    optimizer.bin                              optimizer state
    custom_checkpoint_<i>.pkl                  scheduler state, one copy per save so far
    random_states_<rank>.pkl                   python, numpy, torch (and CUDA) RNG states
    scaler.pt                                  gradient scaler (fp16 runs only)
    trainer_metadata.pt

Everything is loaded safely: weights with safetensors or ``weights_only=True``, the RNG files
with numpy's array types allow-listed (or skipped with a warning when they still do not load).
FSDP-sharded layouts are refused.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import torch_files
from .rng import numpy_state_dict

METADATA = "trainer_metadata.pt"


@dataclass
class OriginalState:
    """The files of an original training state, read (nothing loaded into any object)."""

    current_epoch: int
    checkpoint_kwargs: dict[str, Any]
    model: dict[str, Any]
    objects: dict[str, Any]  # our file names (optimizer.pt, scheduler.pt, scaler.pt) -> state dict
    rng: dict[str, Any] | None  # in the layout of rng.capture_rng_states; None: not restorable


def is_original_state(directory: Path) -> bool:
    """True if ``directory`` is a training state written by the original library."""
    return (directory / METADATA).is_file() and not (directory / "manifest.json").exists()


def read_original_state(directory: Path, rank: int) -> OriginalState:
    """Read every file of the original training state ``directory`` that this process needs.

    Raises:
        ValueError: for an FSDP-sharded or sharded-weights layout, or metadata without a
            whole-number ``current_epoch``. FileNotFoundError: when the weights are missing.
    """
    sharded = sorted(
        path.name
        for path in directory.iterdir()
        if path.name.startswith(("pytorch_model_fsdp", "optimizer_0")) or path.name.endswith(".index.json")
    )
    if sharded:
        raise ValueError(
            f"{directory} is a sharded (FSDP) training state of pytorch-accelerated 0.1.x ({', '.join(sharded)}); "
            f"only whole-model states can be resumed. Consolidate the weights with the original library, "
            f"or resume from a state saved without sharding."
        )
    metadata = torch_files.safe_torch_load(directory / METADATA)
    epoch = metadata.get("current_epoch") if isinstance(metadata, dict) else None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        raise ValueError(
            f"{directory / METADATA} holds no whole-number 'current_epoch' >= 1 (got {epoch!r}): it is not a training state of pytorch-accelerated."
        )
    objects = {
        name: torch_files.safe_torch_load(directory / original)
        for name, original in _OBJECT_FILES.items()
        if (directory / original).is_file()
    }
    schedulers = [  # one copy per save so far: the newest is the one to load
        (int(match.group(1)), path)
        for path in directory.glob("custom_checkpoint_*.pkl")
        if (match := re.fullmatch(r"custom_checkpoint_(\d+)\.pkl", path.name))
    ]
    if schedulers:
        objects["scheduler.pt"] = torch_files.safe_torch_load(max(schedulers)[1])
    return OriginalState(
        epoch,
        {key: value for key, value in metadata.items() if key != "current_epoch"},
        _read_weights(directory),
        objects,
        _read_rng(directory, rank),
    )


_OBJECT_FILES = {"optimizer.pt": "optimizer.bin", "scaler.pt": "scaler.pt"}


def _read_weights(directory: Path) -> dict[str, Any]:
    if (directory / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return dict(load_file(str(directory / "model.safetensors")))
    if (directory / "pytorch_model.bin").is_file():
        return dict(torch_files.safe_torch_load(directory / "pytorch_model.bin"))
    raise FileNotFoundError(
        f"{directory} holds neither model.safetensors nor pytorch_model.bin: the weights are missing."
    )


def _read_rng(directory: Path, rank: int) -> dict[str, Any] | None:
    path = directory / f"random_states_{rank}.pkl"
    if not path.is_file():
        path = directory / "random_states_0.pkl"  # saved with fewer processes
    if not path.is_file():
        return None
    try:
        with torch.serialization.safe_globals(_numpy_array_types()):
            return _to_our_rng_layout(torch.load(path, weights_only=True))
    except Exception as error:  # not loadable safely: resume without these RNG states
        # Torch's reason, without its advice to load with weights_only=False.
        warnings.warn(
            f"Could not load {path} safely ({torch_files.torch_load_reason(error)}); the RNGs are not restored.",
            stacklevel=5,
        )
        return None


def _numpy_array_types() -> list[Any]:
    import numpy as np

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _to_our_rng_layout(saved: dict[str, Any]) -> dict[str, Any]:
    """accelerate's RNG file (``random_state``, ``numpy_random_seed``, ``torch_manual_seed``,
    ``torch_cuda_manual_seed``) in the layout that :func:`.rng.restore_rng_states` takes."""
    states: dict[str, Any] = {"python": saved["random_state"], "torch": saved["torch_manual_seed"]}
    if "torch_cuda_manual_seed" in saved:
        states["cuda"] = saved["torch_cuda_manual_seed"]
    if "numpy_random_seed" in saved:
        states["numpy"] = numpy_state_dict(saved["numpy_random_seed"])
    return states
