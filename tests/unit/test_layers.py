"""specray's layers (docs/ARCHITECTURE.md): folders import one way, and no module cycle inside `specray`.

The unit of a layer is a folder (a package such as `specray.specdec`) or a top-level module (such as
`specray.keys`): a folder stands in one layer with all its modules, so no module is placed below its own
folder to let two folders import each other. A unit imports its own layer and the ones below it, and no
two units import each other, directly or round a loop, even within one layer.

The import graph is read from the source with `ast`, so an import inside a function counts as much as one at
the top of a file: a cycle "broken" by a late import is still a cycle. Every import counts, those under
`if TYPE_CHECKING:` too: a reader and the type checker follow them, and a type named in an annotation belongs
to a layer like anything else. Importing `a.b.c` also runs the `__init__` of `a` and `a.b`: those edges
count for module cycles, and for folders as an import of the folder itself.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

Layers = tuple[tuple[str, tuple[str, ...]], ...]

# lowest first; a unit may import its own layer and the ones before it. The same table, with the why, is in
# docs/ARCHITECTURE.md.
LAYERS: Layers = (
    ("ops", ("specray.ops",)),
    (
        "foundation",
        (
            "specray.errors",
            "specray.files",
            "specray.locks",
            "specray.seeds",
            "specray.names",
            "specray.metrics",
            "specray.bootstrap",
            "specray.devices",
            "specray.faults",
            "specray.progress",
        ),
    ),
    ("spec", ("specray.config", "specray.named_files")),
    ("data, models", ("specray.data", "specray.models", "specray.quality")),
    (
        "keys, draft, sampling, cluster",
        ("specray.keys", "specray.draft", "specray.sampling", "specray.cluster"),
    ),
    ("teacher, specdec", ("specray.teacher", "specray.specdec")),
    ("distill", ("specray.distill",)),
    ("report", ("specray.report",)),
    ("tracking", ("specray.tracking",)),
    ("sweep", ("specray.sweep", "specray.garden")),
    ("serving", ("specray.serving",)),
    ("cli", ("specray.cli",)),
)

# Folder-level back-edges that are known and being removed, each (importer, imported) with where and why.
# Nothing may be added here: move the shared piece down instead. The test fails on an entry that no longer
# happens, so the list only shrinks.
PENDING_BACK_EDGES: frozenset[tuple[str, str]] = frozenset()


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


def unit_of(module: str) -> str:
    """The folder or top-level module a module belongs to: `specray.specdec.cells` -> `specray.specdec`."""
    return ".".join(module.split(".")[:2])


def layer_of(unit: str, layers: Layers = LAYERS) -> int:
    """The index in `layers` of the layer listing `unit`; KeyError when none does."""
    for i, (_, units) in enumerate(layers):
        if unit in units:
            return i
    raise KeyError(unit)


def unit_edges(edges: Sequence[Edge]) -> list[tuple[Edge, Edge]]:
    """(module import, the same import between units) for the imports between two different units. A
    parent package's __init__ run by an import is in the imported module's unit already, and the root
    package `specray` (its version only) is no unit."""
    return [
        (e, Edge(unit_of(e.source), unit_of(e.target), e.line, e.runs))
        for e in edges
        if not e.implicit and unit_of(e.source) != unit_of(e.target) != "specray"
    ]


def back_edges(edges: Sequence[Edge], layers: Layers = LAYERS) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) units against the layer order, each with the imports that make it: the imported
    unit is in a higher layer, or both are in one layer and import each other (directly or round a loop).
    A loop through several layers has an edge up, which is the one named."""
    pairs = unit_edges(edges)
    level = {unit: layer_of(unit, layers) for _, u in pairs for unit in (u.source, u.target)}
    looped = cycles([u for _, u in pairs if level[u.source] == level[u.target]])
    found: dict[tuple[str, str], list[str]] = {}
    for module, unit in pairs:
        higher = level[unit.target] > level[unit.source]
        if higher or any(unit.source in c and unit.target in c for c in looped):
            why = "a higher layer" if higher else "a unit that imports it back"
            line = f"{module.source}:{module.line} imports {module.target} ({why})"
            found.setdefault((unit.source, unit.target), []).append(line)
    return found


@pytest.fixture(scope="module")
def graph() -> list[Edge]:
    return import_graph(REPO)


def test_no_import_cycle_inside_specray(graph: list[Edge]) -> None:
    found = cycles(graph)
    edges = [e for e in graph if any(e.source in c and e.target in c for c in found)]
    assert not found, "import cycles (move the shared piece down a layer):\n" + "\n".join(
        f"{e.source}:{e.line} -> {e.target}" for e in edges
    )


def test_the_layers_list_folders_and_top_level_modules_only() -> None:
    """No module is placed below its own folder: the table holds `specray.<name>` units that exist, once."""
    units = [unit for _, listed in LAYERS for unit in listed]
    known = {unit_of(m) for m in modules(REPO) if m != "specray"}
    assert sorted(units) == sorted(set(units)), "a unit is listed twice"
    assert all(unit.count(".") == 1 for unit in units), [u for u in units if u.count(".") != 1]
    assert set(units) <= known, f"listed but not in specray/: {sorted(set(units) - known)}"


def test_every_folder_has_a_layer() -> None:
    listed = {unit for _, units in LAYERS for unit in units}
    missing = sorted({unit_of(m) for m in modules(REPO) if m != "specray"} - listed)
    assert not missing, f"add these to LAYERS here and in docs/ARCHITECTURE.md: {missing}"


def test_no_folder_imports_a_higher_layer_or_imports_back(graph: list[Edge]) -> None:
    found = back_edges(graph)
    new = {edge: why for edge, why in found.items() if edge not in PENDING_BACK_EDGES}
    assert not new, "folder-level imports against the layer order (docs/ARCHITECTURE.md):\n" + "\n".join(
        line for lines in new.values() for line in lines
    )
    gone = sorted(PENDING_BACK_EDGES - set(found))
    assert not gone, f"no longer back-edges: remove them from PENDING_BACK_EDGES: {gone}"


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


def test_the_folder_check_fails_on_a_planted_back_edge(tmp_path: Path) -> None:
    """A planted package with no module cycle: `low.a` imports `high.b` (a higher layer), and `left.c`
    imports `right.d` while `right.e` imports `left.f` (one layer, both ways, only under TYPE_CHECKING)."""
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def late():\n    from specray.high.b import thing\n",
        "high/__init__.py": "",
        "high/b.py": "thing = 1\n",
        "left/__init__.py": "",
        "left/c.py": "import specray.right.d\n",
        "left/f.py": "F = 1\n",
        "right/__init__.py": "",
        "right/d.py": "D = 1\n",
        "right/e.py": "import typing\nif typing.TYPE_CHECKING:\n    from specray.left.f import F\n",
    }
    for name, text in files.items():
        (tmp_path / "specray" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "specray" / name).write_text(text)
    layers: Layers = (
        ("low", ("specray.low",)),
        ("middle", ("specray.left", "specray.right")),
        ("high", ("specray.high",)),
    )
    edges = import_graph(tmp_path)
    assert cycles(edges) == []  # what the module-level check sees: nothing
    found = back_edges(edges, layers)
    assert set(found) == {
        ("specray.low", "specray.high"),
        ("specray.left", "specray.right"),
        ("specray.right", "specray.left"),
    }
    assert found["specray.low", "specray.high"] == ["specray.low.a:2 imports specray.high.b (a higher layer)"]
    assert back_edges(edges, (layers[2], layers[0], layers[1])).keys() == {  # high lowest: low may import it
        ("specray.left", "specray.right"),
        ("specray.right", "specray.left"),
    }


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
