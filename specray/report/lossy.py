"""The lossy-decoding section of the report: quality–speedup trade-off curves (DistillSpec Fig. 5b).

Each empirical cell at (draft, test set, τ_dec, lenience function, ε) is one point: its measured speedup
and the task quality of what it decoded (`specray/quality.py`). Per lenience function, each draft's points
form a curve from ε = 1 (lossless: the target's quality) towards small ε (towards the draft's own quality);
the `ends` records give the target-only and draft-only quality as the two reference lines. The verdict
compares the un-distilled draft with the distilled ones at matched quality: the best speedup among cells
whose quality is within the target-only quality's 95% interval (lower bound), per draft.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specray.report.figures import BASELINE, _save, plt

NOTE = (
    "Lossy speculative decoding (DistillSpec Algorithm A.1) accepts a draft token y with probability "
    "min(1, f(p(y), ε) / q(y)), f ∈ {lin: p/ε, sq: p/ε², exp: p^ε}; ε = 1 is lossless. Each point is one "
    "empirical cell: its measured speedup (target-only / speculative wall time) and the task quality of its "
    "decoded outputs (exact match for one-answer tasks, else ROUGE-L), per lenience function; the dashed "
    "lines are the target alone and the un-distilled draft alone on the same prompts and seeds. "
    "At τ_dec = 0 lenience changes nothing (greedy verification has no ratio to relax), so only τ_dec > 0 "
    "has curves.\n"
)


def lossy_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """Empirical cells with a quality score, with their lenience function filled in (lossless: 'lossless')."""
    if frame.empty or "quality" not in frame or "epsilon" not in frame:
        return pd.DataFrame()
    rows = frame[(frame.estimator == "empirical") & frame.quality.notna()].copy()
    rows["lenience"] = rows.lenience.fillna("lossless") if "lenience" in rows else "lossless"
    return rows


def ends_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The `ends` records: target-only and draft-only quality per (draft, test set, τ_dec)."""
    if frame.empty or "quality_target" not in frame:
        return pd.DataFrame()
    return frame[frame.estimator == "ends"]


def curves(cells: pd.DataFrame, ends: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per (test set, τ_dec): a panel per lenience function, a line per draft over ε."""
    paths = []
    for (test_set, tau), rows in cells[cells.tau_dec > 0].groupby(["test_set", "tau_dec"]):
        functions = sorted(f for f in rows.lenience.unique() if f != "lossless") or ["lossless"]
        fig, axes = plt.subplots(1, len(functions), figsize=(5 * len(functions), 4), squeeze=False)
        here = ends[(ends.test_set == test_set) & (ends.tau_dec == tau)] if not ends.empty else ends
        for ax, function in zip(axes[0], functions, strict=True):
            _panel(ax, rows[rows.lenience.isin([function, "lossless"])], here, function)
        fig.suptitle(f"quality vs speedup, {test_set}, τ_dec = {tau:g}")
        paths.append(_save(fig, out_dir / f"lossy_tradeoff_{test_set}_tau{tau:g}.png"))
    return paths


def _panel(ax: plt.Axes, rows: pd.DataFrame, ends: pd.DataFrame, function: str) -> None:
    for draft, points in rows.groupby("draft"):
        points = points.sort_values("epsilon", ascending=False)
        ax.plot(points.speedup, points.quality, marker="o", label=draft)
        for x, y, eps in zip(points.speedup, points.quality, points.epsilon, strict=True):
            ax.annotate(f"ε={eps:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if not ends.empty:
        ax.axhline(ends.quality_target.mean(), color="black", linestyle="--", label="target alone")
        raw = ends[ends.draft == BASELINE]
        if not raw.empty:
            ax.axhline(
                raw.quality_draft.mean(), color="grey", linestyle=":", label="un-distilled draft alone"
            )
    ax.set_xlabel("speedup (empirical)")
    ax.set_ylabel(f"quality ({rows.quality_metric.iloc[0] if 'quality_metric' in rows else ''})")
    ax.set_title(f"lenience {function}")
    ax.legend(fontsize=7)


def table(cells: pd.DataFrame, ends: pd.DataFrame) -> pd.DataFrame:
    """Speedup and quality per (draft, test set, τ_dec, function, ε), next to the two ends."""
    if cells.empty:
        return pd.DataFrame()
    columns = ["draft", "test_set", "tau_dec", "lenience", "epsilon", "gamma", "speedup", "quality"]
    rows = cells[columns + ["quality_ci95"]].sort_values(columns[:5]).reset_index(drop=True)
    if not ends.empty:
        alone = ends[["draft", "test_set", "tau_dec", "quality_target", "quality_draft"]]
        rows = rows.merge(alone, on=["draft", "test_set", "tau_dec"], how="left")
    return rows


def verdict(cells: pd.DataFrame, ends: pd.DataFrame) -> list[str]:
    """Per (test set, τ_dec): does a distilled draft give the better trade-off than the un-distilled one?

    Matched quality: cells whose quality is at least the target-only quality's lower 95% bound (the lossless
    cells' quality where there is no ends record); among those, each draft's best speedup."""
    lines = []
    for (test_set, tau), rows in cells[cells.tau_dec > 0].groupby(["test_set", "tau_dec"]):
        floor = _quality_floor(rows, ends, test_set, tau)
        kept = rows[rows.quality >= floor]
        best = kept.loc[kept.groupby("draft").speedup.idxmax()] if not kept.empty else kept
        raw, distilled = best[best.draft == BASELINE], best[best.draft != BASELINE]
        where = f"{test_set}, τ_dec={tau:g} (quality ≥ {floor:.3f})"
        if raw.empty or distilled.empty:
            lines.append(f"{where}: not enough cells at matched quality to compare raw and distilled drafts")
            continue
        top = distilled.loc[distilled.speedup.idxmax()]
        better = top.speedup > raw.speedup.iloc[0]
        lines.append(
            f"{where}: distilled draft gives the better trade-off: {'yes' if better else 'no'} — best "
            f"{top.draft} {_point(top)} speedup {top.speedup:.3f} vs un-distilled {_point(raw.iloc[0])} "
            f"speedup {raw.speedup.iloc[0]:.3f}"
        )
    return lines


def _quality_floor(rows: pd.DataFrame, ends: pd.DataFrame, test_set: str, tau: float) -> float:
    here = ends[(ends.test_set == test_set) & (ends.tau_dec == tau)] if not ends.empty else ends
    if not here.empty:
        target, ci = here.quality_target.mean(), here.quality_target_ci95.mean()
    else:
        lossless = rows[rows.epsilon == 1.0]
        target, ci = lossless.quality.mean(), lossless.quality_ci95.mean()
    return target - (0.0 if math.isnan(ci) else ci)


def _point(row: pd.Series) -> str:
    return f"({row.lenience}, ε={row.epsilon:g})" if row.epsilon < 1.0 else "(lossless)"


def section(frame: pd.DataFrame, out_dir: Path) -> list[str]:
    """The report's Markdown lines for lossy decoding; empty when the sweep has no quality-scored cells."""
    cells, ends = lossy_cells(frame), ends_frame(frame)
    if cells.empty or (cells.epsilon == 1.0).all():
        return []
    lines = ["\n## Lossy decoding: quality vs speedup\n", NOTE]
    lines += [f"- {line}" for line in verdict(cells, ends)] + [""]
    lines += [f"![{p.stem}]({p.name})" for p in curves(cells, ends, out_dir)]
    return lines + [""]
