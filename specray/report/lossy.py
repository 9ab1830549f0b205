"""The lossy-decoding section of the report: quality–speedup trade-off curves (DistillSpec Fig. 5b).

Each empirical cell at (draft, test set, τ_dec, lenience function, ε) is one point: its speedup and the task
quality of what it decoded (`specray/quality.py`). The speedup is the cost model's (`StepCosts.speedup`)
from the block efficiency, drafts per step and tokens per decode the lossy decoder actually had, at the
sweep's measured step costs: it
depends on the decodes alone, where the wall-time ratio (kept in the table) also moves with whatever else
the machine runs. Per lenience function, each draft's points
form a curve from ε = 1 (lossless: the target's quality) towards small ε (towards the draft's own quality);
the `ends` records give the target-only and draft-only quality as the two reference lines. The verdict
compares the un-distilled draft with the distilled ones at matched quality: the best speedup among cells
whose quality is at least the target-only quality (no measured loss), per draft; the line also gives the
target quality's 95% half-width, since with few test prompts small quality losses go unseen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from specray.metrics import (
    ACCEPTANCE_RATE,
    DRAFTED_PER_STEP,
    QUALITY,
    QUALITY_CI95,
    QUALITY_DRAFT,
    QUALITY_METRIC,
    QUALITY_TARGET,
    SPEEDUP,
    TOKENS_PER_DECODE,
)
from specray.names import BASELINE
from specray.report.best import best_rows
from specray.report.figures import plt, save_figure
from specray.report.tables import markdown_table
from specray.specdec.records import StepCosts

NOTE = (
    "Lossy speculative decoding (DistillSpec Algorithm A.1) accepts a draft token y with probability "
    "min(1, f(p(y), ε) / q(y)), f ∈ {lin: p/ε, sq: p/ε², exp: p^ε}; ε = 1 is lossless. Each point is one "
    "empirical cell: its speedup (the cost model's, from its decodes' block efficiency; the wall-time "
    "ratio `speedup_wall` is in the table) and the task quality of its "
    "decoded outputs (exact match for one-answer tasks, else ROUGE-L), per lenience function; the dashed "
    "lines are the target alone and the un-distilled draft alone on the same prompts and seeds. "
    "At τ_dec = 0 lenience changes nothing (greedy verification has no ratio to relax), so only τ_dec > 0 "
    "has curves.\n"
)


def lossy_cells(frame: pd.DataFrame, costs: StepCosts | None) -> pd.DataFrame:
    """Empirical cells with a quality score, their lenience function filled in (lossless: 'lossless'), and
    `speedup` the cost model's from their counts (`speedup_wall`: the measured ratio; it stays `speedup`
    when the costs are unknown)."""
    if frame.empty or QUALITY not in frame or "epsilon" not in frame:
        return pd.DataFrame()
    rows = frame[(frame.estimator == "empirical") & frame.quality.notna()].copy()
    rows["lenience"] = rows.lenience.fillna("lossless") if "lenience" in rows else "lossless"
    rows["speedup_wall"] = rows.speedup
    if costs is not None:
        b = costs.batch_sizes[0]
        rows[SPEEDUP] = [
            costs.speedup(
                r.block_efficiency,
                int(r.gamma),
                b,
                _or_none(r, DRAFTED_PER_STEP),
                _or_none(r, TOKENS_PER_DECODE),
            )
            for r in rows.itertuples()
        ]
    return rows


def _or_none(row: Any, name: str) -> float | None:
    value = getattr(row, name, None)
    return None if value is None or pd.isna(value) else float(value)


def ends_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The `ends` records: target-only and draft-only quality per (draft, test set, τ_dec)."""
    if frame.empty or QUALITY_TARGET not in frame:
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
        paths.append(save_figure(fig, out_dir / f"lossy_tradeoff_{test_set}_tau{tau:g}.png"))
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
    ax.set_xlabel("speedup (block efficiency / (cγ + 1))")
    kind = rows[QUALITY_METRIC].iloc[0] if QUALITY_METRIC in rows else ""
    ax.set_ylabel(f"quality ({kind})")
    ax.set_title(f"lenience {function}")
    ax.legend(fontsize=7)


def table(cells: pd.DataFrame, ends: pd.DataFrame) -> pd.DataFrame:
    """Speedup and quality per (draft, test set, τ_dec, function, ε), next to the two ends."""
    if cells.empty:
        return pd.DataFrame()
    columns = ["draft", "test_set", "tau_dec", "lenience", "epsilon", ACCEPTANCE_RATE, SPEEDUP]
    columns += ["speedup_wall", QUALITY, QUALITY_CI95]
    rows = cells[columns].sort_values(columns[:5]).reset_index(drop=True)
    if not ends.empty:
        alone = ends[["draft", "test_set", "tau_dec", QUALITY_TARGET, QUALITY_DRAFT]]
        rows = rows.merge(alone, on=["draft", "test_set", "tau_dec"], how="left")
    return rows


def verdict(cells: pd.DataFrame, ends: pd.DataFrame) -> list[str]:
    """Per (test set, τ_dec): does a distilled draft give the better trade-off than the un-distilled one?

    Matched quality: cells whose quality is at least the target-only quality (the lossless cells' where
    there is no ends record); among those, each draft's best speedup."""
    lines = []
    for (test_set, tau), rows in cells[cells.tau_dec > 0].groupby(["test_set", "tau_dec"]):
        floor, ci = _quality_floor(rows, ends, test_set, tau)
        kept = rows[rows.quality >= floor - 1e-12]
        best = best_rows(kept, SPEEDUP, ("draft",), ("gamma", "lenience", "epsilon"))
        raw, distilled = best[best.draft == BASELINE], best[best.draft != BASELINE]
        where = f"{test_set}, τ_dec={tau:g} (quality ≥ target's {floor:.3f} ± {ci:.3f})"
        if raw.empty or distilled.empty:
            lines.append(f"{where}: not enough cells at matched quality to compare raw and distilled drafts")
            continue
        top = best_rows(distilled, SPEEDUP, (), ("draft",)).iloc[0]
        better = top.speedup > raw.speedup.iloc[0]
        lines.append(
            f"{where}: distilled draft gives the better trade-off: {'yes' if better else 'no'} — best "
            f"{top.draft} {_point(top)} speedup {top.speedup:.3f} vs un-distilled {_point(raw.iloc[0])} "
            f"speedup {raw.speedup.iloc[0]:.3f}"
        )
    return lines


def _quality_floor(rows: pd.DataFrame, ends: pd.DataFrame, test_set: str, tau: float) -> tuple[float, float]:
    """The target's quality and its 95% half-width at (test set, τ_dec)."""
    here = ends[(ends.test_set == test_set) & (ends.tau_dec == tau)] if not ends.empty else ends
    if not here.empty:
        return here.quality_target.mean(), here.quality_target_ci95.mean()
    lossless = rows[rows.epsilon == 1.0]
    return lossless.quality.mean(), lossless.quality_ci95.mean()


def _point(row: pd.Series) -> str:
    return f"({row.lenience}, ε={row.epsilon:g})" if row.epsilon < 1.0 else "(lossless)"


def section(frame: pd.DataFrame, out_dir: Path, costs: StepCosts | None = None) -> list[str]:
    """The report's Markdown lines for lossy decoding; empty when the sweep has no quality-scored cells.
    `costs`: the sweep's step costs (without them the speedups are the measured wall-time ratios)."""
    cells, ends = lossy_cells(frame, costs), ends_frame(frame)
    if cells.empty or (cells.epsilon == 1.0).all():
        return []
    lines = ["\n## Lossy decoding: quality vs speedup\n", NOTE]
    lines += [f"- {line}" for line in verdict(cells, ends)] + [""]
    lines += [f"![{p.stem}]({p.name})" for p in curves(cells, ends, out_dir)]
    return lines + ["", markdown_table(table(cells, ends))]
