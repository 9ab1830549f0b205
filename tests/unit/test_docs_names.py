"""The docs and specray's docstrings name only code that exists.

README.md, docs/*.md and every docstring in specray/ cite code in backticks: `module.name`
(`ray_train.distill_drafts`, `specray.names.TUNE_REPORT`, `sweep.stages.train_runs`), `Class.member`
(`Stages.distill`, `SweepPlan.evaluated`), "`specray/draft.py`'s `plan_draft`", and, in the docs' code
blocks, `from specray.x import y`. Each such name must resolve: the module exists (a cited module may be
named by the tail of its path, as the docs do: `ray_train`, `distill.ray_train`), and the attribute is
defined in it (a class's members: its methods, fields, class attributes and the `self.x` its methods set,
its specray bases' too, and what an outside base such as pydantic's `BaseModel` has).

What is not specray's is left alone, so prose stays free: a dotted name whose head is no specray module
nor class (`ray.train.report`, `torch.distributed.all_reduce`), a string specray writes (the MLflow tag
`specray.best`), a sweep setting (`eval.gamma`,
`distill.steps`: test_docs_figures.py checks those), a file name (`curves.json`), a class imported from
another package (`Console.is_terminal`). A lower-case head that is a one-word module name may also be a
variable, a record or another package's module (`plan.folder`, `metrics.by_category`, ray's
`tune.with_parameters`): it passes when the attribute is a member of some specray class or a string
specray writes, or when specray imports that name from another package. A figure of a results file
(`models.draft_parameters`) is a results file's name. A CamelCase head must be a class of specray, one it
imports, or one of OUTSIDE_CLASSES: a class that is gone (`DraftPlan.info`) fails.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.unit.test_docs_figures import FILE_SUFFIXES, RESULTS, code_and_prose, setting_exists

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")  # `a.b.c`, `a.b(...)`
FILE_CITE = re.compile(r"`((?:specray/)?[\w/]+)\.py`(?::|'s) `([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)`")
FROM_IMPORT = re.compile(r"^\s*from (specray(?:\.\w+)*) import \(?([\w, ]+)\)?")
CAMEL = re.compile(r"^_?[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
MORE_SUFFIXES = {"safetensors", "parquet", "csv", "png", "jsonl", "gguf", "html", "db", "log", "lock", "cfg"}
BASES_WITHOUT_MEMBERS = {"object", "Protocol", "Generic", "ABC", "Any"}
# classes of other packages that specray names without importing them (a CamelCase head must be specray's,
# one it imports, or one of these)
OUTSIDE_CLASSES = {"AssistedCandidateGenerator"}  # transformers' assistant, checked by name in hf_compare.py


def _paths(tree: object, prefix: str = "") -> set[str]:
    if not isinstance(tree, dict):
        return {prefix}
    return {p for key, value in tree.items() for p in _paths(value, f"{prefix}.{key}" if prefix else key)}


# the figures results files hold (`models.draft_parameters`): docs name them as a results file does
FIGURES = {path for results in RESULTS.values() for path in _paths(results["figures"])}


@dataclass
class Index:
    """specray read with `ast`: its modules, each module's top-level names, and every class's members."""

    modules: dict[str, Path] = field(default_factory=dict)
    top: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    classes: dict[str, list[tuple[str, ast.ClassDef]]] = field(default_factory=lambda: defaultdict(list))
    # per module, what it imports from other packages: name -> `package.name`
    imported: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))
    all_members: set[str] = field(default_factory=set)
    strings: set[str] = field(default_factory=set)  # every string constant: tags and keys (`specray.best`)

    def members(self, name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        """Every member of the specray classes called `name`, their specray bases' included; None when one
        of them has an outside base whose members are not known here (then anything is taken)."""
        found: set[str] = set()
        for module, node in self.classes.get(name, []):
            found |= _own_members(node)
            for base in node.bases:
                base_name = ast.unparse(base).split("[")[0].split(".")[-1]
                if base_name in BASES_WITHOUT_MEMBERS or base_name in seen:
                    continue
                if base_name in self.classes:
                    inherited = self.members(base_name, seen | {name})
                    if inherited is None:
                        return None
                    found |= inherited
                else:
                    outside = _outside_members(self.imported[module].get(base_name))
                    if outside is None:
                        return None
                    found |= outside
        return found

    def module_names(self, dotted: str) -> list[str]:
        """The modules `dotted` may name: itself, or any whose path ends with it (`ray_train`)."""
        return [m for m in self.modules if m == dotted or m.endswith(f".{dotted}")]

    def is_external(self, name: str) -> bool:
        return any(name in names for names in self.imported.values())


def _own_members(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names |= {n.id for t in item.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for sub in ast.walk(node):  # what its methods set on self
        target = sub.target if isinstance(sub, ast.AnnAssign) else None
        targets = sub.targets if isinstance(sub, ast.Assign) else [target] if target else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                    names.add(n.attr)
    return names


@cache
def _outside_members(source: str | None) -> set[str] | None:
    """The members of a class imported from another package (`pydantic.BaseModel`), or None if unknown."""
    if source is None:
        return None
    module, _, name = source.rpartition(".")
    try:
        return set(dir(getattr(importlib.import_module(module), name)))
    except Exception:  # noqa: BLE001 (an optional package, a name that is no class: unknown)
        return None


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """A module's statements, into `if` and `try` blocks (`if TYPE_CHECKING:`), not into definitions."""
    found = []
    for node in body:
        found.append(node)
        if isinstance(node, ast.If | ast.Try):
            blocks = [node.body, node.orelse]
            blocks += [h.body for h in node.handlers] + [node.finalbody] if isinstance(node, ast.Try) else []
            found += [n for block in blocks for n in _top_level(block)]
    return found


@cache
def index() -> Index:
    found = Index()
    for path in sorted((REPO / "specray").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        found.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for module, path in found.modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = found.top[module]
        for node in _top_level(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                top.add(node.name)
            elif isinstance(node, ast.Assign):
                top |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                top.add(node.target.id)
            elif isinstance(node, ast.Import):
                top |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                top |= {a.asname or a.name for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.strings.add(node.value)
            if isinstance(node, ast.ClassDef):
                found.classes[node.name].append((module, node))
                found.all_members |= _own_members(node)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                outside = not node.module.startswith("specray")
                for a in node.names if outside else []:
                    found.imported[module][a.asname or a.name] = f"{node.module}.{a.name}"
    return found


# ---------------------------------------------------------------- what a cited name must be


def name_problem(name: str) -> str | None:
    """Why a dotted name cited as code does not resolve in specray, or None (it does, or is not specray's)."""
    parts = name.split(".")
    if parts[-1] in FILE_SUFFIXES or parts[-1] in MORE_SUFFIXES or setting_exists(name):
        return None
    found = index()
    if name in found.strings or name in FIGURES:
        return None  # a name specray writes, not code: the MLflow tag `specray.best`, a results figure
    if CAMEL.match(parts[0]):
        if parts[0] not in found.classes:
            outside = found.is_external(parts[0]) or parts[0] in OUTSIDE_CLASSES
            if outside or any(parts[0] in top for top in found.top.values()):
                return None  # another package's class, or a specray alias or type
            return f"{parts[0]}: no such class in specray"
        members = found.members(parts[0])
        if members is not None and parts[1] not in members:
            return f"{parts[0]} has no {parts[1]}"
        return None
    readings = [(k, m) for k in range(len(parts), 0, -1) for m in found.module_names(".".join(parts[:k]))]
    if not readings:
        return None  # not specray's: `ray.train.report`, `spec.eval.temperatures`
    if any(_attribute_resolves(module, parts[k:]) for k, module in readings):
        return None
    if all(k == 1 for k, _ in readings) and parts[0] != "specray":
        if parts[1] in found.all_members or parts[1] in found.strings:
            return None  # a variable or record named like a module: `plan.folder`, `metrics.by_category`
        if found.is_external(parts[0]):
            return None  # another package's module as imported: `tune.with_parameters` (ray's)
    return f"{'.'.join(parts[: readings[0][0]])} has no {'.'.join(parts[readings[0][0] :])}"


def _attribute_resolves(module: str, rest: list[str]) -> bool:
    if not rest:
        return True
    found = index()
    if rest[0] not in found.top[module]:
        return False
    if len(rest) > 1 and rest[0] in found.classes:
        members = found.members(rest[0])
        return members is None or rest[1] in members
    return True


def cited_names(text: str, code: list[str]) -> list[str]:
    """The dotted names `text` cites as code: whole code spans or lines that are one dotted name (a call's
    arguments aside), "`path.py`'s `name`" and "`path.py`: `name`", and `from specray.x import y`."""
    names = [m.group(1) for line in code if (m := DOTTED.match(line.strip()))]
    for path, name in FILE_CITE.findall(text):
        module = path.replace("/", ".")
        if not setting_exists(name):
            names.append(f"{module if module.startswith('specray') else f'specray.{module}'}.{name}")
    for line in code:
        if m := FROM_IMPORT.match(line):
            imported = [n.split(" as ")[0].strip() for n in m.group(2).split(",")]
            names += [f"{m.group(1)}.{n}" for n in imported if n]
    return names


def docstrings(path: Path) -> list[tuple[int, str]]:
    """Every docstring of a module, with the line it starts on."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text is not None:
                found.append((node.body[0].lineno, text))
    return found


def text_problems(text: str, where: str) -> list[str]:
    code, _ = code_and_prose(text)
    return [
        f"{where}: `{name}`: {problem}"
        for name in dict.fromkeys(cited_names(text, code))
        if (problem := name_problem(name))
    ]


def page_problems(path: Path) -> list[str]:
    return text_problems(path.read_text(), str(path.relative_to(REPO)))


def docstring_problems(path: Path) -> list[str]:
    where = path.relative_to(REPO)
    return [p for line, text in docstrings(path) for p in text_problems(text, f"{where}:{line}")]


# ---------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_name_a_page_cites_exists(path: Path) -> None:
    assert page_problems(path) == []


def test_every_name_a_docstring_cites_exists() -> None:
    assert [p for path in sorted((REPO / "specray").rglob("*.py")) for p in docstring_problems(path)] == []


def test_the_check_reads_names_to_check() -> None:
    """The check is not vacuous: the docs and docstrings cite many names it resolves."""
    cited = [n for p in PAGES for n in cited_names(p.read_text(), code_and_prose(p.read_text())[0])]
    assert len(cited) > 100 and "Stages.distill" in cited


def test_a_stale_name_fails() -> None:
    planted = (
        "The plan's `DraftPlan.info`, `Stages.distil`, `ray_train.distill_draft`, `specray.names.TUNE_DIRS`\n"
        'and `sweep.stages.Stages.distil`; "`specray/draft.py`\'s `plan_drafts`"; fine: `Stages.distill`,\n'
        "`ray.train.report`, `eval.gamma`, `curves.json`, `plan.folder`, `Console.is_terminal`.\n"
        "```python\nfrom specray.models.loading import load_model, load_models\n```\n"
    )
    assert text_problems(planted, "x") == [
        "x: `DraftPlan.info`: DraftPlan: no such class in specray",
        "x: `Stages.distil`: Stages has no distil",
        "x: `ray_train.distill_draft`: ray_train has no distill_draft",
        "x: `specray.names.TUNE_DIRS`: specray.names has no TUNE_DIRS",
        "x: `sweep.stages.Stages.distil`: sweep.stages has no Stages.distil",
        "x: `specray.draft.plan_drafts`: specray.draft has no plan_drafts",
        "x: `specray.models.loading.load_models`: specray.models.loading has no load_models",
    ]
