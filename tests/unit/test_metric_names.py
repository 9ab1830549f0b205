"""Metric names live in one module (`specray/metrics.py`): no other module of `specray/` spells one as a
string, so renaming a metric is one edit and a typo is a NameError, not a column that silently stays empty.

A metric name is any string constant of `specray.metrics` (its upper-case names, and the keys and values of
its maps). The check reads every module's string constants with `ast` (f-string parts too), docstrings
left out (a docstring may name a metric in prose), and `__all__` (a function may share a metric's name).
"""

from __future__ import annotations

import ast
from pathlib import Path

import specray.metrics as metrics
from tests.conftest import REPO

# Modules still spelling metric names, owned by work in progress elsewhere; the list only shrinks (the test
# fails on an entry that no longer holds a metric-name literal).
PENDING: frozenset[str] = frozenset()


def metric_names() -> frozenset[str]:
    return frozenset(n for name, value in vars(metrics).items() if name.isupper() for n in _strings(value))


def _strings(value: object) -> set[str]:
    """The strings of a constant: itself, a collection's items, a map's keys and values (of a map of maps,
    such as estimator -> field -> metric, the inner maps' only)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return {
            s for k, v in value.items() for s in _strings(v) | (set() if isinstance(v, dict) else _strings(k))
        }
    if isinstance(value, frozenset | tuple):
        return {s for item in value for s in _strings(item)}
    return set()


def literals(path: Path, names: frozenset[str], shown: str) -> list[str]:
    """`shown:line: 'name'` for each string constant of the module at `path` that is a metric name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    exported = {  # `__all__` names functions (`ops.speedup_model`), not metrics
        id(item)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets)
        for item in ast.walk(node.value)
    }
    return [
        f"{shown}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in names
        and id(node) not in docstrings | exported
    ]


def spelled(root: Path, names: frozenset[str]) -> dict[str, list[str]]:
    """Per module of root/specray other than specray/metrics.py, the metric names it spells."""
    found = {}
    for path in sorted((root / "specray").rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative != "specray/metrics.py" and (hits := literals(path, names, relative)):
            found[relative] = hits
    return found


def test_metric_names_are_spelled_only_in_the_metrics_module() -> None:
    found = spelled(REPO, metric_names())
    new = {module: hits for module, hits in found.items() if module not in PENDING}
    assert not new, "use the constants of specray/metrics.py:\n" + "\n".join(
        h for hits in new.values() for h in hits
    )
    assert not PENDING - set(found), (
        f"no metric names left: remove from PENDING: {sorted(PENDING - set(found))}"
    )


def test_the_check_sees_a_planted_literal(tmp_path: Path) -> None:
    """A dict key, a subscript and an f-string part are found; a docstring and a longer string are not."""
    (tmp_path / "specray").mkdir()
    (tmp_path / "specray" / "planted.py").write_text(
        '"""Reads `speedup_model`."""\n'
        'ROW = {"speedup_model": 1.0}\n'
        "def f(cells):\n"
        '    """speedup"""\n'
        '    return cells["acceptance_rate"], f"{cells}speedup", "speedup_model_sd"\n'
    )
    found = spelled(tmp_path, metric_names())
    assert found == {
        "specray/planted.py": [
            "specray/planted.py:2: 'speedup_model'",
            "specray/planted.py:5: 'acceptance_rate'",
            "specray/planted.py:5: 'speedup'",
        ]
    }


def test_the_names_are_the_record_fields_they_name() -> None:
    """A record-field constant is a field of the estimator's result record (`typed_result` reads by it)."""
    from dataclasses import fields

    from specray.specdec.results import AnalyticResult, EmpiricalResult

    analytic = {f.name for f in fields(AnalyticResult)}
    empirical = {f.name for f in fields(EmpiricalResult)}
    assert set(metrics.CELL_METRICS["analytic"]) <= analytic
    assert set(metrics.CELL_METRICS["empirical"]) - {metrics.QUALITY} <= empirical
    assert set(metrics.CATEGORY_FIGURES["analytic"]) - {metrics.BLOCK_EFFICIENCY} <= analytic
