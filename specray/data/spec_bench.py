"""Spec-Bench question files, and the per-category request temperatures and weights of a workload.

A Spec-Bench question file (`data/spec_bench/question.jsonl` of the Spec-Bench repository) is JSON Lines, one
question per line:

    {"question_id": 81, "category": "writing", "turns": ["Compose ...", "Rewrite ..."], "reference": [...]}

`turns` are the user's turns (a list of strings, or one string for a single-turn question); `reference`
(optional) holds reference answers turn by turn, each a string or a list of acceptable answers. Spec-Bench
has 480 questions in 13 categories: MT-bench's 80 two-turn questions in its eight categories, and 80
single-turn questions each of translation, summarization, qa, math_reasoning and rag.

The category names, their groups and the workload presets are part of the spec's vocabulary
(`specray.config.vocabulary`), which validates against them before any file is read.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.config.vocabulary import WORKLOADS, resolve_categories
from specray.data.examples import Example
from specray.errors import DataError
from specray.named_files import missing_file_message


@dataclass(frozen=True)
class Question:
    """One question: the user's turns in order, and reference answers turn by turn where the file has them."""

    question_id: int
    category: str
    turns: tuple[str, ...]
    # per turn, the acceptable answers (RAG questions list several; most rows one)
    reference: tuple[tuple[str, ...], ...] | None = None


def load_questions(path: str | Path, categories: Iterable[str] | None = None) -> list[Question]:
    """The questions of a Spec-Bench question file, in file order, optionally only `categories` (names or
    groups such as `mt_bench`). A bad line is an error naming the file, the line and the field."""
    path = Path(path).expanduser()
    wanted = resolve_categories(categories, f"{path}: categories")
    if (problem := missing_file_message(path)) is not None:
        raise DataError(problem)
    questions: list[Question] = []
    seen: set[int] = set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            question = _question(path, number, line)
            if question.question_id in seen:
                raise DataError(f"{path}:{number}: question_id {question.question_id} appears twice")
            seen.add(question.question_id)
            if wanted is None or question.category in wanted:
                questions.append(question)
    if not questions:
        chosen = f" in categories {', '.join(wanted)}" if wanted else ""
        raise DataError(f"{path}: no questions{chosen}")
    return questions


def _question(path: Path, number: int, line: str) -> Question:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: a question is a JSON object, got {type(row).__name__}")
    qid = row.get("question_id")
    if isinstance(qid, bool) or not isinstance(qid, int | str) or not str(qid).strip().isdigit():
        raise DataError(f"{where}: 'question_id' must be an integer, got {qid!r}")
    category = row.get("category")
    if not isinstance(category, str) or not category.strip():
        raise DataError(f"{where}: 'category' must be a non-empty string, got {category!r}")
    turns = _texts(row.get("turns"), where, "turns")
    if turns is None:
        raise DataError(f"{where}: missing 'turns' (the user's turns: a string or a list of strings)")
    return Question(int(qid), category, turns, _reference(row.get("reference"), where))


def _reference(value: Any, where: str) -> tuple[tuple[str, ...], ...] | None:
    """Reference answers turn by turn, each a string or a list of acceptable strings; None when absent."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    answers = (
        [[item] if isinstance(item, str) else item for item in items] if isinstance(items, list) else None
    )
    if not answers or not all(isinstance(a, list) and all(isinstance(t, str) for t in a) for a in answers):
        raise DataError(
            f"{where}: 'reference' must be a string or a list with, per turn, a string or a list of strings"
        )
    return tuple(tuple(a) for a in answers)


def _texts(value: Any, where: str, field: str) -> tuple[str, ...] | None:
    """A string or a non-empty list of strings, as a tuple; None when absent."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(t, str) for t in items):
        raise DataError(f"{where}: '{field}' must be a string or a non-empty list of strings")
    if field == "turns" and not all(t.strip() for t in items):
        raise DataError(f"{where}: 'turns' holds an empty turn")
    return tuple(items)


def question_examples(questions: Iterable[Question]) -> list[Example]:
    """Questions as examples: the first turn is the instruction, the category the family, the first turn's
    first reference the output (quality metrics read it; "" without one); a multi-turn question keeps every
    turn in `turns` and each turn's first reference in `references` (`expand_turns` makes one example per
    turn)."""
    examples = []
    for q in questions:
        references = tuple(r[0] if r else "" for r in q.reference or ())
        references += ("",) * (len(q.turns) - len(references))
        several = len(q.turns) > 1
        examples.append(
            Example(
                id=str(q.question_id),
                instruction=q.turns[0],
                input="",
                output=references[0],
                family=q.category,
                turns=q.turns if several else (),
                references=references if several else (),
            )
        )
    return examples


TURN = "/turn_"  # a later turn's example id: <conversation id>/turn_<k>


def conversation_id(example_id: str) -> str:
    """The conversation a turn's example belongs to (its question's id)."""
    return example_id.split(TURN)[0]


def expand_turns(examples: Iterable[Example]) -> list[Example]:
    """One example per turn of each conversation, in order: turn 1 is the question's own example without
    its later turns; turn k > 1 has id `<id>/turn_<k>`, its turn as the instruction, its reference as the
    output and the user's turns up to it in `turns` (its prompt needs the model's answers to the earlier
    ones: `specdec.turns`)."""
    expanded = []
    for e in examples:
        if len(e.turns) < 2:
            expanded.append(e)
            continue
        expanded.append(Example(e.id, e.turns[0], "", e.references[0], e.family))
        for k in range(2, len(e.turns) + 1):
            turn_id = f"{e.id}{TURN}{k}"
            turns = e.turns[:k]
            expanded.append(Example(turn_id, turns[-1], "", e.references[k - 1], e.family, turns))
    return expanded


def workload_temperatures(
    workload: str | Mapping[str, float], categories: Sequence[str], source: str = "workload"
) -> dict[str, float]:
    """category -> request temperature for these categories: a preset name or a mapping. Every category
    must have a temperature."""
    if isinstance(workload, str):
        if workload not in WORKLOADS:
            raise DataError(f"{source}: unknown workload {workload!r}; presets: {', '.join(WORKLOADS)}")
        table = WORKLOADS[workload]
    else:
        table = dict(workload)
    missing = [c for c in categories if c not in table]
    if missing:
        raise DataError(
            f"{source}: no temperature for categories {', '.join(missing)} "
            f"(it covers {', '.join(table) or 'none'})"
        )
    bad = {c: t for c, t in table.items() if not 0.0 <= float(t) <= 2.0}
    if bad:
        raise DataError(f"{source}: temperatures must be in [0, 2], got {bad}")
    return {c: float(table[c]) for c in categories}


def workload_weights(weights: str | Mapping[str, float], prompts: Mapping[str, float]) -> dict[str, float]:
    """category -> weight, summing to 1, over the categories of `prompts` (category -> its prompt count):
    "share" weighs each by its share of the prompts; given weights are normalised over these categories."""
    if isinstance(weights, str):
        if weights != "share":
            raise ValueError(f"workload weights: 'share' or a mapping, not {weights!r}")
        raw = {c: float(n) for c, n in prompts.items()}
    else:
        raw = {c: float(weights[c]) for c in prompts}
    total = sum(raw.values())
    return {c: w / total for c, w in raw.items()}
