"""A cell's figures per category of its test set (Spec-Bench's and MT-bench's categories), from the
per-prompt sums every cell keeps.

Over the prompts P of one category, as the cell's own figures are over all its prompts (so a category's
figures weighted by its tokens give back the cell's):
- analytic: α = Σ_P beta_sum / Σ_P tokens, block efficiency = Σ_P tokens / Σ_P target_calls, the modelled
  speedup `CostTerms.speedup` of the per-prompt means (whole decodes, prefills in), and the server metrics
  from the expected counts: mean acceptance length 1 + Σ_P accepted / Σ_P target_calls, draft acceptance
  Σ_P accepted / Σ_P drafted;
- empirical (the first `eval.empirical_prompts` prompts): α = Σ_P accepted / Σ_P tested, block efficiency,
  mean acceptance length and draft acceptance from the decoders' counts, the measured speedup Σ_P
  target-only seconds / Σ_P speculative seconds (at batch size 1: at B > 1 a batch's time is its rows'
  together, so there is none), and the task quality, the mean of the prompts' own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from specray.metrics import (
    ACCEPTANCE_RATE,
    BLOCK_EFFICIENCY,
    BY_CATEGORY,
    COST_TERMS,
    DRAFT_ACCEPTANCE,
    MEAN_ACCEPTANCE_LENGTH,
    PER_PROMPT,
    PER_PROMPT_ACCEPTED,
    PER_PROMPT_BETA_SUM,
    PER_PROMPT_DRAFTED,
    PER_PROMPT_QUALITY,
    PER_PROMPT_SECONDS,
    PER_PROMPT_TARGET_CALLS,
    PER_PROMPT_TARGET_ONLY_SECONDS,
    PER_PROMPT_TESTED,
    PER_PROMPT_TOKENS,
    PROMPT_CATEGORIES,
    PROMPT_CONVERSATIONS,
    QUALITY,
    SPEEDUP,
    SPEEDUP_MODEL,
)
from specray.specdec.records import CellRecord, CostTerms


def category_figures(
    metrics: Mapping[str, Any], categories: Sequence[str], estimator: str = "analytic"
) -> dict[str, dict[str, float]]:
    """category -> {figure: value, ..., prompts} of a cell's metrics (module docstring); empty when the
    cell has no per-prompt sums for these prompts (an empirical cell's: the first of them)."""
    sums = {k: np.asarray(v, dtype=float) for k, v in metrics.items() if _listed(k, v)}
    tokens = sums.get(PER_PROMPT_TOKENS, np.empty(0))
    n = len(tokens)
    if not n or n != (len(categories) if estimator == "analytic" else min(n, len(categories))):
        return {}
    labels = np.asarray(categories[:n])
    terms = CostTerms(**metrics[COST_TERMS]) if estimator == "analytic" else None
    figures = {}
    for category in dict.fromkeys(labels.tolist()):  # first-seen order
        part = {k: v[labels == category] for k, v in sums.items() if len(v) == n}
        figures[category] = _figures(part, terms) | {"prompts": float((labels == category).sum())}
    return figures


def _listed(key: str, value: Any) -> bool:
    return key in PER_PROMPT and isinstance(value, list) and bool(value)


def _ratio(top: np.ndarray, bottom: np.ndarray) -> float:
    return float(top.sum() / bottom.sum()) if bottom.sum() else float("nan")


def _figures(part: Mapping[str, np.ndarray], terms: CostTerms | None) -> dict[str, float]:
    """One category's figures from its prompts' sums (`terms`: an analytic cell's cost terms)."""
    tokens, calls = part[PER_PROMPT_TOKENS], part[PER_PROMPT_TARGET_CALLS]
    figures = {BLOCK_EFFICIENCY: _ratio(tokens, calls)}
    if PER_PROMPT_ACCEPTED in part:
        accepted = part[PER_PROMPT_ACCEPTED]
        figures[MEAN_ACCEPTANCE_LENGTH] = 1.0 + _ratio(accepted, calls)
        figures[DRAFT_ACCEPTANCE] = _ratio(accepted, part[PER_PROMPT_DRAFTED])
    if terms is not None:  # analytic
        figures[ACCEPTANCE_RATE] = _ratio(part[PER_PROMPT_BETA_SUM], tokens)
        means = (tokens.mean(), calls.mean(), part[PER_PROMPT_DRAFTED].mean())
        figures[SPEEDUP_MODEL] = float(terms.speedup(*means, 1.0))
        return figures
    figures[ACCEPTANCE_RATE] = _ratio(part[PER_PROMPT_ACCEPTED], part[PER_PROMPT_TESTED])
    if PER_PROMPT_SECONDS in part:
        figures[SPEEDUP] = _ratio(part[PER_PROMPT_TARGET_ONLY_SECONDS], part[PER_PROMPT_SECONDS])
    if PER_PROMPT_QUALITY in part and np.isfinite(part[PER_PROMPT_QUALITY]).any():
        figures[QUALITY] = float(np.nanmean(part[PER_PROMPT_QUALITY]))
    return figures


def with_categories(
    record: CellRecord,
    categories: Mapping[str, Sequence[str]],
    conversations: Mapping[str, Sequence[str]] | None = None,
) -> CellRecord:
    """The record with its per-category figures (`BY_CATEGORY`), its prompts' categories
    (`PROMPT_CATEGORIES`, what the report's intervals resample within) and, when given, their
    conversations (`PROMPT_CONVERSATIONS`, what they resample as one) in its metrics, when its test set has
    categories and the cell keeps per-prompt sums (analytic and empirical cells); otherwise unchanged."""
    labels = categories.get(record.test_set)
    if not labels or record.estimator not in ("analytic", "empirical"):
        return record
    figures = category_figures(record.metrics, labels, record.estimator)
    if not figures:
        return record
    prompts = int(sum(f["prompts"] for f in figures.values()))  # an empirical cell's: the first ones
    kept = {BY_CATEGORY: figures, PROMPT_CATEGORIES: list(labels[:prompts])}
    owners = (conversations or {}).get(record.test_set)
    if owners is not None and len(owners) == len(labels):
        kept[PROMPT_CONVERSATIONS] = list(owners[:prompts])
    if all(record.metrics.get(k) == v for k, v in kept.items()):
        return record
    return replace(record, metrics={**record.metrics, **kept})
