"""The docs gate fails on a warning: a copy of the site's sources whose Trainer docstring gains a
malformed ``Args`` line makes ``scripts/docs-gate.sh`` (what CI runs) exit non-zero, naming it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.helpers import REPO_ROOT, subprocess_env

MALFORMED = "        a line with no colon"


def copy_of_the_site_sources(tmp_path: Path) -> Path:
    root = tmp_path / "site-sources"
    for folder in ("docs", "pytorch_accelerated", "scripts"):
        shutil.copytree(REPO_ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "mkdocs.yml", root / "mkdocs.yml")
    return root


def test_the_docs_gate_fails_when_a_docstring_gains_a_malformed_section(tmp_path: Path) -> None:
    root = copy_of_the_site_sources(tmp_path)
    trainer = root / "pytorch_accelerated" / "trainer.py"
    source = trainer.read_text()
    assert source.count("    Args:\n") >= 1
    trainer.write_text(source.replace("    Args:\n", f"    Args:\n{MALFORMED}\n", 1))
    env = subprocess_env(tmp_path)
    env["PATH"] = f"{Path(shutil.which('mkdocs') or REPO_ROOT / '.venv/bin/mkdocs').parent}:{env['PATH']}"
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "docs-gate.sh"), "mkdocs.yml"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "docs: the build failed" in output, output
    assert "pytorch_accelerated/trainer.py" in output and "Failed to get 'name: description' pair" in output
    assert "a line with no colon" in output, output
