"""The fixture the 2-process tests share; they launch their workers with :mod:`tests.launch`."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.launch import load_worker_module


@pytest.fixture(scope="session")
def worker_common() -> ModuleType:
    """The model and data-set factories the workers use, for plain-PyTorch oracles."""
    return load_worker_module("common")
