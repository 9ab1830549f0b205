"""The sweep report: figures, tables and a findings check, as PNG + Markdown (+ CSV) in one folder.

It reads only plain records (cells, draft descriptions, training curves, output lengths), so `specray run`
builds it from what it just measured and `specray report RUN_ID` builds the same thing from MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from specray.report import figures, lossy
from specray.report.figures import BASELINE
from specray.report.serving import SERVER_NOTE, server_table


def cells_frame(cells: Sequence[Mapping[str, Any]], drafts: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Cell records joined with each draft's paradigm and τ_kd (None for mixtures and the baseline)."""
    frame = pd.DataFrame([{k: v for k, v in c.items() if not isinstance(v, list)} for c in cells])
    info = pd.DataFrame([{"draft": name, **d} for name, d in drafts.items()])
    if frame.empty:
        return frame
    frame = frame.drop(columns=[c for c in ("paradigm", "tau_kd") if c in frame]).merge(
        info, on="draft", how="left"
    )
    frame.loc[frame.draft == BASELINE, "paradigm"] = BASELINE
    return frame


def _table(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    if frame.empty:
        return "_no data_\n"
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = [
        "| " + " | ".join(float_format.format(v) if isinstance(v, float) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *rows]) + "\n"


def best_gamma(cells: pd.DataFrame, metric: str = "speedup_model") -> pd.DataFrame:
    """The analytic cells at each (draft, test set, τ_dec)'s best γ (one row each; all rows with one γ)."""
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty:
        return analytic
    best = analytic.groupby(["draft", "test_set", "tau_dec"])[metric].idxmax()
    return analytic.loc[best.values].reset_index(drop=True)


def gamma_table(cells: pd.DataFrame, metric: str = "speedup_model") -> pd.DataFrame:
    """Per draft and τ_dec (in-domain where present): the best γ and the speedup there, next to the
    speedup at every γ of the grid."""
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty or analytic.gamma.nunique() < 2:
        return pd.DataFrame()
    test_set = "in_domain" if (analytic.test_set == "in_domain").any() else analytic.test_set.iloc[0]
    rows = analytic[analytic.test_set == test_set]
    wide = rows.pivot_table(index=["draft", "tau_dec"], columns="gamma", values=metric)
    wide.columns = [f"γ={g}" for g in wide.columns]
    best = rows.loc[rows.groupby(["draft", "tau_dec"])[metric].idxmax()].set_index(["draft", "tau_dec"])
    wide.insert(0, "best γ", best["gamma"].astype(int))
    wide.insert(1, f"{metric} at best γ", best[metric])
    return wide.reset_index()


def peak_table(cells: pd.DataFrame, metric: str = "speedup_model") -> pd.DataFrame:
    """Per test set, paradigm and τ_dec: the best (τ_kd, γ) and its value, plus the un-distilled draft."""
    analytic = cells[cells.estimator == "analytic"]
    rows = []
    for (test_set, paradigm, tau_dec), group in analytic.groupby(["test_set", "paradigm", "tau_dec"]):
        best = group.loc[group[metric].idxmax()]
        tau_kd = "-" if pd.isna(best.tau_kd) else f"{best.tau_kd:g}"
        rows.append(
            {
                "test_set": test_set,
                "paradigm": paradigm,
                "tau_dec": tau_dec,
                "best tau_kd": tau_kd,
                "gamma": int(best.gamma),
                metric: best[metric],
                "acceptance_rate": best.acceptance_rate,
            }
        )
    return pd.DataFrame(rows)


def projected(cells: pd.DataFrame, cost_ratio: float) -> pd.DataFrame:
    """Analytic cells with `speedup_projected`: the measured block efficiency at a given cost ratio."""
    analytic = best_gamma(cells, "block_efficiency_simulated").copy()
    analytic["speedup_projected"] = analytic.block_efficiency_simulated / (cost_ratio * analytic.gamma + 1)
    return analytic


def cost_ratio_line(cost_ratio: Mapping[str, Any] | None) -> str:
    """How c was obtained, for the report's header."""
    if not cost_ratio:
        return "c: not recorded"
    if cost_ratio.get("source") == "fixed":
        return f"c = {cost_ratio['value']:.4g}, fixed by eval.draft_cost_ratio (not measured)"
    share = 100 * cost_ratio["ci95"] / cost_ratio["value"]
    return (
        f"c = {cost_ratio['value']:.4f} ± {cost_ratio['ci95']:.4f} (95% interval, ±{share:.1f}%), "
        f"measured once on {cost_ratio.get('device', '?')} over {cost_ratio['steps']} interleaved "
        "draft/target step pairs; every analytic cell uses it"
    )


def findings(cells: pd.DataFrame) -> list[str]:
    """The paper's claims, checked on this sweep's analytic cells (in-domain where both exist)."""
    analytic = cells[(cells.estimator == "analytic")]
    if analytic.empty:
        return ["no analytic cells"]
    data = (
        analytic[analytic.test_set == "in_domain"] if (analytic.test_set == "in_domain").any() else analytic
    )
    in_range = data[data.tau_dec <= 1.0]
    lines = []
    base = in_range[in_range.draft == BASELINE].set_index("tau_dec")["speedup_model"].sort_index()
    if len(base) >= 2:
        first, last = base.iloc[0], base.iloc[-1]
        span = f"τ_dec {base.index[0]:g} → {base.index[-1]:g}: {first:.3f} → {last:.3f}"
        lines.append(
            f"speedup falls as τ_dec rises (un-distilled draft, {span}): {'yes' if last < first else 'no'}"
        )
    distilled = in_range[in_range.tau_kd.notna()]
    for paradigm, group in distilled.groupby("paradigm"):
        best = group.loc[group.groupby("tau_dec")["speedup_model"].idxmax()]
        pairs = {f"{d:g}": f"{k:g}" for d, k in zip(best.tau_dec, best.tau_kd, strict=True)}
        gap = (best.tau_kd - best.tau_dec).abs().mean()
        lines.append(f"{paradigm}: best τ_kd per τ_dec {pairs}; mean |τ_kd − τ_dec| of the best = {gap:.2f}")
        if len(base):
            gain = (group.groupby("tau_dec")["speedup_model"].max() / base).dropna()
            gains = {f"{k:g}": round(v, 3) for k, v in gain.items()}
            lines.append(f"{paradigm}: peak speedup_model / un-distilled per τ_dec {gains}")
    return lines


def build_report(
    cells: Sequence[Mapping[str, Any]],
    drafts: Mapping[str, Mapping[str, Any]],
    curves: Mapping[str, Sequence[Mapping[str, Any]]],
    lengths: Mapping[str, Mapping[float, list[int]]],
    out_dir: Path,
    title: str = "specray sweep",
    cost_ratio: Mapping[str, Any] | None = None,
    projected_cost_ratio: float | None = None,
) -> Path:
    """Write every figure and table into `out_dir`; returns the Markdown report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    everything = cells_frame(cells, drafts)
    everything.to_csv(out_dir / "cells.csv", index=False)
    frame = lossless(everything)  # the lossy cells and the ends have their own section (report/lossy.py)
    curve_rows = [
        {"draft": name, **drafts.get(name, {}), **row} for name, rows in curves.items() for row in rows
    ]
    curve_frame = pd.DataFrame(curve_rows)
    at_best = (
        pd.concat([best_gamma(frame), frame[frame.estimator != "analytic"]]) if not frame.empty else frame
    )
    sections = [f"# {title}\n", f"{cost_ratio_line(cost_ratio)}\n"]
    sections += ["## Findings\n", *[f"- {line}" for line in findings(at_best)], ""]
    several = not frame.empty and frame.gamma.nunique() > 1
    for metric in ("speedup_model", "acceptance_rate"):
        sections += [f"## {metric}: τ_kd × τ_dec" + (" (at each cell's best γ)" if several else "") + "\n"]
        sections += [f"![{p.stem}]({p.name})" for p in figures.heatmaps(at_best, metric, out_dir)]
    if several:
        sections += ["\n## Best γ per draft and τ_dec\n", _table(gamma_table(frame))]
    if projected_cost_ratio is not None and not frame.empty:
        sections += [f"\n## speedup_model projected at c = {projected_cost_ratio:g}\n"]
        sections += [
            "Each cell's measured block efficiency at the given draft/target cost ratio (at its best γ).\n"
        ]
        sections += [
            f"![{p.stem}]({p.name})"
            for p in figures.heatmaps(projected(frame, projected_cost_ratio), "speedup_projected", out_dir)
        ]
    sections += ["\n## Peak speedup per τ_dec (offline vs online)\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.peak_speedup(at_best, out_dir)]
    peaks = peak_table(frame)
    sections += ["", _table(peaks[peaks.tau_dec <= 1.0])]
    sections += ["## Out-of-range τ_dec (1.5, 2.0)\n", _table(peaks[peaks.tau_dec > 1.0])]
    sections += ["## Acceptance vs KD steps\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.acceptance_vs_steps(curve_frame, out_dir)]
    sections += ["\n## Length of the target's test outputs\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.length_distribution(dict(lengths), out_dir)]
    c = cost_ratio.get("value") if cost_ratio else None
    sections += lossy.section(everything, out_dir, c)
    sections += ["\n## What servers report\n", SERVER_NOTE, _table(server_table(_lossless_records(cells)))]
    sections += ["\n## Empirical vs analytic acceptance (on the same prompts)\n", AGREEMENT_NOTE]
    sections += [f"![{p.stem}]({p.name})" for p in figures.agreement(frame, out_dir)]
    sections += ["", _table(figures.paired_estimates(frame).reset_index())]
    path = out_dir / "report.md"
    path.write_text("\n".join(sections) + "\n")
    return path


def lossless(frame: pd.DataFrame) -> pd.DataFrame:
    """The speculative cells at ε = 1 (records saved before lenience existed are lossless)."""
    if frame.empty:
        return frame
    kept = frame.estimator != "ends"
    return frame[kept & (frame.epsilon == 1.0)] if "epsilon" in frame else frame[kept]


def _lossless_records(cells: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [c for c in cells if c.get("epsilon", 1.0) == 1.0 and c.get("estimator") != "ends"]


AGREEMENT_NOTE = (
    "Each empirical cell decodes the first `eval.empirical_prompts` test prompts; the analytic estimate in "
    "this table is computed on exactly those prompts (same draft, test set, τ_dec and γ). They agree when "
    "their difference lies within the combined 95% interval, √(ci_analytic² + ci_empirical²).\n"
)
