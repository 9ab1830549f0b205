"""The synthetic corpus: deterministic, covers every family, and mixes one-answer with many-answer tasks."""

from __future__ import annotations

from collections import defaultdict

import pytest

from specray.config.vocabulary import HIGH_ENTROPY, IN_DOMAIN, LOW_ENTROPY, OUT_OF_DOMAIN, SYNTHETIC_FAMILIES
from specray.data.examples import Example
from specray.data.synthetic import FAMILIES, synthetic_corpus
from specray.data.templates import PROMPT_NO_INPUT, PROMPT_WITH_INPUT, format_prompt, prompt_text


def test_same_seed_same_corpus_other_seed_other_corpus() -> None:
    assert synthetic_corpus(200, seed=3) == synthetic_corpus(200, seed=3)
    assert synthetic_corpus(200, seed=3) != synthetic_corpus(200, seed=4)
    # a longer corpus extends a shorter one with the same seed (sizes can grow without reshuffling)
    assert synthetic_corpus(300, seed=3)[:200] == synthetic_corpus(200, seed=3)


def test_families_default_to_in_domain_and_every_family_appears() -> None:
    examples = synthetic_corpus(len(IN_DOMAIN), seed=0)
    assert {e.family for e in examples} == set(IN_DOMAIN)
    assert {e.family for e in synthetic_corpus(20, seed=0, families=OUT_OF_DOMAIN)} == set(OUT_OF_DOMAIN)
    assert set(LOW_ENTROPY) | set(HIGH_ENTROPY) | set(OUT_OF_DOMAIN) == set(FAMILIES)
    assert tuple(FAMILIES) == SYNTHETIC_FAMILIES  # the spec validates against the names it generates
    for example in synthetic_corpus(500, seed=1, families=list(FAMILIES)):
        assert example.instruction.strip() and example.output.strip()


def test_unknown_family_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown synthetic families.*valid: arithmetic"):
        synthetic_corpus(5, seed=0, families=["poetry"])


def test_low_entropy_tasks_have_one_answer_high_entropy_tasks_many() -> None:
    """The property the study needs: the teacher's temperature matters only where answers vary."""
    answers: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for example in synthetic_corpus(6000, seed=5, families=list(FAMILIES)):
        answers[(example.family, example.instruction, example.input)].add(example.output)
    for family in LOW_ENTROPY:
        assert all(len(v) == 1 for (f, *_), v in answers.items() if f == family), family
    for family in HIGH_ENTROPY:
        assert max(len(v) for (f, *_), v in answers.items() if f == family) >= 5, family


def test_known_answers_are_right() -> None:
    by_family = {e.family: e for e in synthetic_corpus(len(FAMILIES), seed=11, families=list(FAMILIES))}
    a, b = (int(x) for x in by_family["arithmetic"].input.split(" and "))
    left, symbol, right, _, result = by_family["arithmetic"].output.split()
    assert (int(left), int(right)) == (a, b)
    assert int(result) == {"+": a + b, "-": a - b, "*": a * b}[symbol]
    assert by_family["copy"].output == by_family["copy"].input
    assert by_family["capitalise"].output == by_family["capitalise"].input.upper()
    assert by_family["reverse"].output.split() == by_family["reverse"].input.split()[::-1]


def test_templates_select_the_input_variant() -> None:
    assert format_prompt("Sort.", "3, 1") == PROMPT_WITH_INPUT.format(instruction="Sort.", input="3, 1")
    assert format_prompt("List two fruits.", "  ") == PROMPT_NO_INPUT.format(instruction="List two fruits.")
    assert format_prompt("x").endswith("### Response:\n")
    with pytest.raises(ValueError, match="unknown template 'vicuna'; valid: alpaca, chat"):
        prompt_text(Example("1", "x", "", ""), "vicuna")
