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

TRAINER = "pytorch_accelerated.trainer"
#: Besides the callbacks (the Trainer's observers), the modules that name the Trainer by design:
#: the entry point, its adapter (runs), its subclass, and the range test, which runs its loop.
NAME_THE_TRAINER_BY_DESIGN = {
    "pytorch_accelerated",
    "pytorch_accelerated.runs",
    "pytorch_accelerated.timm_schedulers",
    "pytorch_accelerated.lr_finder",
}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def import_graph(package: Path) -> dict[str, set[str]]:
    """The package's modules that each of its modules imports, at run time or for typing (``from .
    import x`` counts as importing the module ``x``, not the package)."""
    paths = {module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package_parts[: len(package_parts) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                submodules = {f"{target}.{alias.name}" for alias in node.names} & paths.keys()
                found |= submodules or {target}
        graph[name] = {target for target in found if target in paths and target != name}
    return graph


def names_the_trainer_by_design(module: str) -> bool:
    return module in NAME_THE_TRAINER_BY_DESIGN or module.startswith("pytorch_accelerated.callbacks")


def without_edges_back_to_the_trainer(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` without the edges to the trainer from the modules that name it by design."""
    return {
        module: {
            target for target in targets if not (target == TRAINER and names_the_trainer_by_design(module))
        }
        for module, targets in graph.items()
    }


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
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
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
    package = root / "pytorch_accelerated"
    sources = {module_name(path, root): path.read_text() for path in sorted(package.rglob("*.py"))}
    print(
        f"code lines: {sum(code_lines(source) for source in sources.values())}, "
        f"statements: {sum(statements(source) for source in sources.values())}  (all lines: "
        f"{sum(len(source.splitlines()) for source in sources.values())})"
    )
    graph = import_graph(package)
    naming = sorted(module for module, targets in graph.items() if TRAINER in targets)
    print(f"modules that import the trainer (typing too): {len(naming)}")
    for module in naming:
        print(f"  {module}")
    for component in circles(graph):
        print(f"import circle of {len(component)} modules (typing imports included): {', '.join(component)}")
    print(
        f"import circles without the edges back to the trainer from its observers (callbacks), "
        f"its adapter (runs), its subclass (timm_schedulers) and the range test (lr_finder): "
        f"{circles(without_edges_back_to_the_trainer(graph))}"
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
