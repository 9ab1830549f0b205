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

from specray.metrics import BY_CATEGORY, PROMPT_CATEGORIES, PROMPT_CONVERSATIONS
from specray.specdec.records import CellRecord, CostTerms


def category_figures(
    metrics: Mapping[str, Any], categories: Sequence[str], estimator: str = "analytic"
) -> dict[str, dict[str, float]]:
    """category -> {figure: value, ..., prompts} of a cell's metrics (module docstring); empty when the
    cell has no per-prompt sums for these prompts (an empirical cell's: the first of them)."""
    sums = {k[len("per_prompt_") :]: np.asarray(v, dtype=float) for k, v in metrics.items() if _listed(k, v)}
    tokens = sums.get("tokens", np.empty(0))
    n = len(tokens)
    if not n or n != (len(categories) if estimator == "analytic" else min(n, len(categories))):
        return {}
    labels = np.asarray(categories[:n])
    terms = CostTerms(**metrics["cost_terms"]) if estimator == "analytic" else None
    figures = {}
    for category in dict.fromkeys(labels.tolist()):  # first-seen order
        part = {k: v[labels == category] for k, v in sums.items() if len(v) == n}
        figures[category] = _figures(part, terms) | {"prompts": float((labels == category).sum())}
    return figures


def _listed(key: str, value: Any) -> bool:
    return key.startswith("per_prompt_") and isinstance(value, list) and bool(value)


def _ratio(top: np.ndarray, bottom: np.ndarray) -> float:
    return float(top.sum() / bottom.sum()) if bottom.sum() else float("nan")


def _figures(part: Mapping[str, np.ndarray], terms: CostTerms | None) -> dict[str, float]:
    """One category's figures from its prompts' sums (`terms`: an analytic cell's cost terms)."""
    tokens, calls = part["tokens"], part["target_calls"]
    figures = {"block_efficiency": _ratio(tokens, calls)}
    if "accepted" in part:
        accepted = part["accepted"]
        figures["mean_acceptance_length"] = 1.0 + _ratio(accepted, calls)
        figures["draft_acceptance"] = _ratio(accepted, part["drafted"])
    if terms is not None:  # analytic
        figures["acceptance_rate"] = _ratio(part["beta_sum"], tokens)
        means = (tokens.mean(), calls.mean(), part["drafted"].mean())
        figures["speedup_model"] = float(terms.speedup(*means, 1.0))
        return figures
    figures["acceptance_rate"] = _ratio(part["accepted"], part["tested"])
    if "seconds" in part:
        figures["speedup"] = _ratio(part["target_only_seconds"], part["seconds"])
    if "quality" in part and np.isfinite(part["quality"]).any():
        figures["quality"] = float(np.nanmean(part["quality"]))
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
