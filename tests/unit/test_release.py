"""Release metadata: one source for the version, and declared lower bounds equal to the tested ones.

The version is ``pytorch_accelerated.__version__``: the build reads it (pyproject.toml declares it
dynamic) and CHANGELOG.md's newest release names it. The lower-bounds tier of
scripts/release-check.sh installs constraints-lower.txt, which must pin exactly the lowest
version of each dependency that pyproject.toml declares, so that what is declared is tested.
"""

from __future__ import annotations

import re

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

import pytorch_accelerated
from tests.helpers import REPO_ROOT

#: A released section of CHANGELOG.md: ``## [1.2.3] - 2026-12-03``.
RELEASE_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\] - \d{4}-\d{2}-\d{2}$", re.MULTILINE)


def pyproject() -> dict:
    with open(REPO_ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)


def test_the_newest_release_in_the_changelog_is_the_package_version() -> None:
    releases = RELEASE_HEADING.findall((REPO_ROOT / "CHANGELOG.md").read_text())
    assert releases, "CHANGELOG.md has no released section (## [X.Y.Z] - YYYY-MM-DD)"
    assert releases[0] == pytorch_accelerated.__version__, (
        f"CHANGELOG.md's newest release is {releases[0]}, the package's __version__ is "
        f"{pytorch_accelerated.__version__}: add a section for it, or set __version__"
    )


def test_the_build_reads_the_version_from_the_package_only() -> None:
    config = pyproject()
    assert "version" not in config["project"] and config["project"]["dynamic"] == ["version"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pytorch_accelerated.__version__"}


def test_the_lower_bounds_tier_installs_exactly_the_declared_lower_bounds() -> None:
    declared = {}
    for line in pyproject()["project"]["dependencies"]:
        requirement = Requirement(line)
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lower) == 1, f"{line!r} in pyproject.toml declares no single lower bound (>=)"
        declared[requirement.name] = Version(lower[0])
    pinned = {}
    for line in (REPO_ROOT / "constraints-lower.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[name.strip()] = Version(version.strip())
    assert pinned == declared
