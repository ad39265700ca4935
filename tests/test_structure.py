"""The package's shape: its floors (import-linter), no import circles inside ``verbatim_batch`` and no module over
700 lines (no Ray, fast).

The circle checker reads every ``import`` / ``from ... import`` of a ``verbatim_batch`` module with ``ast``,
wherever it stands (module level, inside a function, under ``if TYPE_CHECKING``): an import moved into a function
to dodge a circle is still a circle. Relative imports are resolved; ``from pkg import name`` imports the submodule
``pkg.name`` when there is one, else the module that defines ``name``: a name a package's ``__init__`` re-exports
from one of its submodules (``from .sub import name``) leads to that submodule, any other name to the ``__init__``.
Importing ``pkg.sub`` is counted as importing ``pkg.sub`` only, not ``pkg``'s ``__init__`` that Python runs first:
a package's ``__init__`` importing its submodules, and a submodule importing a sibling, is normal. What fails is
module A needing module B needing module A, through any chain.
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest
import tomllib

PACKAGE = "verbatim_batch"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
MAX_LINES = 700


def module_files(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under ``root`` (a package's ``__init__.py`` is the package)."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def _reexports(package: str, modules: dict[str, Path]) -> dict[str, str]:
    """The names a package's ``__init__`` imports from one of its own submodules: name -> that submodule."""
    found = {}
    tree = ast.parse(modules[package].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            source = _resolve_from(package, True, node)
            if source in modules and source.startswith(package + "."):
                for alias in node.names:
                    found[alias.asname or alias.name] = source
    return found


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module named by a ``from X import ...`` in ``module``."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """Module -> {imported package module: line of the first such import}, over all imports anywhere in the file."""
    modules = module_files(root, package)
    reexports: dict[str, dict[str, str]] = {}
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}

        def add(target: str, line: int, module: str = module, edges: dict[str, int] = edges) -> None:
            while target and target not in modules:  # an attribute path or a missing name: its nearest module
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == package or alias.name.startswith(package + "."):
                        add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                source = _resolve_from(module, _is_package(module, modules), node)
                if not (source == package or source.startswith(package + ".")):
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        add(f"{source}.{alias.name}", node.lineno)
                    elif _is_package(source, modules):
                        if source not in reexports:
                            reexports[source] = _reexports(source, modules)
                        add(reexports[source].get(alias.name, source), node.lineno)
                    else:
                        add(source, node.lineno)
        graph[module] = edges
    return graph


def import_circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One circle (a list of modules, the first repeated at the end) per strongly connected group of modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan; the package is a few dozen modules, recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)

    circles = []
    for group in sorted(groups):
        members, start = set(group), group[0]
        # the shortest way back to the start within the group (breadth first), so the message names a real circle
        paths = {start: [start]}
        queue = [start]
        circle = None
        while queue and circle is None:
            node = queue.pop(0)
            for nxt in sorted(graph[node]):
                if nxt == start:
                    circle = paths[node] + [start]
                    break
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
        circles.append(circle)
    return circles


def describe(circle: list[str], graph: dict[str, dict[str, int]]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(circle, circle[1:], strict=False)]
    return " -> ".join(steps + [circle[-1]])


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    lengths = ((path, len(path.read_text(encoding="utf-8").splitlines())) for path in sorted(root.rglob("*.py")))
    return [(str(path.relative_to(root.parent)), n) for path, n in lengths if n > limit]


def test_no_import_circles():
    graph = import_graph()
    circles = import_circles(graph)
    assert not circles, "import circles in verbatim_batch (module (line of the import) -> imported module):\n" + \
        "\n".join("  " + describe(c, graph) for c in circles)


def test_no_module_over_700_lines():
    long = long_modules()
    assert not long, f"modules over {MAX_LINES} lines:\n" + "\n".join(f"  {p}: {n} lines" for p, n in long)


def test_the_checker_sees_circles_and_resolves_imports(tmp_path):
    """The checker itself: a circle through a function-level import and a relative import is found; a package's
    ``__init__`` re-exporting a submodule that imports a sibling is not a circle; a re-exported name leads to
    the submodule that defines it."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    from pkg.c import g\n",
        "c.py": "import pkg.a\n",
        "sub/__init__.py": "from .x import X\nfrom .y import Y\n",
        "sub/x.py": "from .y import Y\n",
        "sub/y.py": "Y = 1\n",
        "d.py": "from pkg.sub import X\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.d"] == {"pkg.sub.x": 1}
    assert graph["pkg.sub"] == {"pkg.sub.x": 1, "pkg.sub.y": 2}
    circles = import_circles(graph)
    assert circles == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert describe(circles[0], graph) == "pkg.a (line 1) -> pkg.b (line 2) -> pkg.c (line 1) -> pkg.a"
    (pkg / "big.py").write_text("x = 1\n" * 701)
    assert long_modules(pkg, 700) == [("pkg/big.py", 701)]


# The floors (pyproject.toml's [tool.importlinter] contracts, which import-linter checks over every import,
# function-level ones included): a module imports its own floor and the floors below it only.
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def floors() -> list[set[str]]:
    """The layers contract's floors, highest first, each a set of top-level names (``cli | api`` is two)."""
    config = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["id"] == "floors")["layers"]
    return [{name.strip().removeprefix(PACKAGE + ".") for name in layer.split("|")} for layer in layers]


def _lint(root: Path, config: Path, monkeypatch) -> int:
    """import-linter's exit code for the package under ``root`` (its own import, not the installed one)."""
    from importlinter.cli import lint_imports

    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.chdir(root)
    return lint_imports(config_filename=str(config), no_cache=True, no_logo=True)


def test_the_floors_hold(monkeypatch):
    """Every import in the package goes down the floors (or stays on its own), and nothing below the engine
    imports Ray: import-linter's layers and forbidden contracts, as declared in pyproject.toml."""
    assert _lint(ROOT.parent, PYPROJECT, monkeypatch) == 0


def test_every_top_level_name_is_a_floor():
    """The package's top level holds the floors and nothing else: a module or package added beside them (not
    in the contract) would escape it."""
    top = {p.stem for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__"}
    named = set().union(*floors())
    assert top == named, f"not a floor: {sorted(top - named)}; a floor with no package: {sorted(named - top)}"
    assert len(floors()) >= 8


@pytest.mark.parametrize("floor, climb", [
    ("core/tables.py", "def _f():\n    from verbatim_batch.stages import chains\n"),  # inside a function
    ("retrieval/retriever.py", "from verbatim_batch.extract import spans\n"),
    ("quality/metrics.py", "import ray\n"),
])
def test_a_climbing_import_breaks_the_floors(tmp_path, monkeypatch, floor, climb):
    """The contracts fail when a lower floor imports a higher one (even inside a function) or Ray."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("examples", "__pycache__"))
    path = copy / floor
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + climb, encoding="utf-8")
    assert _lint(tmp_path, PYPROJECT, monkeypatch) == 1
