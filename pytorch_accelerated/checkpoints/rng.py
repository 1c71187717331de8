"""Every random number generator of a process, captured as values that load with
``weights_only=True`` and restored: Python's, torch's (and CUDA's), numpy's."""

from __future__ import annotations

import random
from typing import Any

import numpy as np  # a dependency of accelerate
import torch


def capture_rng_states() -> dict[str, Any]:
    """Every RNG of this process, as values that load with ``weights_only=True``."""
    states: dict[str, Any] = {"python": _to_lists(random.getstate()), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    states["numpy"] = numpy_state_dict(np.random.get_state(legacy=True))
    return states


def numpy_state_dict(state: Any) -> dict[str, Any]:
    """numpy's legacy RNG state ``(kind, keys, position, has_gauss, cached_gaussian)`` as values that
    load with ``weights_only=True`` (:func:`restore_rng_states` takes them back)."""
    kind, keys, position, has_gauss, cached = state
    return {
        "kind": kind,
        "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
        "position": int(position),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(_to_tuples(states["python"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        numpy_state = states["numpy"]
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["position"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        )


def _to_lists(value: Any) -> Any:
    return [_to_lists(item) for item in value] if isinstance(value, tuple) else value


def _to_tuples(value: Any) -> Any:
    return tuple(_to_tuples(item) for item in value) if isinstance(value, list) else value
