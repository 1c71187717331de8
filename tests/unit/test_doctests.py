"""The examples in the package's docstrings run and give the output they show.

Every module is imported and its ``>>>`` examples are run with doctest, in an empty working
directory and with an empty temporary folder, which must both still be empty afterwards: the
examples write their files under temporary directories and remove them. They may seed the
RNGs, but must leave the environment, the working directory and torch's global settings as
they found them.
"""

from __future__ import annotations

import doctest
import importlib
import io
import os
import pkgutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pytorch_accelerated
from pytorch_accelerated import Trainer

PACKAGE = Path(pytorch_accelerated.__file__).resolve().parent
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def walked_module_names() -> set[str]:
    prefix = f"{pytorch_accelerated.__name__}."
    return {info.name for info in pkgutil.walk_packages(pytorch_accelerated.__path__, prefix)}


def module_names() -> list[str]:
    """Every module of the package: those pkgutil finds, and those of folders without an
    ``__init__.py`` (namespace packages such as ``_internal/``), which pkgutil does not walk."""
    from_files = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        from_files.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(walked_module_names() | from_files)


MODULES = module_names()


@pytest.fixture()
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory and temporary folder; checks that both stay empty and that
    the environment and torch's global settings come back unchanged."""
    # torch._dynamo (imported by accelerate when the first Accelerator is made) sets
    # TORCHINDUCTOR_CACHE_DIR from the temporary folder at import: import it before that
    # folder is redirected, so the cache of later tests does not point into this test's.
    importlib.import_module("torch._dynamo")

    work, temporary = tmp_path / "cwd", tmp_path / "tmp"
    work.mkdir()
    temporary.mkdir()
    monkeypatch.delenv("PT_ACC_LIMIT_BATCHES", raising=False)  # would shorten the examples' runs
    monkeypatch.chdir(work)
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    monkeypatch.setenv("TMPDIR", str(temporary))
    environment = _environment()
    settings = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads())
    yield work
    assert os.getcwd() == str(work)
    assert _environment() == environment
    assert (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads()) == settings
    assert sorted(p.name for p in work.iterdir()) == [], "an example left files in the working directory"
    assert sorted(p.name for p in temporary.iterdir()) == [], "an example left files in the temporary folder"


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTEST_CURRENT_TEST"}  # pytest's own


def run_examples(tests: list[doctest.DocTest]) -> tuple[doctest.TestResults, str]:
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    report = io.StringIO()
    for test in tests:
        runner.run(test, out=report.write)
    return runner.summarize(verbose=False), report.getvalue()


def test_every_module_of_the_package_is_listed() -> None:
    assert walked_module_names() <= set(MODULES)
    # The namespace package that pkgutil skips holds examples too.
    assert "pytorch_accelerated._internal.argument_checks" in MODULES
    assert {"pytorch_accelerated", "pytorch_accelerated.trainer", "pytorch_accelerated.utils"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_of_the_module_pass(name: str, isolated: Path) -> None:
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder().find(module, name)
    results, report = run_examples(tests)
    assert results.failed == 0, report


@pytest.mark.parametrize(
    ("name", "obj"),
    [
        ("Trainer", Trainer),
        ("Trainer.train", Trainer.train),
        ("Trainer.evaluate", Trainer.evaluate),
        ("Trainer.save_training_state", Trainer.save_training_state),
    ],
)
def test_the_main_trainer_entry_points_have_examples_that_pass(name: str, obj: Any, isolated: Path) -> None:
    # recurse=False: the examples of this docstring itself, not of the class's methods.
    tests = [test for test in doctest.DocTestFinder(recurse=False).find(obj, name) if test.examples]
    assert tests, f"{name} has no >>> example"
    assert sum(len(test.examples) for test in tests) >= 1
    results, report = run_examples(tests)
    assert results.attempted >= 1
    assert results.failed == 0, report
