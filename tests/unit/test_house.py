"""The shape of the package: sizes, layering, no reaching into private names, the module map.

These read the source (the AST), so the house cannot drift from the module map in the package
docstring and "Where things live" in docs/inside-the-trainer.md.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import pytorch_accelerated
from scripts import house_figures
from tests.helpers import REPO_ROOT

PACKAGE = Path(pytorch_accelerated.__file__).parent
REPOSITORY = REPO_ROOT
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES = 600
#: trainer.py holds the loop and reads in one sitting.
MAX_FUNCTION_LINES = 40
#: The Trainer's methods with an underscore that the docs name as extension points users override.
DOCUMENTED_EXTENSION_POINTS = {
    "_create_accelerator",
    "_prepare_model_optimizer_and_dataloaders",
    "_create_run_config",
    "_run_training",
    "_run_train_epoch",
    "_run_eval_epoch",
    "_clip_gradients",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the end of the body, not counting the docstring."""
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        docstring = body[0]
        length = (node.end_lineno or 0) - node.lineno + 1
        return length - ((docstring.end_lineno or 0) - docstring.lineno + 1)
    return (node.end_lineno or 0) - node.lineno + 1


@pytest.mark.parametrize(
    "path", [path for path in MODULES if path != PACKAGE / "trainer.py"], ids=module_name
)
def test_every_module_but_the_trainers_is_at_most_600_lines(path: Path) -> None:
    # trainer.py holds every member of the Trainer, so that the class reads as the library's table
    # of contents (docs/architecture.md): its length follows from that.
    assert len(path.read_text().splitlines()) <= MAX_MODULE_LINES


def test_every_function_is_at_most_40_lines_besides_its_docstring() -> None:
    too_long = [
        f"{module_name(path)}.{node.name} ({function_length(node)} lines)"
        for path in MODULES
        for node in ast.walk(parse(path))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and function_length(node) > MAX_FUNCTION_LINES
    ]
    assert too_long == []


def test_no_two_modules_of_the_package_share_a_file_name() -> None:
    names = Counter(path.name for path in MODULES if path.name != "__init__.py")
    assert [name for name, count in names.items() if count > 1] == []


def _imported_modules(path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1] if node.level else []
    target = ".".join([*base, *([node.module] if node.module else [])])
    return [target, *(f"{target}.{alias.name}" for alias in node.names)]


def test_only_the_package_entry_point_imports_the_trainer_at_run_time() -> None:
    importers = [
        module_name(path)
        for path in MODULES
        for node in house_figures.import_statements(parse(path), run_time=True)
        if "pytorch_accelerated.trainer" in _imported_modules(path, node)
    ]
    assert importers == ["pytorch_accelerated"]


def test_lower_layers_do_not_import_upper_ones() -> None:
    # trainer -> callbacks -> checkpoints / schedulers / data -> small helpers
    forbidden = {
        "pytorch_accelerated.checkpoints": (
            "pytorch_accelerated.callbacks",
            "pytorch_accelerated.schedulers",
        ),
        "pytorch_accelerated.schedulers": (
            "pytorch_accelerated.callbacks",
            "pytorch_accelerated.checkpoints",
        ),
        "pytorch_accelerated.data": ("pytorch_accelerated.callbacks", "pytorch_accelerated.checkpoints"),
        "pytorch_accelerated._internal": (
            "pytorch_accelerated.callbacks",
            "pytorch_accelerated.checkpoints",
            "pytorch_accelerated.schedulers",
            "pytorch_accelerated.data",
            "pytorch_accelerated.run_config",
            "pytorch_accelerated.tracking",
            "pytorch_accelerated.placeholders",
        ),
    }
    crossings = []
    for path in MODULES:
        name = module_name(path)
        for lower, upper in forbidden.items():
            if not name.startswith(lower):
                continue
            for node in house_figures.import_statements(parse(path), run_time=True):
                crossings += [
                    f"{name} imports {target}"
                    for target in _imported_modules(path, node)
                    if target.startswith(upper)
                ]
    assert crossings == []


def test_no_module_reaches_into_private_names_of_the_trainer_or_other_modules() -> None:
    reaching = []
    for path in MODULES:
        tree = parse(path)
        for node in ast.walk(tree):
            # trainer._anything, outside the Trainer's own module, but the extension points that
            # the docs name (public API despite the underscore)
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "trainer"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in DOCUMENTED_EXTENSION_POINTS
            ):
                reaching.append(f"{module_name(path)}:{node.lineno} trainer.{node.attr}")
            # from .module import _private
            if isinstance(node, ast.ImportFrom) and node.level:
                reaching += [
                    f"{module_name(path)}:{node.lineno} imports {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    assert reaching == []


UNIT_IMPORTS = house_figures.unit_imports(PACKAGE)


def test_the_package_docstring_lists_the_modules_so_that_each_imports_only_those_below_it() -> None:
    # At run time; "callbacks/" stands for the subpackage.
    listed = re.findall(r"^    (\w+)/?  ", pytorch_accelerated.__doc__ or "", flags=re.M)
    assert sorted(listed) == sorted(name for name in UNIT_IMPORTS if name != "(package)")
    upward = [
        f"{name} imports {target}"
        for name in listed
        for target in sorted(UNIT_IMPORTS[name])
        if listed.index(target) < listed.index(name)
    ]
    assert upward == []


def test_the_architecture_page_says_what_each_module_imports_at_run_time() -> None:
    page = (REPOSITORY / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `(\w+)/?` \|[^|]+\|([^|]*)\|$", page, flags=re.M)
    table = {name: set(re.findall(r"`(\w+)`", imports)) for name, imports in rows}
    assert table == {name: targets for name, targets in UNIT_IMPORTS.items() if name != "(package)"}


def test_the_package_docstring_maps_every_module_and_subpackage() -> None:
    docstring = pytorch_accelerated.__doc__ or ""
    top_level = {path.stem for path in PACKAGE.glob("*.py") if path.name != "__init__.py"}
    subpackages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    missing = sorted(
        name for name in top_level | subpackages if not re.search(rf"\b{re.escape(name)}\b", docstring)
    )
    assert missing == []


#: Subpackages whose docstring does not list all its modules yet: checkpoints/ is being
#: reorganised, and its docstring will list every module when that lands. Strict, so that the
#: test says when the entry can go.
@pytest.mark.parametrize("init", sorted(PACKAGE.glob("*/__init__.py")), ids=lambda init: init.parent.name)
def test_every_subpackage_docstring_names_each_of_its_modules(init: Path) -> None:
    docstring = ast.get_docstring(parse(init)) or ""
    modules = {path.stem for path in init.parent.glob("*.py") if path.name != "__init__.py"}
    missing = sorted(name for name in modules if not re.search(rf"\b{re.escape(name)}\b", docstring))
    assert missing == []


def test_every_folder_of_the_package_is_a_regular_package_so_wheels_include_it() -> None:
    folders = {path.parent for path in MODULES}
    assert (
        sorted(
            str(folder.relative_to(PACKAGE)) for folder in folders if not (folder / "__init__.py").exists()
        )
        == []
    )


# ---------------------------------------------------------------------------- the typing graph

# The graph, its circles and the modules that name the Trainer by design (the callbacks, which each
# event hands the Trainer; the entry point) are computed by the script that prints the house's
# figures, so the test and the figures cannot disagree.
IMPORT_GRAPH = house_figures.import_graph(PACKAGE)


def test_only_the_callbacks_and_the_entry_point_name_the_trainer_even_for_typing() -> None:
    naming = sorted(module for module, targets in IMPORT_GRAPH.items() if house_figures.TRAINER in targets)
    assert [module for module in naming if not house_figures.names_the_trainer_by_design(module)] == []


def test_the_import_graph_with_typing_imports_has_no_circle_besides_the_trainers_observers() -> None:
    # The modules that name the Trainer by design point back at it; without those edges back,
    # every import, for typing too, goes one way.
    assert house_figures.circles(house_figures.without_edges_back_to_the_trainer(IMPORT_GRAPH)) == []


def test_the_house_test_finds_a_circle_where_there_is_one() -> None:
    assert house_figures.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert house_figures.circles(IMPORT_GRAPH)  # the callbacks and the trainer, with the edges back


# ---------------------------------------------------------------------------- composition


def test_the_trainer_has_no_base_class_and_holds_its_parts() -> None:
    from pytorch_accelerated.checkpoints.store import TrainingStateStore
    from pytorch_accelerated.loaders import TrainerLoaders
    from pytorch_accelerated.trainer import Trainer

    assert Trainer.__bases__ == (object,)
    source = (PACKAGE / "trainer.py").read_text()
    assert "self.loaders = TrainerLoaders(" in source and "self.state_store = TrainingStateStore(" in source
    assert TrainerLoaders.__bases__ == TrainingStateStore.__bases__ == (object,)


def test_no_module_keeps_state_keyed_by_trainer_or_run_in_module_globals() -> None:
    # Module-level containers that code mutates (weak dictionaries, sets, lists, dicts) are state
    # shared across every Trainer; the parts hold their own. The one exception is process-wide:
    # the rendezvous store server of a hand-set launch, which must outlive the check.
    mutable = ("WeakKeyDictionary", "WeakSet", "WeakValueDictionary", "set", "list", "dict")
    found = []
    for path in MODULES:
        for node in parse(path).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if value is None:
                continue
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            empty_literal = isinstance(value, (ast.List, ast.Set, ast.Dict)) and not (
                getattr(value, "elts", None) or getattr(value, "keys", None)
            )
            call = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in mutable
            if empty_literal or call:
                found.append(f"{module_name(path)}.{ast.unparse(target)}")
    assert found == ["pytorch_accelerated._internal.launch_checks._servers"]


#: The design documents the project was built from live outside the repository: a file that
#: names them points its reader at text they cannot read. Their decisions are stated in docs/
#: (differences.md, migration.md) and in docstrings. ``COMPAT OK`` is the success line of the
#: scripts of tests/compat/, not a citation.
OUTSIDE_DOCUMENTS = re.compile(rb"\bSPEC\b|\bCOMPAT\b(?!\s+OK\b)")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPOSITORY, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"{REPOSITORY} is not a git checkout: its tracked files are unknown")
    paths = [REPOSITORY / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in paths if path.is_file() and b"\0" not in path.read_bytes()[:8192]]


def test_no_tracked_file_cites_a_design_document_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    citing = [
        f"{path.relative_to(REPOSITORY)}:{number}: {line.strip().decode(errors='replace')}"
        for path in tracked_text_files()
        if path.resolve() != this_file  # it names them to look for them
        for number, line in enumerate(path.read_bytes().splitlines(), start=1)
        if OUTSIDE_DOCUMENTS.search(line)
    ]
    assert citing == []


def test_every_n_is_computed_by_the_one_helper() -> None:
    """``x % self.<...>every_n<...>`` is written only in ``intervals.every`` and in
    ``StepMetrics.is_due``, which inlines it on the per-update path (tests/unit/test_intervals.py
    keeps the two the same)."""
    allowed = {"pytorch_accelerated.step_metrics"}
    written = []
    for path in MODULES:
        if module_name(path) in allowed:
            continue
        for node in ast.walk(parse(path)):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Mod)
                and "every_n" in ast.unparse(node.right)
            ):
                written.append(f"{module_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert written == []


# ---------------------------------------------------------------------------- one class, one story

SOURCES = {module_name(path): path.read_text() for path in MODULES}


def test_every_member_of_the_trainer_is_written_in_its_class_with_a_docstring() -> None:
    """No member is assigned from a name of another module (``evaluate = runs.evaluate``): the class
    reads as the table of contents of the library, and the API page documents it as it is."""
    import inspect

    from pytorch_accelerated.trainer import Trainer

    assert house_figures.bound_members(SOURCES["pytorch_accelerated.trainer"]) == []
    public = {
        name: value
        for name, value in vars(Trainer).items()
        if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))
    }
    assert {"evaluate", "predict", "save_checkpoint", "load_training_state", "running_loss"} <= set(public)
    assert [name for name, value in public.items() if not inspect.getdoc(value)] == []
    functions = [value for value in public.values() if inspect.isfunction(value)]
    assert {function.__module__ for function in functions} == {"pytorch_accelerated.trainer"}


def test_at_most_two_functions_outside_the_callbacks_take_the_whole_trainer() -> None:
    # The Trainer's parts take what they need (the accelerator, the model, the loaders, the run
    # config, the progress) or a small Protocol; the callbacks are handed the Trainer by each event.
    assert len(house_figures.functions_taking_the_trainer(SOURCES)) <= 2


def test_the_run_time_import_graph_has_no_circle() -> None:
    assert house_figures.circles(house_figures.import_graph(PACKAGE, run_time=True)) == []


def test_the_house_figures_count_what_they_say() -> None:
    bound = "class Trainer:\n    evaluate = runs.evaluate\n    def train(self) -> None: ...\n"
    assert house_figures.bound_members(bound) == ["evaluate = runs.evaluate"]
    taking = (
        "def f(trainer: Trainer) -> None: ...\nclass Trainer:\n    def g(self, other: Trainer) -> None: ...\n"
    )
    assert house_figures.functions_taking_the_trainer({"m": taking}) == ["m:1 f"]
    lookups = 'arguments["seed"]; other["seed"]; arguments[name]'
    assert house_figures.string_keyed_lookups({"m": lookups}) == ["m:1 arguments['seed']"]
    derived = 'kwargs.get("batch_size") or size; kwargs.get("shuffle") or False'
    assert house_figures.batch_size_derivations({"m": derived}) == ["m:1 kwargs.get('batch_size') or size"]
