"""A workload's weighted speedup in an export: each category of the workload's test set at its own request
temperature, served as the routing plan routes that temperature, and each draft on its own at its best γ.

Speedups are the analytic cells' per-category `speedup_model` (`specray.specdec.categories`) at B = 1; a
category whose temperature the plan serves without speculation counts 1.0. Point estimates: the sweep's
report gives the same figures for the drafts with intervals over replicates and prompts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specray.config import SweepSpec
from specray.data.spec_bench import workload_weights
from specray.errors import SpecError
from specray.metrics import BY_CATEGORY, SPEEDUP_MODEL
from specray.serving.plan import BandPlan
from specray.specdec.records import CellRecord


def workload_entry(spec: SweepSpec, cells: Sequence[CellRecord], plans: Sequence[BandPlan]) -> dict | None:
    """routing.json's `workload` block, or None when the sweep has no workload."""
    workload = spec.eval.workload
    if workload is None:
        return None
    analytic = {
        (c.draft_key, c.gamma, float(c.tau_dec)): c.metrics[BY_CATEGORY]
        for c in cells
        if c.test_set == workload.test_set and c.estimator == "analytic" and c.epsilon == 1.0
        if isinstance(c.metrics.get(BY_CATEGORY), dict)
    }
    if not analytic:
        raise SpecError(f"eval.workload: no cell of test set {workload.test_set!r} has per-category figures")
    counts = next(iter(analytic.values()))
    categories = [c for c in workload.table if c in counts]
    weights = workload_weights(workload.weights, {c: counts[c]["prompts"] for c in categories})
    per_category: list[dict[str, Any]] = []
    for category in categories:
        tau = workload.table[category]
        route = _route_at(plans, tau)
        speedup = 1.0 if route is None else analytic[(route[0], route[1], tau)][category][SPEEDUP_MODEL]
        per_category.append(
            {
                "category": category,
                "temperature": tau,
                "weight": weights[category],
                "draft_key": None if route is None else route[0],
                "gamma": 0 if route is None else route[1],
                SPEEDUP_MODEL: speedup,
            }
        )
    return {
        "test_set": workload.test_set,
        "rule": "Σ weight · speedup_model of each category at its temperature (B = 1; no speculation: 1.0)",
        "plan_speedup": sum(c["weight"] * c[SPEEDUP_MODEL] for c in per_category),
        "categories": per_category,
        "drafts": _draft_speedups(analytic, cells, workload.table, weights),
    }


def _route_at(plans: Sequence[BandPlan], tau: float) -> tuple[str, int] | None:
    """(draft key, γ) the plan serves τ with at the smallest batch size, or None (no speculation)."""
    for plan in plans:
        if plan.band.contains(tau):
            choice = plan.route.choice
            return None if choice is None else (choice.draft_key, choice.gamma)
    raise SpecError(f"the routing plan has no band for the workload's temperature {tau:g}")


def _draft_speedups(
    analytic: Mapping[tuple[str, int, float], Any],
    cells: Sequence[CellRecord],
    table: Mapping[str, float],
    weights: Mapping[str, float],
) -> list[dict[str, Any]]:
    """Each draft alone, at its best γ per category: its workload speedup, best first."""
    names = {c.draft_key: c.draft for c in cells}
    rows = []
    for key in sorted({k for k, _, _ in analytic}):
        best = {
            c: max(
                (v[c][SPEEDUP_MODEL] for (k, _, t), v in analytic.items() if k == key and t == table[c]),
                default=None,
            )
            for c in weights
        }
        if all(v is not None for v in best.values()):
            total = sum(weights[c] * float(v) for c, v in best.items() if v is not None)
            rows.append({"draft": names[key], "draft_key": key, "workload_speedup": total})
    return sorted(rows, key=lambda r: -r["workload_speedup"])
