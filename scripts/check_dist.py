"""Checks the sdist and the wheel that ``python -m build`` left in DIST_DIR (scripts/release-check.sh
runs it): both carry the version of ``pytorch_accelerated/__init__.py`` (the one source of the
version), and the wheel holds every module of every package folder of the source tree and
nothing else: no tests, examples, benchmarks or scripts.

    python scripts/check_dist.py DIST_DIR
"""

from __future__ import annotations

import ast
import sys
import tarfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pytorch_accelerated"


def source_version() -> str:
    tree = ast.parse((REPO_ROOT / PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__version__" for target in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise SystemExit(f"{PACKAGE}/__init__.py sets no __version__")


def source_modules() -> set[str]:
    """Every .py file of the package's source tree, as a path relative to the repository."""
    return {
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / PACKAGE).rglob("*.py")
        if "__pycache__" not in path.parts
    }


def one_file(dist_dir: Path, pattern: str) -> Path:
    found = sorted(dist_dir.glob(pattern))
    if len(found) != 1:
        raise SystemExit(f"expected one {pattern} in {dist_dir}, found {[path.name for path in found]}")
    return found[0]


def check_wheel(wheel: Path, version: str) -> list[str]:
    problems = []
    dist_info = f"{PACKAGE}-{version}.dist-info"
    if not wheel.name.startswith(f"{PACKAGE}-{version}-"):
        problems.append(f"the wheel {wheel.name} does not carry the source version {version}")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    top_level = {name.split("/", 1)[0] for name in names}
    if top_level != {PACKAGE, dist_info}:
        problems.append(f"the wheel holds {sorted(top_level - {PACKAGE, dist_info})} beside {PACKAGE}")
    modules = source_modules()
    folders = sorted({str(Path(module).parent.as_posix()) for module in modules})
    for folder in folders:
        if f"{folder}/__init__.py" not in names:
            problems.append(f"package folder {folder}/ is not in the wheel: does it have an __init__.py?")
    for module in sorted(modules - names):
        if f"{Path(module).parent.as_posix()}/__init__.py" in names:
            problems.append(f"{module} is missing from the wheel")
    for extra in sorted(name for name in names - modules if name.endswith(".py")):
        problems.append(f"{extra} is in the wheel but not in the source tree")
    print(f"wheel {wheel.name}: {len(modules & names)} modules in {len(folders)} package folders")
    return problems


def check_sdist(sdist: Path, version: str) -> list[str]:
    root = f"{PACKAGE}-{version}"
    if sdist.name != f"{root}.tar.gz":
        return [f"the sdist {sdist.name} does not carry the source version {version}"]
    with tarfile.open(sdist) as archive:
        names = set(archive.getnames())
    missing = sorted(f"{root}/{module}" for module in source_modules() if f"{root}/{module}" not in names)
    missing += [f"{root}/{name}" for name in ("pyproject.toml", "README.md") if f"{root}/{name}" not in names]
    print(f"sdist {sdist.name}: {len(names)} entries")
    return [f"{name} is missing from the sdist" for name in missing]


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    dist_dir = Path(sys.argv[1])
    version = source_version()
    problems = check_sdist(one_file(dist_dir, "*.tar.gz"), version)
    problems += check_wheel(one_file(dist_dir, "*.whl"), version)
    if problems:
        raise SystemExit("The built distributions are wrong:\n  " + "\n  ".join(problems))
    print(f"DIST OK {PACKAGE} {version}")


if __name__ == "__main__":
    main()
