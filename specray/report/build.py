"""The sweep report: figures, tables and a findings check, as PNG + Markdown (+ CSV) in one folder.

It reads only plain records (cells, draft descriptions, training curves, output lengths), so `specray run`
builds it from what it just measured and `specray report RUN_ID` builds the same thing from MLflow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from specray.report import figures
from specray.report.figures import BASELINE


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


def peak_table(cells: pd.DataFrame, metric: str = "speedup_model") -> pd.DataFrame:
    """Per test set, paradigm and τ_dec: the best τ_kd and its value, plus the un-distilled draft."""
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
                metric: best[metric],
                "acceptance_rate": best.acceptance_rate,
            }
        )
    return pd.DataFrame(rows)


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
) -> Path:
    """Write every figure and table into `out_dir`; returns the Markdown report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = cells_frame(cells, drafts)
    frame.to_csv(out_dir / "cells.csv", index=False)
    curve_rows = [
        {"draft": name, **drafts.get(name, {}), **row} for name, rows in curves.items() for row in rows
    ]
    curve_frame = pd.DataFrame(curve_rows)
    sections = [f"# {title}\n", "## Findings\n", *[f"- {line}" for line in findings(frame)], ""]
    for metric in ("speedup_model", "acceptance_rate"):
        sections += [f"## {metric}: τ_kd × τ_dec\n"]
        sections += [f"![{p.stem}]({p.name})" for p in figures.heatmaps(frame, metric, out_dir)]
    sections += ["\n## Peak speedup per τ_dec (offline vs online)\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.peak_speedup(frame, out_dir)]
    peaks = peak_table(frame)
    sections += ["", _table(peaks[peaks.tau_dec <= 1.0])]
    sections += ["## Out-of-range τ_dec (1.5, 2.0)\n", _table(peaks[peaks.tau_dec > 1.0])]
    sections += ["## Acceptance vs KD steps\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.acceptance_vs_steps(curve_frame, out_dir)]
    sections += ["\n## Length of the target's test outputs\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.length_distribution(dict(lengths), out_dir)]
    sections += ["\n## Empirical vs analytic acceptance\n"]
    sections += [f"![{p.stem}]({p.name})" for p in figures.agreement(frame, out_dir)]
    sections += ["", _table(figures.paired_estimates(frame).reset_index())]
    path = out_dir / "report.md"
    path.write_text("\n".join(sections) + "\n")
    return path
