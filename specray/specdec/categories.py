"""A cell's figures per category of its test set (Spec-Bench's and MT-bench's categories), from the
per-prompt sums every analytic cell keeps.

Over the prompts P of one category: α = Σ_P beta_sum / Σ_P tokens, block efficiency = Σ_P tokens /
Σ_P target_calls, and the modelled speedup `CostTerms.speedup` of the per-prompt means (whole decodes,
prefills in), exactly as the cell's own figures are over all its prompts — so a category's figures weighted
by its tokens give back the cell's. Empirical cells keep totals only, so they have no per-category figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from specray.specdec.records import CellRecord, CostTerms
from specray.tracking.names import BY_CATEGORY, PROMPT_CATEGORIES, PROMPT_CONVERSATIONS


def category_figures(metrics: Mapping[str, Any], categories: Sequence[str]) -> dict[str, dict[str, float]]:
    """category -> {acceptance_rate, block_efficiency, speedup_model, prompts} of an analytic cell's metrics;
    empty when the cell has no per-prompt sums for exactly these prompts."""
    tokens = np.asarray(metrics.get("per_prompt_tokens") or [], dtype=float)
    if len(tokens) != len(categories) or not len(tokens):
        return {}
    beta = np.asarray(metrics["per_prompt_beta_sum"], dtype=float)
    calls = np.asarray(metrics["per_prompt_target_calls"], dtype=float)
    drafted = np.asarray(metrics["per_prompt_drafted"], dtype=float)
    terms = CostTerms(**metrics["cost_terms"])
    labels = np.asarray(categories)
    figures = {}
    for category in dict.fromkeys(categories):  # first-seen order
        mask = labels == category
        emitted = tokens[mask].sum()
        figures[category] = {
            "acceptance_rate": float(beta[mask].sum() / emitted) if emitted else float("nan"),
            "block_efficiency": float(emitted / calls[mask].sum()) if calls[mask].sum() else float("nan"),
            "speedup_model": float(
                terms.speedup(tokens[mask].mean(), calls[mask].mean(), drafted[mask].mean(), 1.0)
            ),
            "prompts": float(mask.sum()),
        }
    return figures


def with_categories(
    record: CellRecord,
    categories: Mapping[str, Sequence[str]],
    conversations: Mapping[str, Sequence[str]] | None = None,
) -> CellRecord:
    """The record with its per-category figures (`BY_CATEGORY`), its prompts' categories
    (`PROMPT_CATEGORIES`, what the report's intervals resample within) and, when given, their
    conversations (`PROMPT_CONVERSATIONS`, what they resample as one) in its metrics, when its test set has
    categories and the cell is analytic; otherwise unchanged."""
    labels = categories.get(record.test_set)
    if not labels or record.estimator != "analytic":
        return record
    figures = category_figures(record.metrics, labels)
    kept = {BY_CATEGORY: figures, PROMPT_CATEGORIES: list(labels)}
    owners = (conversations or {}).get(record.test_set)
    if owners is not None and len(owners) == len(labels):
        kept[PROMPT_CONVERSATIONS] = list(owners)
    if not figures or all(record.metrics.get(k) == v for k, v in kept.items()):
        return record
    return replace(record, metrics={**record.metrics, **kept})
