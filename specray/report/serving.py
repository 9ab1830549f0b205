"""The report's table of what servers report (vLLM's definitions), beside specray's own metrics: mean
acceptance length (1 + accepted / verification steps), draft acceptance (accepted / drafted) and acceptance
per draft position (steps accepting at least k tokens / steps), expected from the analytic cells and
counted in the empirical ones, for the fastest draft and γ at each τ_dec."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

from specray.metrics import DRAFT_ACCEPTANCE, MEAN_ACCEPTANCE_LENGTH
from specray.specdec.records import CellRecord

SERVER_NOTE = (
    "Expected (analytic: along the sampled tokens' own acceptance min(1, q/p), under the decoders' drafting "
    "rules) and measured (empirical) for the draft and γ with the highest `speedup_model` at each τ_dec "
    "(in-domain where present). Mean acceptance length = 1 + accepted / verification steps; draft "
    "acceptance = accepted / drafted; per position k: steps that accepted at least k tokens / steps.\n"
)


def _positions(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return " ".join(f"{v:.2f}" if isinstance(v, int | float) and math.isfinite(v) else "-" for v in values)


def _value(value: float | None) -> float | str:
    return value if isinstance(value, int | float) and math.isfinite(value) else "-"


def server_table(cells: Sequence[CellRecord]) -> pd.DataFrame:
    """One row per τ_dec: the fastest analytic cell's server metrics and its empirical twin's, if any."""
    analytic = [
        c for c in cells if c.estimator == "analytic" and _value(c.analytic().mean_acceptance_length) != "-"
    ]
    if not analytic:
        return pd.DataFrame()
    test_set = "in_domain" if any(c.test_set == "in_domain" for c in analytic) else analytic[0].test_set
    empirical = {
        (c.draft, c.tau_dec, c.gamma): c.empirical()
        for c in cells
        if c.estimator == "empirical" and c.test_set == test_set
    }
    rows = []
    for tau in sorted({c.tau_dec for c in analytic if c.test_set == test_set}):
        at_tau = [c for c in analytic if c.test_set == test_set and c.tau_dec == tau]
        best = max(at_tau, key=lambda c: _finite(c.analytic().speedup_model))
        expected, twin = best.analytic(), empirical.get((best.draft, tau, best.gamma))
        rows.append(
            {
                "tau_dec": tau,
                "draft": best.draft,
                "gamma": best.gamma,
                MEAN_ACCEPTANCE_LENGTH: _value(expected.mean_acceptance_length),
                DRAFT_ACCEPTANCE: _value(expected.draft_acceptance),
                "per position": _positions(expected.acceptance_per_position),
                f"empirical {MEAN_ACCEPTANCE_LENGTH}": _value(twin.mean_acceptance_length if twin else None),
                f"empirical {DRAFT_ACCEPTANCE}": _value(twin.draft_acceptance if twin else None),
                "empirical per position": _positions(twin.acceptance_per_position if twin else []),
            }
        )
    return pd.DataFrame(rows)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf
