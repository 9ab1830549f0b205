"""Task quality of decoded outputs: exact-match accuracy where a task has one right answer, ROUGE otherwise.

Lossy speculative decoding (ε < 1) changes what is decoded, so a lossy cell reports quality next to speed
(DistillSpec, Zhou et al., 2023, §5, Fig. 5). The metric is picked per example from its `family`:

- `exact_match` of the final number for GSM8K ("#### N", Cobbe et al., 2021) and the synthetic numeric
  families (arithmetic "a + b = N", word problems "The answer is N."): the number after the last "####"
  if there is one, else the last number in the text (lm-evaluation-harness's strict and flexible
  extraction, in that order). "1,000", "1000" and "1000.0" are the same answer (compared as Decimals).
- `exact_match` of the whole text (whitespace-normalised, case kept) for the synthetic families whose
  output is fully determined by the input: copy, sort, count, reverse, capitalise.
- `rouge2` and `rougeL` F1 (Google's `rouge-score`, Porter stemming) for open-ended text: the synthetic
  open_list / describe / sentence families, Alpaca, self-instruct, and any family not named above.

A test set mixing families reports each metric over its own examples, as a mean with a 95% percentile
bootstrap interval (`specray.bootstrap`, seeded). Repeated decodes of one prompt are averaged per prompt
first, so the interval resamples prompts, not correlated repeats. Pure Python: no ray, mlflow or torch.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
from typing import Any

import numpy as np

from specray.bootstrap import bootstrap_interval
from specray.data.examples import Example
from specray.metrics import QUALITY

EXACT_MATCH, ROUGE_2, ROUGE_L = "exact_match", "rouge2", "rougeL"
METRICS = (EXACT_MATCH, ROUGE_2, ROUGE_L)
NUMERIC_FAMILIES = frozenset({"gsm8k", "arithmetic", "word_problem"})
EXACT_TEXT_FAMILIES = frozenset({"copy", "sort", "count", "reverse", "capitalise"})

# a number with optional thousands separators and decimals: "18", "-3", "1,000", "5.0" ("$18." -> "18")
_NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")


@dataclass(frozen=True)
class QualityScore:
    """One metric over a test set: mean and 95% interval over `n` prompts (nan bounds when n < 2)."""

    metric: str
    mean: float
    low: float
    high: float
    n: int


def final_answer(text: str) -> Decimal | None:
    """The final numeric answer of a solution: the first number after the last "####", else the last
    number in the text; None when there is none. "1,000" -> 1000, "5.0" -> 5."""
    marker = text.rfind("####")
    numbers = _NUMBER.findall(text[marker + 4 :] if marker >= 0 else text)
    if not numbers:
        return None
    try:
        return Decimal((numbers[0] if marker >= 0 else numbers[-1]).replace(",", ""))
    except InvalidOperation:  # a stray comma pattern such as "1,,2"
        return None


def normalise_text(text: str) -> str:
    """Whitespace-normalised text (runs of spaces and newlines become one space, ends stripped)."""
    return " ".join(text.split())


def metric_kind(example: Example) -> str:
    """How an example is scored: `exact_match` (one right answer) or `rouge` (open-ended), by family."""
    return EXACT_MATCH if example.family in NUMERIC_FAMILIES | EXACT_TEXT_FAMILIES else "rouge"


@cache
def _rouge() -> Any:  # rouge_score ships no type hints
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([ROUGE_2, ROUGE_L], use_stemmer=True)


def score_example(example: Example, output: str) -> dict[str, float]:
    """The example's metrics for one decoded output: {exact_match: 0 or 1} or {rouge2, rougeL} F1."""
    if example.family in NUMERIC_FAMILIES:
        expected = final_answer(example.output)
        return {EXACT_MATCH: float(expected is not None and final_answer(output) == expected)}
    if example.family in EXACT_TEXT_FAMILIES:
        return {EXACT_MATCH: float(normalise_text(output) == normalise_text(example.output))}
    scores = _rouge().score(example.output, output)  # (target, prediction)
    return {ROUGE_2: scores[ROUGE_2].fmeasure, ROUGE_L: scores[ROUGE_L].fmeasure}


def mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its 95% percentile bootstrap interval; bounds nan for < 2 values."""
    data = np.asarray(values, dtype=np.float64)
    if len(data) == 0:
        return math.nan, math.nan, math.nan
    mean = float(data.mean())
    if len(data) < 2:
        return mean, math.nan, math.nan
    if np.all(data == data[0]):  # no spread: every resample has the same mean
        return mean, mean, mean
    return bootstrap_interval(lambda index: data[index].mean(-1), len(data), seed=seed)


def score_outputs(
    examples: Sequence[Example], outputs: Sequence[str | Sequence[str]], seed: int = 0
) -> dict[str, QualityScore]:
    """Quality of a test set's decoded outputs, per metric present (keys among METRICS).

    outputs[i] is the decoded text of examples[i], or a list of its repeated decodes (averaged per
    prompt before the interval is taken).
    """
    per_prompt: dict[str, list[float]] = {}
    for scores in prompt_scores(examples, outputs):
        for metric, value in scores.items():
            per_prompt.setdefault(metric, []).append(value)
    return {
        metric: QualityScore(metric, *mean_interval(per_prompt[metric], seed), len(per_prompt[metric]))
        for metric in METRICS
        if metric in per_prompt
    }


def prompt_scores(
    examples: Sequence[Example], outputs: Sequence[str | Sequence[str]]
) -> list[dict[str, float]]:
    """Per example, each metric it has (its family's), averaged over its decodes (`score_outputs`' input)."""
    if len(examples) != len(outputs):
        raise ValueError(f"{len(examples)} examples but {len(outputs)} outputs")
    means = []
    for example, output in zip(examples, outputs, strict=True):
        decodes = [output] if isinstance(output, str) else list(output)
        if not decodes:
            raise ValueError(f"example {example.id!r} has no decoded output")
        scores = [score_example(example, text) for text in decodes]
        means.append({metric: sum(s[metric] for s in scores) / len(scores) for metric in scores[0]})
    return means


def headline_metric(scores: dict[str, QualityScore]) -> str:
    """The one metric a test set is summarised by: exact match where it has one-answer examples (GSM8K,
    the synthetic numeric and deterministic families), else ROUGE-L."""
    return EXACT_MATCH if EXACT_MATCH in scores else ROUGE_L


def quality_metrics(
    examples: Sequence[Example], outputs: Sequence[Sequence[str]], prefix: str = QUALITY, seed: int = 0
) -> dict[str, float | str]:
    """Flat record metrics of decoded outputs (outputs[i]: the repeated decodes of examples[i]):
    `<prefix>` and `<prefix>_ci95` (half-width) for the headline metric, `<prefix>_metric` its name, and
    `<prefix>_<metric>` with `_ci95` for every metric present."""
    scores = score_outputs(examples, outputs, seed)
    flat: dict[str, float | str] = {}
    for name, score in scores.items():
        flat |= {f"{prefix}_{name}": score.mean, f"{prefix}_{name}_ci95": (score.high - score.low) / 2}
    headline = headline_metric(scores)
    flat |= {prefix: flat[f"{prefix}_{headline}"], f"{prefix}_ci95": flat[f"{prefix}_{headline}_ci95"]}
    return flat | {f"{prefix}_metric": headline}
