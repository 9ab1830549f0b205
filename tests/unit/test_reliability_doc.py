"""docs/RELIABILITY.md must match the tests: every test it names exists, and its bad-input table lists
exactly the cases of tests/integration/test_bad_input.py."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

DOC = (REPO / "docs" / "RELIABILITY.md").read_text()


def _test_functions(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def test_every_test_the_document_names_exists() -> None:
    named: list[tuple[str, str]] = []
    for cell in re.findall(r"`([^`]*::[^`]*)`", DOC):
        path, name = cell.split("::", 1)
        if path and not path.endswith(".py"):  # a process title such as `ray::TeacherActor`
            continue
        if path:  # "`::other_test`" continues the file of the previous reference
            current = path
        named.append((current, name.split("[", 1)[0]))
    assert len(named) > 30
    missing = [f"{path}::{name}" for path, name in named if name not in _test_functions(path)]
    assert missing == []


def test_the_bad_input_table_lists_exactly_the_tested_cases() -> None:
    source = (REPO / "tests" / "integration" / "test_bad_input.py").read_text()
    cases = re.findall(r'^    "([a-z0-9-]+)": Case\(', source, flags=re.MULTILINE)
    table = DOC.split("## Bad input", 1)[1].split("More bad input", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.MULTILINE)
    assert len(cases) >= 15 and rows == cases
