"""Figures of the house, read from the source: code lines, who names the Trainer, the import circles
(typing imports included), module-level containers, the longest modules.

    .venv/bin/python scripts/house_figures.py            # this checkout
    .venv/bin/python scripts/house_figures.py /some/checkout

Code lines are lines that hold code: not blank, not only a comment, not part of a docstring.
Statements are logical lines (tokenize NEWLINE tokens whose statement does not start on a docstring):
unlike code lines they do not change when the formatter splits or joins a long line, so growth is
measured with them across formatting changes.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
PACKAGE = ROOT / "pytorch_accelerated"
PATHS = sorted(PACKAGE.rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {module_name(path) for path in PATHS}


def docstring_lines(source: str) -> set[int]:
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return docstrings


def code_lines(source: str) -> int:
    docstrings = docstring_lines(source)
    lines: set[int] = set()
    skipped = (
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    )
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            lines.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(lines)


def statements(source: str) -> int:
    docstrings = docstring_lines(source)
    count = 0
    start = None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        start = token.start[0] if start is None else start
        if token.type == tokenize.NEWLINE:
            count += start not in docstrings
            start = None
    return count


def imports(path: Path) -> set[str]:
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            submodules = {f"{target}.{alias.name}" for alias in node.names} & NAMES
            found |= submodules or {target}
    return {name for name in found if name in NAMES and name != module_name(path)}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while component[-1:] != [module]:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def main() -> None:
    sources = {module_name(path): path.read_text() for path in PATHS}
    print(
        f"code lines: {sum(code_lines(source) for source in sources.values())}, "
        f"statements: {sum(statements(source) for source in sources.values())}  (all lines: "
        f"{sum(len(source.splitlines()) for source in sources.values())})"
    )
    graph = {module_name(path): imports(path) for path in PATHS}
    naming = sorted(module for module, targets in graph.items() if "pytorch_accelerated.trainer" in targets)
    print(f"modules that import the trainer (typing too): {len(naming)}")
    for module in naming:
        print(f"  {module}")
    for component in circles(graph):
        print(f"import circle of {len(component)} modules (typing imports included): {', '.join(component)}")
    by_design = {"pytorch_accelerated.runs", "pytorch_accelerated.timm_schedulers"}
    forward = {
        module: {
            target
            for target in targets
            if not (
                target == "pytorch_accelerated.trainer"
                and (module in by_design or module.startswith("pytorch_accelerated.callbacks"))
            )
        }
        for module, targets in graph.items()
    }
    print(
        f"import circles without the edges back to the trainer from its observers (callbacks), "
        f"its run adapter (runs) and its subclass (timm_schedulers): {circles(forward)}"
    )
    containers = []
    for name, source in sources.items():
        for node in ast.parse(source).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is None:
                continue
            empty = isinstance(value, (ast.List, ast.Set, ast.Dict)) and not (
                getattr(value, "elts", None) or getattr(value, "keys", None)
            )
            call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in (
                "WeakKeyDictionary",
                "WeakSet",
                "WeakValueDictionary",
                "set",
                "list",
                "dict",
            )
            if empty or call:
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                containers.append(f"{name}.{ast.unparse(target)}")
    print(f"module-level containers: {containers}")
    longest = sorted(((len(source.splitlines()), name) for name, source in sources.items()), reverse=True)[:5]
    print("longest modules: " + ", ".join(f"{name} {lines}" for lines, name in longest))


if __name__ == "__main__":
    main()
