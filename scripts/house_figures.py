"""Figures of the house, read from the source: code lines, who names the Trainer, the import circles
(typing imports included), module-level containers, every module with its lines, and the figures of
issue 29 (members of the Trainer bound in from other modules, functions outside ``callbacks/`` that
take the Trainer, string-keyed argument lookups, places that work out the effective per-device batch
size, folder listings of one ``resume_from="auto"`` resume, docs pages).

    .venv/bin/python scripts/house_figures.py            # this checkout
    .venv/bin/python scripts/house_figures.py /some/checkout

The folder listings are counted by running a small resume with the checkout's package (a process of
its own, ``PYTHONPATH`` the checkout); the other figures are read from the source.

Code lines are lines that hold code: not blank, not only a comment, not part of a docstring.
Statements are logical lines (tokenize NEWLINE tokens whose statement does not start on a docstring):
unlike code lines they do not change when the formatter splits or joins a long line, so growth is
measured with them across formatting changes.
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import tokenize
from pathlib import Path
from typing import Any

TRAINER = "pytorch_accelerated.trainer"
#: Besides the callbacks (the Trainer's observers), the modules that name the Trainer by design: the
#: package's entry point, which exports it, and the range test, which runs its loop.
NAME_THE_TRAINER_BY_DESIGN = {"pytorch_accelerated", "pytorch_accelerated.lr_finder"}


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


def import_statements(tree: ast.Module, run_time: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``; with ``run_time``, not those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if run_time and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child)

    visit(tree)
    return found


def import_graph(package: Path, run_time: bool = False) -> dict[str, set[str]]:
    """The package's modules that each of its modules imports, at run time or for typing (only at run
    time with ``run_time``; ``from . import x`` counts as importing the module ``x``, not the package)."""
    paths = {module_name(path, package.parent): path for path in sorted(package.rglob("*.py"))}
    graph = {}
    for name, path in paths.items():
        package_parts = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found: set[str] = set()
        for node in import_statements(ast.parse(path.read_text()), run_time):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = package_parts[: len(package_parts) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                submodules = {f"{target}.{alias.name}" for alias in node.names} & paths.keys()
                found |= submodules or {target}
        graph[name] = {target for target in found if target in paths and target != name}
    return graph


def unit_imports(package: Path) -> dict[str, set[str]]:
    """At run time, the other top-level modules and subpackages (by name: ``data``, ``callbacks``) that
    each top-level module or subpackage of ``package`` imports; ``(package)`` is the package itself."""
    graph = import_graph(package, run_time=True)
    unit = {module: (module.split(".") + ["(package)"])[1] for module in graph}
    imports: dict[str, set[str]] = {name: set() for name in unit.values()}
    for module, targets in graph.items():
        imports[unit[module]] |= {unit[target] for target in targets} - {unit[module]}
    return imports


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


def bound_members(source: str) -> list[str]:
    """Members assigned in ``class Trainer``'s body from a name of another module (``x = module.f``)."""
    return [
        ast.unparse(statement)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef) and node.name == "Trainer"
        for statement in node.body
        if isinstance(statement, ast.Assign) and isinstance(statement.value, (ast.Attribute, ast.Name))
    ]


def _trainer_classes(tree: ast.Module) -> set[str]:
    """The Trainer, the callbacks (``TrainerCallback``: each event hands them the Trainer) and the
    classes of this module derived from them."""
    names = {"Trainer", "TrainerCallback"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and {ast.unparse(base) for base in node.bases} & names:
            names.add(node.name)
    return names


def functions_taking_the_trainer(sources: dict[str, str]) -> list[str]:
    """Functions outside ``callbacks/`` with a parameter annotated as the Trainer (``trainer: Trainer``,
    ``self: Trainer``), the methods of the Trainer, of its subclasses and of callbacks aside."""
    found = []
    for name, source in sources.items():
        if name.startswith("pytorch_accelerated.callbacks"):
            continue
        tree = ast.parse(source)
        classes = _trainer_classes(tree)
        methods = {
            id(member)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and node.name in classes
            for member in node.body
        }
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or id(node) in methods:
                continue
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            if any(
                argument.annotation is not None
                and re.search(r"\bTrainer\b", ast.unparse(argument.annotation))
                for argument in arguments
            ):
                found.append(f"{name}:{node.lineno} {node.name}")
    return found


def _expressions(sources: dict[str, str], wanted: Any) -> list[str]:
    """``module:line expression`` of every node of ``sources`` for which ``wanted(node)`` is true."""
    return [
        f"{name}:{node.lineno} {ast.unparse(node)}"
        for name, source in sources.items()
        for node in ast.walk(ast.parse(source))
        if wanted(node)
    ]


def string_keyed_lookups(sources: dict[str, str]) -> list[str]:
    """``arguments["..."]``: a run's arguments read back from a dict by name."""
    return _expressions(
        sources,
        lambda node: (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "arguments"
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ),
    )


def batch_size_derivations(sources: dict[str, str]) -> list[str]:
    """Places that work out an effective per-device batch size from loader arguments:
    ``kwargs.get("batch_size") or default``."""
    return _expressions(
        sources,
        lambda node: (
            isinstance(node, ast.BoolOp)
            and isinstance(node.op, ast.Or)
            and isinstance(node.values[0], ast.Call)
            and isinstance(node.values[0].func, ast.Attribute)
            and node.values[0].func.attr == "get"
            and [ast.unparse(argument) for argument in node.values[0].args[:1]] == ["'batch_size'"]
        ),
    )


#: Saves a state, then resumes it with ``resume_from="auto"``, counting the listings of the folder.
AUTO_RESUME_LISTINGS = textwrap.dedent(
    """
    import pathlib, sys, torch
    from torch import nn
    from torch.utils.data import TensorDataset
    from pytorch_accelerated import Trainer
    from pytorch_accelerated.callbacks import SaveTrainingStateCallback

    folder = pathlib.Path(sys.argv[1])
    data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))

    def train(num_epochs, **kwargs):
        model = nn.Linear(3, 1)
        saver = SaveTrainingStateCallback(folder, **kwargs)
        trainer = Trainer(model, nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.1), callbacks=(saver,))
        trainer.train(data, num_epochs=num_epochs, per_device_batch_size=4, resume_from="auto")

    train(1, save_every_n_epochs=1, save_at_end=False)
    listings, iterdir = [], pathlib.Path.iterdir
    def counted(path):
        if path == folder:
            listings.append(path)
        return iterdir(path)
    pathlib.Path.iterdir = counted
    train(2, save_at_end=False)  # resumes epoch_1 and saves nothing
    print(len(listings))
    """
)


def folder_listings_of_an_auto_resume(root: Path) -> int:
    """How often one ``train(resume_from="auto")`` lists the folder of states (run with ``root``'s package)."""
    with tempfile.TemporaryDirectory() as folder:
        run = subprocess.run(
            [sys.executable, "-c", AUTO_RESUME_LISTINGS, str(Path(folder) / "states")],
            env={**os.environ, "PYTHONPATH": str(root)},
            cwd=root,  # python -c puts the working directory first on sys.path
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
    return int(run.stdout.split()[-1])


def docs_pages(root: Path) -> tuple[int, int]:
    """The docs' pages and their lines."""
    pages = sorted((root / "docs").rglob("*.md"))
    return len(pages), sum(len(page.read_text().splitlines()) for page in pages)


def _listed(title: str, rows: list[str]) -> None:
    print(f"{title}: {len(rows)}")
    for row in rows:
        print(f"  {row}")


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
        f"import circles without the edges back to the trainer from its observers (callbacks) "
        f"and the range test (lr_finder): "
        f"{circles(without_edges_back_to_the_trainer(graph))}"
    )
    print(f"run-time import circles: {circles(import_graph(package, run_time=True))}")
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
    by_size = sorted(((len(source.splitlines()), name) for name, source in sources.items()), reverse=True)
    print("longest modules: " + ", ".join(f"{name} {lines}" for lines, name in by_size[:5]))
    trainer = sources.get(TRAINER, "")
    _listed("members of the Trainer bound in from other modules", bound_members(trainer))
    _listed("functions outside callbacks/ that take the Trainer", functions_taking_the_trainer(sources))
    _listed('string-keyed argument lookups (arguments["..."])', string_keyed_lookups(sources))
    _listed("places that work out the effective per-device batch size", batch_size_derivations(sources))
    print(
        f'listings of the folder of states in one resume_from="auto": {folder_listings_of_an_auto_resume(root)}'
    )
    pages, lines = docs_pages(root)
    print(f"docs: {pages} pages, {lines} lines")
    print(f"modules with their lines ({len(by_size)}):")
    for lines, name in by_size:
        print(f"  {lines:5d} {name}")


if __name__ == "__main__":
    main()
