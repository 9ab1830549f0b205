"""Task quality (specray/quality.py): answer extraction, metric choice per family, golden ROUGE, intervals."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from specray.config.vocabulary import HIGH_ENTROPY, IN_DOMAIN
from specray.data.examples import Example
from specray.data.loaders import load_gsm8k
from specray.data.synthetic import FAMILIES, synthetic_corpus
from specray.quality import (
    EXACT_MATCH,
    ROUGE_2,
    ROUGE_L,
    final_answer,
    mean_interval,
    metric_kind,
    score_example,
    score_outputs,
)


def example(output: str, family: str) -> Example:
    return Example(f"{family}-0", "instruction", "", output, family)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18", "18"),
        ("So he made 200,000-130,000=$<<200000-130000=70000>>70,000\n#### 70,000", "70000"),
        ("#### 1,450,000", "1450000"),
        ("#### 5.0", "5"),
        ("#### -3", "-3"),
        ("#### 18 dollars, not 20", "18"),  # the number right after the marker, not the last one
        ("Ben has 9 - 4 = 5 pens left. The answer is 5.", "5"),  # no marker: the last number
        ("12 + 7 = 19", "19"),
        ("3 - 5 = -2", "-2"),
        ("It costs $18.", "18"),
    ],
)
def test_final_answer_golden(text: str, expected: str) -> None:
    assert final_answer(text) == Decimal(expected)


def test_final_answer_missing() -> None:
    assert final_answer("no digits here") is None
    assert final_answer("7 apples #### none") is None  # a marker with nothing after it is no answer


def test_numbers_are_normalised() -> None:
    reference = example("... #### 1000", "gsm8k")
    for output in ("#### 1,000", "#### 1000.0", "The total is 1000", "#### 1000\n\nNext question: 5"):
        assert score_example(reference, output) == {EXACT_MATCH: 1.0}, output
    for output in ("#### 100", "#### 10,00.5", "", "1000 minus 1 is 999"):
        assert score_example(reference, output) == {EXACT_MATCH: 0.0}, output


def test_gsm8k_references_score_themselves(shared_data) -> None:
    """Every GSM8K test answer ends in "#### N" and scores 1 against itself; a wrong final number 0."""
    examples = load_gsm8k(str(shared_data / "gsm8k" / "test.jsonl"))
    assert len(examples) == 1319
    assert final_answer(examples[0].output) == 18  # Janet's ducks
    assert final_answer(examples[2].output) == 70000  # "#### 70000"
    for ex in examples:
        assert metric_kind(ex) == EXACT_MATCH
        assert score_example(ex, ex.output) == {EXACT_MATCH: 1.0}, ex.id
        wrong = ex.output.rsplit("####", 1)[0] + f"#### {final_answer(ex.output) + 1}"
        assert score_example(ex, wrong) == {EXACT_MATCH: 0.0}, ex.id
    comma = next(ex for ex in examples if "#### " in ex.output and final_answer(ex.output) >= 1000)
    assert score_example(comma, f"#### {final_answer(comma.output):,}") == {EXACT_MATCH: 1.0}


def test_synthetic_families_pick_their_metric() -> None:
    """One-answer families are exact match, open-ended ones ROUGE; every reference scores itself 1."""
    examples = synthetic_corpus(200, seed=3, families=list(FAMILIES))
    for ex in examples:
        scores = score_example(ex, ex.output)
        if ex.family in HIGH_ENTROPY:
            assert metric_kind(ex) == "rouge" and scores == {ROUGE_2: 1.0, ROUGE_L: 1.0}, ex
        else:
            assert metric_kind(ex) == EXACT_MATCH and scores == {EXACT_MATCH: 1.0}, ex


def test_exact_text_match_is_whitespace_normalised_and_case_sensitive() -> None:
    capital = example("RED FOX", "capitalise")
    assert score_example(capital, "  RED   FOX\n") == {EXACT_MATCH: 1.0}
    assert score_example(capital, "red fox") == {EXACT_MATCH: 0.0}
    assert score_example(example("There are three words.", "count"), "There are two words.") == {
        EXACT_MATCH: 0.0
    }


def test_rouge_golden() -> None:
    """Bigrams: 3 of 5 shared (F1 0.6); LCS "the cat sat on mat" is 5 of 6 tokens (F1 5/6)."""
    scores = score_example(example("the cat sat on the mat", "describe"), "the cat sat on a mat")
    assert scores[ROUGE_2] == pytest.approx(0.6) and scores[ROUGE_L] == pytest.approx(5 / 6)
    assert score_example(example("the cat sat", "alpaca"), "") == {ROUGE_2: 0.0, ROUGE_L: 0.0}
    assert metric_kind(example("x", "")) == "rouge"  # unknown family: open-ended


def test_score_outputs_per_metric_with_intervals() -> None:
    examples = synthetic_corpus(len(IN_DOMAIN) * 4, seed=0)
    outputs = [ex.output if i % 2 == 0 else "wrong" for i, ex in enumerate(examples)]
    scores = score_outputs(examples, outputs)
    assert set(scores) == {EXACT_MATCH, ROUGE_2, ROUGE_L}
    em = scores[EXACT_MATCH]
    one_answer = [i for i, ex in enumerate(examples) if metric_kind(ex) == EXACT_MATCH]
    assert em.n == len(one_answer) and em.mean == pytest.approx(sum(i % 2 == 0 for i in one_answer) / em.n)
    assert 0.0 < em.low < em.mean < em.high < 1.0
    assert scores[ROUGE_2].n == len(examples) - em.n


def test_repeats_are_averaged_per_prompt() -> None:
    examples = [example("#### 4", "gsm8k"), example("#### 5", "gsm8k")]
    scores = score_outputs(examples, [["#### 4", "#### 3"], "#### 5"])
    assert scores[EXACT_MATCH].n == 2 and scores[EXACT_MATCH].mean == pytest.approx(0.75)
    with pytest.raises(ValueError, match="2 examples but 1 outputs"):
        score_outputs(examples, ["#### 4"])


def test_mean_interval() -> None:
    mean, low, high = mean_interval([0.0] * 50 + [1.0] * 50, seed=1)
    # the normal approximation gives 0.5 ± 1.96·0.05 = [0.402, 0.598]; the bootstrap is close to it
    assert mean == 0.5 and low == pytest.approx(0.402, abs=0.03) and high == pytest.approx(0.598, abs=0.03)
    assert mean_interval([0.0] * 50 + [1.0] * 50, seed=1) == (mean, low, high)  # seeded
    assert mean_interval([1.0, 1.0, 1.0]) == (1.0, 1.0, 1.0)
    single = mean_interval([0.3])
    assert single[0] == 0.3 and math.isnan(single[1]) and math.isnan(single[2])
    assert all(math.isnan(v) for v in mean_interval([]))
