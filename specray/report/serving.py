"""The report's table of what servers report (vLLM's definitions), beside specray's own metrics: mean
acceptance length (1 + accepted / verification steps), draft acceptance (accepted / drafted) and acceptance
per draft position (steps accepting at least k tokens / steps), expected from the analytic cells and
counted in the empirical ones, for the fastest draft and γ at each τ_dec."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from specray.metrics import ACCEPTANCE_PER_POSITION, DRAFT_ACCEPTANCE, MEAN_ACCEPTANCE_LENGTH, SPEEDUP_MODEL

SERVER_NOTE = (
    "Expected (analytic: along the sampled tokens' own acceptance min(1, q/p), under the decoders' drafting "
    "rules) and measured (empirical) for the draft and γ with the highest `speedup_model` at each τ_dec "
    "(in-domain where present). Mean acceptance length = 1 + accepted / verification steps; draft "
    "acceptance = accepted / drafted; per position k: steps that accepted at least k tokens / steps.\n"
)


def _positions(values: Any) -> str:
    if not isinstance(values, list) or not values:
        return "-"
    return " ".join(
        "-" if not isinstance(v, int | float) or not math.isfinite(v) else f"{v:.2f}" for v in values
    )


def _value(cell: Mapping[str, Any] | None, name: str) -> Any:
    value = cell.get(name) if cell else None
    return value if isinstance(value, int | float) and math.isfinite(value) else "-"


def server_table(cells: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per τ_dec: the fastest analytic cell's server metrics and its empirical twin's, if any."""
    analytic = [c for c in cells if c.get("estimator") == "analytic" and MEAN_ACCEPTANCE_LENGTH in c]
    if not analytic:
        return pd.DataFrame()
    test_set = "in_domain" if any(c["test_set"] == "in_domain" for c in analytic) else analytic[0]["test_set"]
    empirical = {
        (c["draft"], c["tau_dec"], c["gamma"]): c
        for c in cells
        if c.get("estimator") == "empirical" and c["test_set"] == test_set
    }
    rows = []
    for tau in sorted({c["tau_dec"] for c in analytic if c["test_set"] == test_set}):
        at_tau = [c for c in analytic if c["test_set"] == test_set and c["tau_dec"] == tau]
        best = max(at_tau, key=lambda c: c.get(SPEEDUP_MODEL, -math.inf))
        twin = empirical.get((best["draft"], tau, best["gamma"]))
        rows.append(
            {
                "tau_dec": tau,
                "draft": best["draft"],
                "gamma": best["gamma"],
                MEAN_ACCEPTANCE_LENGTH: _value(best, MEAN_ACCEPTANCE_LENGTH),
                DRAFT_ACCEPTANCE: _value(best, DRAFT_ACCEPTANCE),
                "per position": _positions(best.get(ACCEPTANCE_PER_POSITION)),
                "empirical mean_acceptance_length": _value(twin, MEAN_ACCEPTANCE_LENGTH),
                "empirical draft_acceptance": _value(twin, DRAFT_ACCEPTANCE),
                "empirical per position": _positions(twin.get(ACCEPTANCE_PER_POSITION) if twin else None),
            }
        )
    return pd.DataFrame(rows)
