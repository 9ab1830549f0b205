"""A small Spec-Bench question file and the smoke sweep evaluating it as a named test set, for the tests of
named test sets and their per-category figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specray.config import SweepSpec, load_spec
from tests.conftest import REPO

SMOKE_SPEC = load_spec(REPO / "sweeps" / "smoke.yaml")
QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Shorter."]},
    {"question_id": 82, "category": "writing", "turns": ["Write a letter."]},
    {"question_id": 111, "category": "math", "turns": ["What is 2+2?"], "reference": ["4"]},
    {"question_id": 112, "category": "math", "turns": ["What is 3+3?"], "reference": ["6"]},
    {"question_id": 113, "category": "math", "turns": ["What is 4+4?"], "reference": ["8"]},
    {"question_id": 201, "category": "qa", "turns": "Who wrote Hamlet?"},
]


def questions(tmp_path: Path) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path


def with_data(spec: SweepSpec, **data: Any) -> SweepSpec:
    raw = spec.model_dump(mode="json")
    raw["data"] |= data
    return SweepSpec.model_validate(raw)


def with_bench(tmp_path: Path, categories: list[str] | None = None, **eval_: Any) -> SweepSpec:
    source = {"kind": "spec_bench", "path": str(questions(tmp_path))}
    source |= {"categories": categories} if categories else {}
    raw = SMOKE_SPEC.model_dump(mode="json")
    raw["data"]["test_sets"] = {"bench": {"source": source}}
    raw["eval"] |= {"test_sets": ["in_domain", "bench"], **eval_}
    return SweepSpec.model_validate(raw)
