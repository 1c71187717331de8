"""Counts the checks of the test suite, per file: ``assert`` statements and ``pytest.raises`` (and
``pytest.warns``) uses, read from the source with ``ast``, in the test files and in the scripts the
tests run (workers, compat scripts). A refactoring of the suite should not lower them.

    .venv/bin/python scripts/count_assertions.py                 # this checkout, a table
    .venv/bin/python scripts/count_assertions.py --totals        # only the totals
    .venv/bin/python scripts/count_assertions.py --compare OTHER_CHECKOUT
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def count(path: Path) -> tuple[int, int]:
    """(assert statements, pytest.raises / pytest.warns calls) in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    asserts = raises = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            asserts += 1
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("raises", "warns")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "pytest"
        ):
            raises += 1
    return asserts, raises


def counts(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(path.relative_to(root)): count(path)
        for path in sorted((root / "tests").rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def totals(table: dict[str, tuple[int, int]]) -> tuple[int, int]:
    return sum(a for a, _ in table.values()), sum(r for _, r in table.values())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--totals", action="store_true", help="print only the totals")
    parser.add_argument("--compare", type=Path, help="another checkout: print the files whose counts differ")
    args = parser.parse_args()
    table = counts(args.root)
    if args.compare is not None:
        other = counts(args.compare)
        print("| file | asserts before | after | raises/warns before | after |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name in sorted(set(table) | set(other)):
            before, after = other.get(name, (0, 0)), table.get(name, (0, 0))
            if before != after:
                print(f"| `{name}` | {before[0]} | {after[0]} | {before[1]} | {after[1]} |")
        (a0, r0), (a1, r1) = totals(other), totals(table)
        print(f"| **all** | {a0} | {a1} | {r0} | {r1} |")
        return 0
    if not args.totals:
        print("| file | asserts | pytest.raises / warns |")
        print("| --- | ---: | ---: |")
        for name, (asserts, raises) in table.items():
            if asserts or raises:
                print(f"| `{name}` | {asserts} | {raises} |")
    asserts, raises = totals(table)
    print(f"total: {asserts} assert statements, {raises} pytest.raises/warns, in {len(table)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
