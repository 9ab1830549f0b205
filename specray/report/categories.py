"""The report's per-category section: each draft's figures per category of a test set with categories
(Spec-Bench's, MT-bench's), and a workload's weighted speedup — each category at its own request
temperature, weighted by its share of the test set or as given.

Intervals resample training replicates and, within each category, its prompts (`specray.bootstrap`): the
categories are strata of fixed size, so a workload's weights stay what the workload says in every resample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specray.bootstrap import replicated_interval
from specray.data.spec_bench import workload_weights
from specray.metrics import BY_CATEGORY, PROMPT_CATEGORIES, PROMPT_CONVERSATIONS, QUALITY, SPEEDUP
from specray.report.paired import PromptCells, analytic_test_sets
from specray.report.tables import markdown_table

NOTE = (
    "Each analytic cell's figures over the prompts of one category (at the draft's best γ for the τ_dec, "
    "chosen on the whole test set): modelled speedup, with α in brackets.\n"
)
MEASURED_NOTE = (
    "Each empirical cell's figures over the prompts of one category it decoded (the first "
    "`eval.empirical_prompts` of the test set): measured speedup at batch size 1, with the task quality of "
    "its decodes in brackets where the prompts have one.\n"
)
WORKLOAD_NOTE = (
    "Workload-weighted speedup: Σ_c w_c · speedup_model(draft at its best γ, τ_dec = τ_c, prompts of c), "
    "each category c at its request temperature τ_c with weight w_c; 95% interval over training "
    "replicates and, within each category, its conversations (a question's turns are drawn together).\n"
)


@dataclass(frozen=True)
class Workload:
    """category -> request temperature, and category -> weight (summing to 1)."""

    test_set: str
    temperatures: Mapping[str, float]
    weights: Mapping[str, float]


def workload_of(
    test_set: str,
    temperatures: Mapping[str, float],
    weights: str | Mapping[str, float],
    labels: Sequence[str],
) -> Workload:
    """A workload over the categories present in `labels` (each prompt's category): `weights` "share" is
    each category's share of the prompts; given weights are normalised over the present categories."""
    present = {c: float(list(labels).count(c)) for c in dict.fromkeys(labels)}
    shares = workload_weights(weights, present)
    return Workload(test_set, {c: float(temperatures[c]) for c in present}, shares)


def _categories(rows: pd.DataFrame, column: str = PROMPT_CATEGORIES) -> list[str] | None:
    """The test set's per-prompt categories (or conversations), from any of its cells that keep them."""
    if column not in rows:
        return None
    kept = [v for v in rows[column] if isinstance(v, list) and v]
    return list(kept[0]) if kept else None


def clusters(labels: Sequence[str], conversations: Sequence[str] | None) -> dict[str, np.ndarray]:
    """category -> its prompts' indices, one row per conversation [conversations, turns]: what a resample
    draws as one, since a later turn's prompt holds the answer to the turn before it. A category whose
    conversations differ in length (or prompts without conversations) resamples its prompts one by one."""
    out = {}
    for category in dict.fromkeys(labels):
        prompts = [i for i, label in enumerate(labels) if label == category]
        rows = [[i] for i in prompts]
        if conversations is not None:
            grouped: dict[str, list[int]] = {}
            for i in prompts:
                grouped.setdefault(conversations[i], []).append(i)
            if len({len(g) for g in grouped.values()}) == 1:
                rows = list(grouped.values())
        out[category] = np.asarray(rows)
    return out


def per_category(table: PromptCells, labels: Sequence[str]) -> pd.DataFrame:
    """Rows (draft, τ_dec, γ) × columns category: speedup_model and α per category, mean over replicates."""
    groups = {c: np.flatnonzero(np.asarray(labels) == c)[None, :] for c in dict.fromkeys(labels)}
    rows = []
    for i, cell in table.cells.iterrows():
        row: dict[str, object] = {"draft": cell.draft, "tau_dec": cell.tau_dec, "gamma": cell.gamma}
        for category, index in groups.items():
            speedup = float(table.speedup(int(i), index).mean())
            alpha = float(table.acceptance(int(i), index).mean())
            row[category] = f"{speedup:.3f} ({alpha:.2f})"
        rows.append(row)
    return pd.DataFrame(rows).sort_values(["tau_dec", "draft"]).reset_index(drop=True)


def measured_per_category(cells: pd.DataFrame, test_set: str) -> pd.DataFrame:
    """Rows (draft, τ_dec, γ, lenience) × columns category: each empirical cell's measured speedup and
    quality per category (`specdec.categories`), where it has them."""
    rows = []
    empirical = cells[(cells.estimator == "empirical") & (cells.test_set == test_set)]
    for _, cell in empirical.iterrows():
        figures = cell.get(BY_CATEGORY)
        if not isinstance(figures, dict):
            continue
        row: dict[str, object] = {"draft": cell.draft, "tau_dec": cell.tau_dec, "gamma": cell.gamma}
        if float(cell.get("epsilon", 1.0)) < 1.0:
            row["lenience"] = f"{cell.lenience} ε={float(cell.epsilon):g}"
        for category, f in figures.items():
            speedup = f"{f[SPEEDUP]:.3f}" if SPEEDUP in f else "-"
            row[category] = speedup + (f" ({f[QUALITY]:.2f})" if QUALITY in f else "")
        rows.append(row)
    frame = pd.DataFrame(rows)
    return frame.sort_values(["tau_dec", "draft"]).reset_index(drop=True) if rows else frame


def workload_table(
    table: PromptCells, labels: Sequence[str], workload: Workload, conversations: Sequence[str] | None = None
) -> pd.DataFrame:
    """Per draft with a cell at every category's temperature: the workload-weighted speedup and its 95%
    interval, best first. Each category's conversations are resampled on their own (`clusters`)."""
    strata = {c: m for c, m in clusters(labels, conversations).items() if c in workload.weights}
    rows = []
    for draft in dict.fromkeys(table.cells.draft):
        found = {c: table.row(draft, workload.temperatures[c]) for c in strata}
        if any(r is None for r in found.values()):
            continue
        cells = {c: int(r) for c, r in found.items() if r is not None}
        replicates = min(table.replicates(r) for r in cells.values())

        def effect(reps: np.ndarray, drawn: Mapping[str, np.ndarray], cells=cells) -> np.ndarray:
            total = 0.0
            for c, row in cells.items():
                prompts = strata[c][drawn[c]].reshape(len(drawn[c]), -1)  # [resamples, prompts]
                speedup = table.speedup(row, prompts)  # [resamples, replicates]
                picked = speedup[:, np.minimum(reps, speedup.shape[1] - 1)]
                total = total + workload.weights[c] * picked.mean(-1)
            return np.asarray(total)

        interval = replicated_interval(effect, replicates, {c: len(m) for c, m in strata.items()})
        rows.append(
            {
                "draft": draft,
                "workload_speedup": round(interval.effect, 4),
                "ci95": f"[{interval.low:.3f}, {interval.high:.3f}]",
                "replicates": replicates,
            }
        )
    frame = pd.DataFrame(rows)
    return frame.sort_values("workload_speedup", ascending=False).reset_index(drop=True) if rows else frame


def section(with_lists: pd.DataFrame, workload: Mapping[str, object] | None = None) -> list[str]:
    """Markdown lines: per test set with categories, the per-category table, and the workload's table when
    the sweep has one on that test set (`workload`: eval.workload as JSON, its temperatures resolved)."""
    lines: list[str] = []
    for test_set, rows, table in analytic_test_sets(with_lists, PROMPT_CATEGORIES):
        labels = _categories(rows)
        if labels is None:
            continue
        lines += [f"\n## Per category: {test_set}\n", NOTE, markdown_table(per_category(table, labels)), ""]
        measured = measured_per_category(with_lists, str(test_set))
        if not measured.empty:
            lines += [MEASURED_NOTE, markdown_table(measured), ""]
        if workload and workload.get("test_set") == test_set:
            mix = workload_of(
                str(test_set),
                workload["temperatures"],  # type: ignore[arg-type]
                workload.get("weights", "share"),  # type: ignore[arg-type]
                labels,
            )
            listed = ", ".join(f"{c} τ={mix.temperatures[c]:g} w={w:.3f}" for c, w in mix.weights.items())
            lines += [f"### Workload on {test_set}\n", WORKLOAD_NOTE, f"Categories: {listed}.\n"]
            conversations = _categories(rows, PROMPT_CONVERSATIONS)
            lines += [markdown_table(workload_table(table, labels, mix, conversations)), ""]
    return lines
