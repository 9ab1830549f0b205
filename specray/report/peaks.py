"""Where the peaks lie, read off the report's frame of cells (`build.cells_frame`): the best γ per draft and
τ_dec, the best (τ_kd, γ) per τ_dec, the papers' projected speedup at a given cost ratio, and the findings
lines. Point values only: the claims are judged, with intervals, by `verdicts`."""

from __future__ import annotations

import pandas as pd

from specray.metrics import ACCEPTANCE_RATE, BLOCK_EFFICIENCY_SAMPLED, SPEEDUP_MODEL
from specray.names import BASELINE
from specray.ops import speedup_model
from specray.report.best import best_gamma, best_rows

PROJECTED = "speedup_projected"  # the papers' model at a given cost ratio (`projected`)


def gamma_table(cells: pd.DataFrame, metric: str = SPEEDUP_MODEL) -> pd.DataFrame:
    """Per draft and τ_dec (in-domain where present): the best γ and the speedup there, next to the
    speedup at every γ of the grid."""
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty or analytic.gamma.nunique() < 2:
        return pd.DataFrame()
    test_set = "in_domain" if (analytic.test_set == "in_domain").any() else analytic.test_set.iloc[0]
    rows = analytic[analytic.test_set == test_set]
    wide = rows.pivot_table(index=["draft", "tau_dec"], columns="gamma", values=metric)
    wide.columns = [f"γ={g}" for g in wide.columns]
    best = best_gamma(rows, metric).set_index(["draft", "tau_dec"])
    wide.insert(0, "best γ", best["gamma"].astype(int))
    wide.insert(1, f"{metric} at best γ", best[metric])
    return wide.reset_index()


def peak_table(cells: pd.DataFrame, metric: str = SPEEDUP_MODEL) -> pd.DataFrame:
    """Per test set, paradigm and τ_dec: the best (τ_kd, γ) and its value, plus the un-distilled draft."""
    analytic = cells[(cells.estimator == "analytic") & cells.paradigm.notna()]
    rows = []
    for best in best_rows(
        analytic, metric, ("test_set", "paradigm", "tau_dec"), ("draft", "gamma")
    ).itertuples():
        test_set, paradigm, tau_dec = best.test_set, best.paradigm, best.tau_dec
        tau_kd = "-" if pd.isna(best.tau_kd) else f"{best.tau_kd:g}"
        rows.append(
            {
                "test_set": test_set,
                "paradigm": paradigm,
                "tau_dec": tau_dec,
                "best tau_kd": tau_kd,
                "gamma": int(best.gamma),
                metric: getattr(best, metric),
                ACCEPTANCE_RATE: best.acceptance_rate,
            }
        )
    return pd.DataFrame(rows)


def projected(cells: pd.DataFrame, cost_ratio: float) -> pd.DataFrame:
    """Analytic cells with `speedup_projected`: the exact expected tokens per step at a given cost ratio
    in the papers' model, E / (c·γ + 1) (verification as one target step, no prefill), each cell at the
    γ that maximises it."""
    analytic = cells[cells.estimator == "analytic"].copy()
    analytic[PROJECTED] = [
        speedup_model(e, cost_ratio, int(g))
        for e, g in zip(analytic[BLOCK_EFFICIENCY_SAMPLED], analytic.gamma, strict=True)
    ]
    return best_gamma(analytic, PROJECTED)


def findings(cells: pd.DataFrame) -> list[str]:
    """Where the peaks lie on this sweep's analytic cells (in-domain where both exist): point values only;
    the claims are judged, with intervals, by `verdicts`."""
    analytic = cells[(cells.estimator == "analytic")]
    if analytic.empty:
        return ["no analytic cells"]
    data = (
        analytic[analytic.test_set == "in_domain"] if (analytic.test_set == "in_domain").any() else analytic
    )
    in_range = data[data.tau_dec <= 1.0]
    lines = []
    base = in_range[in_range.draft == BASELINE].set_index("tau_dec")[SPEEDUP_MODEL].sort_index()
    if len(base) >= 2:
        first, last = base.iloc[0], base.iloc[-1]
        span = f"τ_dec {base.index[0]:g} → {base.index[-1]:g}: {first:.3f} → {last:.3f}"
        lines.append(f"un-distilled draft's speedup_model, {span} (its verdict, with an interval: above)")
    distilled = in_range[in_range.tau_kd.notna()]
    for paradigm, group in distilled.groupby("paradigm"):
        best = best_rows(group, SPEEDUP_MODEL, ("tau_dec",), ("draft",))
        pairs = {f"{d:g}": f"{k:g}" for d, k in zip(best.tau_dec, best.tau_kd, strict=True)}
        gap = (best.tau_kd - best.tau_dec).abs().mean()
        lines.append(f"{paradigm}: best τ_kd per τ_dec {pairs}; mean |τ_kd − τ_dec| of the best = {gap:.2f}")
        if len(base):
            gain = (group.groupby("tau_dec")[SPEEDUP_MODEL].max() / base).dropna()
            gains = {f"{k:g}": round(v, 3) for k, v in gain.items()}
            lines.append(f"{paradigm}: peak speedup_model / un-distilled per τ_dec {gains}")
    return lines
