"""The report's table of what servers report (vLLM's definitions), beside specray's own metrics: mean
acceptance length (1 + accepted / verification steps), draft acceptance (accepted / drafted) and acceptance
per draft position (steps accepting at least k tokens / steps), expected from the analytic cells and
counted in the empirical ones, for the fastest draft and γ at each τ_dec, as means over training
replicates like every other table of the report."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd

from specray.metrics import ACCEPTANCE_PER_POSITION, DRAFT_ACCEPTANCE, MEAN_ACCEPTANCE_LENGTH, SPEEDUP_MODEL
from specray.report.best import best_rows

SERVER_NOTE = (
    "Expected (analytic: along the sampled tokens' own acceptance min(1, q/p), under the decoders' drafting "
    "rules) and measured (empirical) for the draft and γ with the highest `speedup_model` at each τ_dec "
    "(in-domain where present). Mean acceptance length = 1 + accepted / verification steps; draft "
    "acceptance = accepted / drafted; per position k: steps that accepted at least k tokens / steps.\n"
)


def server_table(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per τ_dec: the fastest analytic (draft, γ)'s server metrics and its empirical twin's, if any,
    each the mean over the draft's training replicates. `cells`: lossless rows with their lists
    (`build.cells_frame(keep_lists=True)`); the fastest by the report's one rule (`best.best_rows`)."""
    if cells.empty or MEAN_ACCEPTANCE_LENGTH not in cells:
        return pd.DataFrame()
    cells = cells.assign(draft=cells["recipe"].fillna(cells.draft)) if "recipe" in cells else cells
    analytic = cells[(cells.estimator == "analytic") & cells[MEAN_ACCEPTANCE_LENGTH].notna()]
    if analytic.empty:
        return pd.DataFrame()
    test_set = "in_domain" if (analytic.test_set == "in_domain").any() else analytic.test_set.iloc[0]
    here = cells[cells.test_set == test_set]
    best = best_rows(analytic[analytic.test_set == test_set], SPEEDUP_MODEL, ("tau_dec",), ("draft", "gamma"))
    rows = []
    for (tau, draft, gamma), expected in best.groupby(["tau_dec", "draft", "gamma"]):
        same = (here.draft == draft) & (here.tau_dec == tau) & (here.gamma == gamma)
        twin = here[same & (here.estimator == "empirical") & (here.get("batch_size", 1) == 1)]
        rows.append(
            {"tau_dec": tau, "draft": draft, "gamma": gamma}
            | _figures(expected, "")
            | _figures(twin, "empirical ")
        )
    return pd.DataFrame(rows)


def _figures(rows: pd.DataFrame, prefix: str) -> dict[str, object]:
    """Mean acceptance length, draft acceptance and acceptance per position, averaged over `rows` (a cell's
    replicates; "-" where there are none)."""
    figures: dict[str, object] = {
        f"{prefix}{name}": _mean(rows[name]) if name in rows else "-"
        for name in (MEAN_ACCEPTANCE_LENGTH, DRAFT_ACCEPTANCE)
    }
    lists = [v for v in rows.get(ACCEPTANCE_PER_POSITION, []) if isinstance(v, list) and v]
    same = bool(lists) and all(len(v) == len(lists[0]) for v in lists)
    with warnings.catch_warnings():  # a position no replicate reached is NaN, and says so in the table
        warnings.simplefilter("ignore", RuntimeWarning)
        positions = np.nanmean(np.array(lists, dtype=float), axis=0) if same else np.empty(0)
    return figures | {f"{prefix}per position": _positions(positions)}


def _mean(values: pd.Series) -> float | str:
    finite = pd.to_numeric(values, errors="coerce").dropna()
    return float(finite.mean()) if len(finite) else "-"


def _positions(values: np.ndarray) -> str:
    if not len(values):
        return "-"
    return " ".join(f"{v:.2f}" if math.isfinite(v) else "-" for v in values)
