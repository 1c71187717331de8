"""Single-file checkpoints: safe values in, atomic writes, safe loading.

Knows nothing of the Trainer or callbacks. Files are loaded with ``torch.load(...,
weights_only=True)``, which never runs code from the file; to make that possible, values that
only plain pickle could restore are converted when saving (numpy scalars to Python numbers,
numpy arrays to tensors, paths to strings), and anything else unsafe is refused before a byte
is written.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import torch

_SAFE_SCALARS = (str, bytes, int, float, bool, complex, type(None))


def to_safe_value(value: Any, where: str = "checkpoint_kwargs") -> Any:
    """Convert ``value`` to something ``torch.load(weights_only=True)`` can read back.

    Raises:
        TypeError: for values that have no safe equivalent, naming where they were found.
    """
    # Before the scalar check: np.float64 and np.str_ subclass float and str, but pickle as numpy.
    if type(value).__module__ == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(np.ascontiguousarray(value))
        if isinstance(value, np.generic):
            return value.item()
    if isinstance(value, (*_SAFE_SCALARS, torch.Tensor, torch.dtype, torch.device, torch.Size)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return {key: to_safe_value(item, f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        converted = [to_safe_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
        return converted if isinstance(value, list) else tuple(converted)
    raise TypeError(
        f"{where} holds a {type(value).__module__}.{type(value).__qualname__}, which cannot be "
        f"loaded back safely (checkpoints load with weights_only=True, which never runs code "
        f"from the file). Convert it to a tensor, number, string, list or dict before saving."
    )


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """Write ``obj`` to ``path`` so that ``path`` is either the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp creates the file readable by its owner only; give it the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """Load a file written by :func:`atomic_torch_save` without running code from it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No checkpoint file at {str(path)!r}.")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise pickle.UnpicklingError(
            f"Refused to load {str(path)!r}: it holds objects that could run code when unpickled, "
            f"and checkpoints are only loaded with weights_only=True. If you trust this file, load "
            f"it yourself with torch.load(..., weights_only=False). Details: {error}"
        ) from error
