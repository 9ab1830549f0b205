"""The model garden's report (DistillSpec Fig. 6): quality against latency for every curve, each curve's
Pareto front, and how much less latency each curve needs than the raw targets for the same quality.

Latency is milliseconds per generated token at batch 1 (a point's summed wall time over its summed
tokens); quality is the mean per-prompt task quality of the same decodes. Matched quality: for a point p of
a curve's front, the cheapest raw target whose quality is at least p's gives `L_raw / L_p`; a curve's
reduction is the largest over its front points that a raw target matches (none when every raw target is
worse than all of them). Intervals resample the test prompts (one draw of prompt indices shared by every
point, so the points stay paired: `specray.bootstrap.draws`) and recompute fronts and reductions on each
resample, for their percentile intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specray.bootstrap import CONFIDENCE, draws, percentile_interval
from specray.files import write_text
from specray.report.figures import plt, save_figure  # figures sets matplotlib's Agg backend first
from specray.report.tables import markdown_table
from specray.specdec.garden_points import PointResult

# the curves in the order the plot's legend and the tables list them; "raw" is what the others beat
CURVES = {
    "raw": "Raw: each target alone",
    "distilled": "Distilled: each target distilled from the largest, alone",
    "speculative": "Speculative: raw target + raw draft",
    "speculative_kd": "Speculative, KD draft: raw target + draft distilled from it",
    "distillspec": "DistillSpec: distilled target + draft distilled from it",
    "distillspec_lossy": "DistillSpec, lossy: as DistillSpec with lenience ε < 1",
}


@dataclass(frozen=True)
class Reduction:
    """A curve's latency reduction at matched quality against the raw targets, with its interval; `point`
    and `raw` name the curve's point and the raw target it is matched with."""

    curve: str
    factor: float
    low: float
    high: float
    point: str
    raw: str


def figures(points: Sequence[PointResult], index: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(latency ms/token, quality) of every point over the prompts `index` (all prompts by default)."""
    latency, quality = [], []
    for p in points:
        seconds, tokens, q = np.asarray(p.seconds), np.asarray(p.tokens), np.asarray(p.quality, dtype=float)
        if index is not None:
            seconds, tokens, q = seconds[index], tokens[index], q[index]
        latency.append(1e3 * seconds.sum() / max(tokens.sum(), 1))
        quality.append(np.nanmean(q) if np.isfinite(q).any() else np.nan)
    return np.asarray(latency), np.asarray(quality)


def pareto_front(latency: np.ndarray, quality: np.ndarray) -> list[int]:
    """Indices of the points no other point beats on both axes (faster and at least as good), by latency."""
    order = sorted(range(len(latency)), key=lambda i: (latency[i], -quality[i]))
    front, best = [], -np.inf
    for i in order:
        if quality[i] > best:
            front.append(i)
            best = quality[i]
    return front


def matched_reduction(
    latency: np.ndarray, quality: np.ndarray, curve: Sequence[int], raw: Sequence[int]
) -> tuple[float, int, int] | None:
    """(L_raw / L_p, p, raw point) for the curve's front point with the largest reduction that some raw
    point matches (quality ≥ p's, the cheapest such raw point); None where no raw point matches any."""
    best: tuple[float, int, int] | None = None
    for p in (curve[i] for i in pareto_front(latency[list(curve)], quality[list(curve)])):
        matches = [r for r in raw if quality[r] >= quality[p]]
        if not matches:
            continue
        r = min(matches, key=lambda j: latency[j])
        factor = float(latency[r] / latency[p])
        if best is None or factor > best[0]:
            best = (factor, p, r)
    return best


def resampled_figures(points: Sequence[PointResult], seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`figures` over the bootstrap's draws of the prompts with replacement: the same draws for every point
    (the points stay paired) and for the table and the reductions of one seed."""
    return [figures(points, index) for index in draws(len(points[0].seconds), seed=seed)]


def reductions(points: Sequence[PointResult], seed: int = 0) -> list[Reduction]:
    """Each curve's latency reduction at matched quality against the raw targets, with a paired bootstrap
    interval over the prompts (a resample where no raw point matches counts as no reduction, 1×)."""
    by_curve = {c: [i for i, p in enumerate(points) if p.point.curve == c] for c in CURVES}
    raw = by_curve["raw"]
    latency, quality = figures(points)
    resampled = resampled_figures(points, seed)
    out = []
    for curve, members in by_curve.items():
        if curve == "raw" or not members or not raw:
            continue
        found = matched_reduction(latency, quality, members, raw)
        if found is None:
            continue
        factor, p, r = found
        values = []
        for lat, qual in resampled:
            again = matched_reduction(lat, qual, members, raw)
            values.append(again[0] if again is not None else 1.0)
        low, high = percentile_interval(np.asarray(values))
        out.append(Reduction(curve, factor, low, high, _name(points[p]), _name(points[r])))
    return out


def _name(result: PointResult) -> str:
    p = result.point
    name = p.model
    if p.draft is not None:
        name += f" γ={p.gamma}"
    if p.epsilon < 1.0:
        name += f" {p.function} ε={p.epsilon:g}"
    return name


def point_table(points: Sequence[PointResult], seed: int = 0) -> pd.DataFrame:
    """One row per point: curve, model, τ_dec, γ, ε, latency and quality with their bootstrap intervals,
    and for speculative points the mean tokens per target call (block efficiency)."""
    latency, quality = figures(points)
    resampled = resampled_figures(points, seed)
    lat_draws = np.stack([lat for lat, _ in resampled])
    qual_draws = np.stack([q for _, q in resampled])
    tail = 100 * (1 - CONFIDENCE) / 2
    rows = []
    for i, result in enumerate(points):
        p = result.point
        lat_lo, lat_hi = np.nanpercentile(lat_draws[:, i], [tail, 100 - tail])
        q_lo, q_hi = np.nanpercentile(qual_draws[:, i], [tail, 100 - tail])
        steps = sum(result.steps)
        rows.append(
            {
                "curve": p.curve,
                "model": p.model,
                "tau_dec": p.tau,
                "gamma": p.gamma or "",
                "epsilon": p.epsilon if p.epsilon < 1.0 else "",
                "ms/token": latency[i],
                "ms/token 95% CI": f"[{lat_lo:.3f}, {lat_hi:.3f}]",
                f"quality ({result.metric})": quality[i],
                "quality 95% CI": f"[{q_lo:.3f}, {q_hi:.3f}]",
                "tokens/step": sum(result.tokens) / steps if p.draft is not None and steps else "",
            }
        )
    return pd.DataFrame(rows)


def garden_figure(points: Sequence[PointResult], out_dir: Path, name: str = "garden_quality_latency") -> Path:
    """The quality–latency plot: every curve's points, its Pareto front as a line, models labelled."""
    latency, quality = figures(points)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for n, (curve, title) in enumerate(CURVES.items()):
        members = [i for i, p in enumerate(points) if p.point.curve == curve]
        if not members:
            continue
        color = f"C{n}"
        ax.scatter(latency[members], quality[members], color=color, label=title, s=28)
        front = [members[i] for i in pareto_front(latency[members], quality[members])]
        ax.plot(latency[front], quality[front], color=color, linewidth=1.2)
        for i in members:
            ax.annotate(
                _name(points[i]),
                (latency[i], quality[i]),
                fontsize=6,
                xytext=(3, 3),
                textcoords="offset points",
                color=color,
            )
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms per generated token, batch 1)")
    ax.set_ylabel(f"task quality ({points[0].metric})")
    ax.set_title(
        f"Model garden at τ_dec {points[0].point.tau:g}: quality against latency (lines: Pareto fronts)"
    )
    ax.legend(fontsize=7, loc="best")
    return save_figure(fig, out_dir / f"{name}.png")


def garden_section(points: Sequence[PointResult], out_dir: Path, seed: int = 0) -> str:
    """The report's "Model garden" section in Markdown: per τ_dec its plot (written under `out_dir`), its
    points and its curves' latency reductions (the curves are compared at one τ_dec at a time)."""
    lines = [
        "## Model garden (DistillSpec Fig. 6)",
        "",
        "Latency: milliseconds per generated token at batch 1, the summed wall time of a point's decodes "
        "over their tokens. Quality: the mean per-prompt task quality of the same decodes. Intervals: 95% "
        f"percentile bootstrap over the {len(points[0].seconds)} test prompts, shared by all points.",
        "",
    ]
    taus = sorted({p.point.tau for p in points})
    for tau in taus:
        at = [p for p in points if p.point.tau == tau]
        name = "garden_quality_latency" if len(taus) == 1 else f"garden_quality_latency_tau_{tau:g}"
        figure = garden_figure(at, out_dir, name)
        lines += [
            f"### τ_dec = {tau:g}",
            "",
            f"![quality against latency at τ_dec {tau:g}]({figure.name})",
            "",
        ]
        lines += [markdown_table(point_table(at, seed)), "", _reduction_lines(at, seed), ""]
    return "\n".join(lines)


def write_garden_report(name: str, points: Sequence[PointResult], folder: Path, seed: int = 0) -> Path:
    """The garden's `report.md` and its figures under `folder` (`specray garden`, and `specray report` from
    the points an MLflow parent run holds)."""
    folder.mkdir(parents=True, exist_ok=True)
    body = f"# specray model garden: {name}\n\n" + garden_section(points, folder, seed)
    report = folder / "report.md"
    write_text(report, body)
    return report


def _reduction_lines(points: Sequence[PointResult], seed: int) -> str:
    lines = [
        "Latency reduction at matched quality: for each curve, the front point with the largest reduction "
        "against the cheapest raw target at least as good (a curve is missing when every raw target is "
        "worse than all its points).",
        "",
    ]
    found = reductions(points, seed)
    if not found:
        return "\n".join([*lines, "No curve has a point that a raw target matches in quality."])
    frame = pd.DataFrame(
        [
            {
                "curve": r.curve,
                "point": r.point,
                "matched raw target": r.raw,
                "reduction": r.factor,
                "95% CI": f"[{r.low:.2f}, {r.high:.2f}]",
            }
            for r in found
        ]
    )
    return "\n".join([*lines, markdown_table(frame, "{:.2f}")])
