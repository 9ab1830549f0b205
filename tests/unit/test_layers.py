"""specray's layers (docs/ARCHITECTURE.md): no import cycle inside `specray`, and no import of a higher layer.

The import graph is read from the source with `ast`, so an import inside a function counts as much as one at
the top of a file: a cycle "broken" by a late import is still a cycle. Cycles count every import, those
under `if TYPE_CHECKING:` too (a reader and the type checker follow them); the layer order counts the
imports that run (a type named only in an annotation loads nothing). Importing `a.b.c` also runs the
`__init__` of `a` and `a.b`: those edges count for cycles, not for layers (a package's layer is its
modules').
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

# lowest first; a module may import its own layer and the ones before it. The same table, with the why,
# is in docs/ARCHITECTURE.md. A module's layer is that of its longest listed prefix.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ops", ("specray.ops",)),
    (
        "foundation",
        (
            "specray.errors",
            "specray.files",
            "specray.locks",
            "specray.seeds",
            "specray.names",
            "specray.devices",
            "specray.faults",
            "specray.progress",
            "specray.tracking.names",
        ),
    ),
    (
        "spec, data, models",
        (
            "specray.config",
            "specray.draft",
            "specray.data",
            "specray.keys",
            "specray.models",
            "specray.quality",
        ),
    ),
    ("sampling, cluster", ("specray.sampling", "specray.cluster")),
    (
        "teacher, specdec",
        ("specray.teacher", "specray.specdec", "specray.garden.plan"),
    ),
    ("distill", ("specray.distill",)),
    ("report", ("specray.report",)),
    ("tracking", ("specray.tracking",)),
    ("sweep", ("specray.sweep", "specray.garden")),
    ("serving", ("specray.serving",)),
    ("cli", ("specray.cli",)),
)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    runs: bool  # False: only under `if TYPE_CHECKING:`
    implicit: bool = False  # a parent package's __init__, run by importing one of its modules


def modules(root: Path) -> dict[str, Path]:
    """Every module under root/specray by dotted name (a package by its own name, for its __init__)."""
    found = {}
    for path in sorted((root / "specray").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def import_graph(root: Path) -> list[Edge]:
    """Every import from one specray module of another, at any depth in the file."""
    known = modules(root)
    edges = []
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {id(n) for block in _type_checking_blocks(tree) for n in ast.walk(block)}
        for node in ast.walk(tree):
            for target in _targets(node, package, known):
                runs = id(node) not in typing_only
                edges.append(Edge(name, target, node.lineno, runs))
                edges += [Edge(name, p, node.lineno, runs, True) for p in _parents(target, name)]
    return [e for e in edges if e.target != e.source]


def _type_checking_blocks(tree: ast.AST) -> list[ast.If]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)  # `typing.TYPE_CHECKING` too
    ]


def _targets(node: ast.AST, package: str, known: dict[str, Path]) -> list[str]:
    """The specray modules an import statement loads (`from x import y` loads x.y when y is a module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: from the package, up level - 1 packages
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
        return []
    return [_known_prefix(n, known) for n in names if n.split(".")[0] == "specray"]


def _known_prefix(name: str, known: dict[str, Path]) -> str:
    while name not in known:  # `import specray.x.Y` where Y is not a module: x
        name = name.rpartition(".")[0]
    return name


def _parents(target: str, source: str) -> list[str]:
    """The packages importing `target` runs first, less those `source` is already inside."""
    parts = target.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [p for p in parents if not (source + ".").startswith(p + ".")]


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int:
    """The index in LAYERS of the module's longest listed prefix; KeyError when none is listed."""
    if module == "specray":  # the root package: its version only
        return 0
    matches = [
        (len(prefix), i)
        for i, (_, prefixes) in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise KeyError(module)
    return max(matches)[1]


def upward(edges: list[Edge]) -> list[str]:
    """Imports that run, of a module in a higher layer than the importer's."""
    return sorted(
        f"{e.source}:{e.line} ({_layer_name(e.source)}) imports {e.target} ({_layer_name(e.target)})"
        for e in edges
        if e.runs
        and not e.implicit
        and _listed(e.source)
        and _listed(e.target)
        and layer_of(e.target) > layer_of(e.source)
    )


def _layer_name(module: str) -> str:
    return LAYERS[layer_of(module)][0]


@pytest.fixture(scope="module")
def graph() -> list[Edge]:
    return import_graph(REPO)


def test_no_import_cycle_inside_specray(graph: list[Edge]) -> None:
    found = cycles(graph)
    edges = [e for e in graph if any(e.source in c and e.target in c for c in found)]
    assert not found, "import cycles (move the shared piece down a layer):\n" + "\n".join(
        f"{e.source}:{e.line} -> {e.target}" for e in edges
    )


def test_every_module_has_a_layer() -> None:
    missing = [m for m in modules(REPO) if m != "specray" and not _listed(m)]
    assert not missing, f"add these to LAYERS here and in docs/ARCHITECTURE.md: {missing}"


def _listed(module: str) -> bool:
    try:
        layer_of(module)
    except KeyError:
        return False
    return True


def test_no_module_imports_a_higher_layer(graph: list[Edge]) -> None:
    found = upward(graph)
    assert not found, "imports against the layer order (docs/ARCHITECTURE.md):\n" + "\n".join(found)


def test_no_module_imports_another_modules_private_name() -> None:
    """A helper two modules share is public where it lives (a private name is free to change)."""
    found = []
    for name, path in modules(REPO).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specray"):
                private = [
                    a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                ]
                found += [f"{name}:{node.lineno} imports {node.module}.{p}" for p in private]
    assert not found, "\n".join(found)


def test_the_checks_see_cycles_hidden_in_functions_and_relative_imports(tmp_path: Path) -> None:
    """A planted package: a imports b at the top, b imports a inside a function (relative); c imports d
    under TYPE_CHECKING only, d imports c; e imports nothing back."""
    files = {
        "__init__.py": "",
        "a.py": "from specray import b\n",
        "b.py": "def late():\n    from . import a\n    from .e import thing\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specray.d import D\n",
        "d.py": "import specray.c\n",
        "e.py": "thing = 1\n",
    }
    for name, text in files.items():
        (tmp_path / "specray").mkdir(exist_ok=True)
        (tmp_path / "specray" / name).write_text(text)
    edges = import_graph(tmp_path)
    assert cycles(edges) == [["specray.a", "specray.b"], ["specray.c", "specray.d"]]
    assert [e.runs for e in edges if e.source == "specray.c"] == [False]
