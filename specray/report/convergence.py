"""The report's convergence table and the label of the projected speedup.

Kept apart from `build.py` so the report's figures and tables can change without touching these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from specray.distill.convergence import FLAT_SLOPE, PER_STEPS, WINDOW, convergence, mean_acceptance
from specray.distill.curves import CurvePoint

CONVERGENCE_NOTE = (
    f"Slope of the probe's acceptance (mean over its τ_dec, {PER_STEPS}-step units) by least squares over "
    f"the last {WINDOW:.0%} of the KD steps; a draft is flat when |slope| < {FLAT_SLOPE:g}, i.e. another "
    f"{PER_STEPS} steps at the end's rate would move its acceptance by less than {FLAT_SLOPE:g}.\n"
)

# A reference pair for `eval.projected_cost_ratio`: a llama-68m draft for Llama-2-13B (the paper's pair)
# steps at about 5% of the target's latency on a GPU, far below the c of the tiny CPU pair.
PAPER_PAIR_NOTE = "c ≈ 0.05: a 68M draft with a 13B target on a GPU, the papers' pair"


def convergence_table(curves: Mapping[str, Sequence[CurvePoint]]) -> pd.DataFrame:
    """One row per distilled draft: its last-window slope, the window, and whether it is flat."""
    rows: list[dict[str, object]] = []
    for draft, points in sorted(curves.items()):
        found = convergence(points)
        if found is None:
            rows.append({"draft": draft, f"slope per {PER_STEPS} steps": "n/a", "window": "too few points"})
            continue
        window = f"{found.first_step}–{found.last_step} ({found.points} points)"
        last = points[-1]
        rows.append(
            {
                "draft": draft,
                f"slope per {PER_STEPS} steps": f"{found.slope:+.4f}",
                "window": window,
                "flat": "yes" if found.flat else "no",
                "final mean acceptance": round(_mean_acceptance(last), 4),
            }
        )
    return pd.DataFrame(rows).astype(object).fillna("n/a")


def _mean_acceptance(point: CurvePoint) -> float:
    value = mean_acceptance(point)
    return float("nan") if value is None else value


def projected_heading(cost_ratio: float) -> str:
    """The section heading of the projected speedup, saying where such a c comes from."""
    return f"speedup_model projected at c = {cost_ratio:g} (a given cost ratio; for scale, {PAPER_PAIR_NOTE})"
