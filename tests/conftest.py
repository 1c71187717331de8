"""The suite's folders are its kinds; each test gets the marker of its folder.

- ``tests/unit``: fast single-process tests (a real ``Accelerator(cpu=True)``, no subprocess);
- ``tests/integration``: real single-process runs that are slower: resume, checkpoint and state
  faults, signals, scripts started in a subprocess (their scripts in ``integration/workers``);
- ``tests/distributed``: real multi-process runs (their scripts in ``distributed/workers``);
- ``tests/compat``: code written for the original library, run unchanged;
- ``tests/examples``: the example scripts, end to end.

A test elsewhere that starts 2 processes (an example on 2 processes, a 2-process compat script)
carries ``@pytest.mark.distributed`` itself. ``tests`` is a package: every test, and every
worker script (their environment is :func:`tests.helpers.subprocess_env`), imports the shared
code as ``from tests.helpers import ...`` and ``from tests.launch import ...``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
KINDS = ("unit", "integration", "distributed", "compat", "examples")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        kind = item.path.resolve().relative_to(TESTS_DIR).parts[0]
        if kind in KINDS:
            item.add_marker(getattr(pytest.mark, kind))
