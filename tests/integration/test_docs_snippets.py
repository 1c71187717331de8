"""Every ```python block of README.md and docs/**/*.md runs, or is marked illustrative.

Convention: a fenced ```python block is *illustrative* (shown, not run) when the line just
before its opening fence is the HTML comment ``<!-- illustrative -->`` (invisible in the built
site). Every other ```python block is runnable. Blocks of other languages (bash, yaml, text)
are never run. A page whose blocks need packages of an extra declares them on a line of its own,
``<!-- needs: tensorboard -->`` (invisible in the built site): where one of them does not import (the
release check's lower-bounds environment has no trackers extra), the page is skipped, naming it; with
the dev extras installed it always runs.

The runnable blocks of one page run in order, as one script, in a fresh process and namespace
(forked from the suite's one interpreter that has imported torch: :mod:`tests.forked`) in a
temporary directory, offline (``HF_HUB_OFFLINE=1``), on one CPU process: a
block may use names defined by the blocks before it on the same page. Keep runnable blocks
small (a few epochs on the scikit-learn digits); mark long trainings, multi-process launches
and GPU-only settings illustrative.

The package's own docstring examples run in tests/unit/test_doctests.py.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests import forked
from tests.helpers import REPO_ROOT, subprocess_env

ILLUSTRATIVE = "<!-- illustrative -->"
NEEDS = re.compile(r"^<!-- needs: (?P<modules>[\w., ]+) -->$", re.MULTILINE)
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")


def doc_pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """Return ``(line number, code, runnable)`` for each ```python block of ``text``."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match or not match["lang"]:
            i += 1
            continue
        start, indent, body = i, len(match["indent"]), []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:])
            i += 1
        i += 1
        if match["lang"] in ("python", "py"):
            previous = next((line.strip() for line in reversed(lines[:start]) if line.strip()), "")
            blocks.append((start + 1, "\n".join(body), previous != ILLUSTRATIVE))
    return blocks


def page_script(page: Path) -> str | None:
    """The runnable blocks of ``page`` joined into one script, or None if it has none."""
    parts = [
        f"# --- {page.name}:{line}\n{code}\n"
        for line, code, runnable in python_blocks(page.read_text())
        if runnable
    ]
    return "\n".join(parts) if parts else None


def needed_modules(text: str) -> list[str]:
    """The modules a page declares with ``<!-- needs: a, b -->`` lines."""
    return [name.strip() for match in NEEDS.finditer(text) for name in match["modules"].split(",")]


def test_the_block_parser_honours_the_convention() -> None:
    text = "a\n\n```python\nx = 1\n```\n\n<!-- illustrative -->\n```python\ny = 2\n```\n```bash\nls\n```\n"
    assert python_blocks(text) == [(3, "x = 1", True), (8, "y = 2", False)]
    assert needed_modules("text\n<!-- needs: tensorboard, mlflow -->\n```python\n") == [
        "tensorboard",
        "mlflow",
    ]


PAGES = [page for page in doc_pages() if page_script(page) is not None]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO_ROOT)) for p in PAGES])
def test_page_snippets_run(page: Path, tmp_path: Path) -> None:
    script = page_script(page)
    assert script is not None
    for module in needed_modules(page.read_text()):
        pytest.importorskip(module, reason=f"{page.name} declares that it needs {module!r}")
    env = subprocess_env(tmp_path)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"})
    result = forked.run_code(script, cwd=tmp_path, env=env, timeout=120)
    assert result.returncode == 0, (
        f"a runnable ```python block of {page.relative_to(REPO_ROOT)} failed (mark it illustrative with "
        f"{ILLUSTRATIVE!r} on the line before its fence if it is not meant to run):\n{result.stderr[-4000:]}"
    )


def test_the_walk_throughs_stay_runnable() -> None:
    """The README's and the quickstart's examples are run, not merely shown."""
    assert {REPO_ROOT / "README.md", REPO_ROOT / "docs" / "quickstart.md"} <= set(PAGES)


PUBLIC_MODULES = [
    "pytorch_accelerated",
    "pytorch_accelerated.callbacks",
    "pytorch_accelerated.schedulers",
    "pytorch_accelerated.schedulers.wsd_scheduler",
    "pytorch_accelerated.finetuning",
    "pytorch_accelerated.tracking",
    "pytorch_accelerated.utils",
]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_is_in_the_api_reference(module_name: str) -> None:
    """Each name of a public module's ``__all__`` is on a page of docs/api (a ``:::`` directive or,
    for re-exports of accelerate that mkdocstrings cannot render, a mention)."""
    module = importlib.import_module(module_name)
    reference = "".join(page.read_text() for page in (REPO_ROOT / "docs" / "api").glob("*.md"))
    missing = [name for name in module.__all__ if name != "__version__" and name not in reference]
    assert not missing, f"{module_name} names missing from docs/api/*.md: {missing}"
