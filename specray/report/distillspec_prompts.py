"""The DistillSpec section's per-prompt and per-draft figures (Zhou et al., 2023, Fig. 3b, 3c, 5a) and its
last three verdicts; `report/distillspec.py` has the heatmaps, Table D.1 and the first two verdicts.

Fig. 3b compares the best grid draft with the un-distilled draft prompt by prompt at the same γ (the best
draft's best γ by `speedup_model`): block efficiency grows with γ, so each draft at its own best γ would
mix γ into the comparison. A prompt's block efficiency is its Σ tokens / Σ target calls
(`specdec.records`), averaged over training replicates.

Fig. 3c ranks drafts by the two estimators at the same (test set, τ_dec, γ): the analytic
`block_efficiency_sampled` (all test prompts) against the empirical `block_efficiency` (its decoded
prompts). Spearman's ρ (`scipy.stats.spearmanr`) and its 95% percentile interval resample **drafts**
(`specray.bootstrap`'s draws, paired: a draft keeps both its estimates): the claim is about the ranking of
drafts, and the empirical cells hold no per-prompt sums to resample prompts with.

Fig. 5a: per draft, the task-quality gain of the draft decoding alone (the `ends` records, `quality_draft`)
over the un-distilled draft, against its analytic block-efficiency gain averaged over γ — DistillSpec's
point that a better model is not always a better draft.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from specray.bootstrap import bootstrap_interval
from specray.metrics import (
    BLOCK_EFFICIENCY,
    BLOCK_EFFICIENCY_SAMPLED,
    PER_PROMPT_TOKENS,
    QUALITY_DRAFT,
    SPEEDUP_MODEL,
)
from specray.names import BASELINE
from specray.report.best import best_rows
from specray.report.distillspec import grid_drafts
from specray.report.figures import plt, save_figure
from specray.report.paired import (
    PromptCells,
    Verdict,
    in_range,
    judged,
    primary,
    prompt_count,
    single_drafts,
    stacked,
    untestable,
)

FIG3B_NOTE = (
    "Fig. 3b: per test prompt, the block efficiency of the best grid draft (by speedup_model) against the "
    "un-distilled draft's at the same γ; points above the diagonal improve.\n"
)
FIG3C_NOTE = (
    "Fig. 3c: per draft, empirical vs analytic block efficiency at the same (test set, τ_dec, γ); Spearman's "
    "ρ of the two rankings with a 95% percentile bootstrap interval resampling drafts (at least four).\n"
)
FIG5A_NOTE = (
    "Fig. 5a: per draft, the task-quality gain of the draft decoding alone (quality_ends) over the "
    "un-distilled draft against its analytic block-efficiency gain (mean over γ).\n"
)
VERDICT_NOTE = (
    "*white-box beats SeqKD*: mean speedup of the online grid drafts minus the offline draft's at the same "
    "τ_kd (claimed > 0). *the best divergence depends on the task and decoding strategy*: positive when two "
    "(test set, τ_dec) contexts rank two divergences oppositely, each by a margin (claimed > 0; the flip is "
    "re-chosen in every resample, so the interval is honest about the search). *distillation improves block "
    "efficiency for most examples*: the share of prompts Fig. 3b's draft improves, minus 0.5 (claimed > 0).\n"
)
MOST = 0.5  # "most examples": more than half of the prompts improve
DIVERGENCES = ["fkl", "rkl", "jsd", "tvd"]


@dataclass(frozen=True)
class PromptPair:
    """One (test set, τ_dec): the best grid draft and the un-distilled draft at the same γ, per prompt."""

    test_set: str
    tau_dec: float
    gamma: int
    draft: str
    distilled: np.ndarray  # [prompts] block efficiency, mean over training replicates
    undistilled: np.ndarray  # [prompts]

    @property
    def improved(self) -> np.ndarray:
        return self.distilled > self.undistilled

    @property
    def share_improved(self) -> float:
        return float(self.improved.mean())


@dataclass(frozen=True)
class Ranking:
    """Fig. 3c's agreement at one (test set, τ_dec, γ): Spearman's ρ over drafts and its 95% interval."""

    test_set: str
    tau_dec: float
    gamma: int
    drafts: int
    rho: float
    low: float
    high: float

    @property
    def line(self) -> str:
        where = f"{self.test_set}, τ_dec {self.tau_dec:g}, γ {self.gamma}"
        interval = "no interval" if np.isnan(self.low) else f"95% CI [{self.low:+.2f}, {self.high:+.2f}]"
        return f"{where}: Spearman's ρ = {self.rho:+.2f} over {self.drafts} drafts ({interval})"


# ---------------------------------------------------------------- Fig. 3b


def _efficiency(rows: pd.DataFrame) -> np.ndarray:
    """Per-prompt block efficiency of a cell's replicate rows, averaged over them -> [prompts]."""
    tokens = np.array(rows.per_prompt_tokens.tolist(), dtype=float)  # [replicates, prompts]
    calls = np.array(rows.per_prompt_target_calls.tolist(), dtype=float)
    return (tokens / np.maximum(calls, 1e-12)).mean(axis=0)


def prompt_pairs(cells: pd.DataFrame) -> list[PromptPair]:
    """Per (test set, τ_dec ≤ 1): the grid draft with the best `speedup_model` (mean over replicates) and
    the un-distilled draft at its γ. `cells`: rows with per-prompt lists (`build.cells_frame(keep_lists)`)."""
    if cells.empty or PER_PROMPT_TOKENS not in cells:
        return []
    analytic = cells[(cells.estimator == "analytic") & cells.per_prompt_tokens.map(_filled)]
    analytic = analytic.assign(draft=analytic.get("recipe", analytic.draft).fillna(analytic.draft))
    grid = grid_drafts(analytic)
    pairs = []
    for (test_set, tau), rows in grid[grid.tau_dec <= 1.0 + 1e-9].groupby(["test_set", "tau_dec"]):
        top = best_rows(rows, SPEEDUP_MODEL, (), ("draft", "gamma")).iloc[0]
        draft, gamma = top.draft, top.gamma
        base = analytic[
            (analytic.draft == BASELINE)
            & (analytic.test_set == test_set)
            & np.isclose(analytic.tau_dec, tau)
            & (analytic.gamma == gamma)
        ]
        best = rows[(rows.draft == draft) & (rows.gamma == gamma)]
        if base.empty or len(base.per_prompt_tokens.iloc[0]) != len(best.per_prompt_tokens.iloc[0]):
            continue  # no reference on the same prompts
        pair = PromptPair(
            str(test_set), float(tau), int(gamma), str(draft), _efficiency(best), _efficiency(base)
        )
        pairs.append(pair)
    return pairs


def per_example(pairs: list[PromptPair], out_dir: Path) -> list[Path]:
    """DistillSpec Fig. 3b: one panel per (test set, τ_dec), a point per test prompt, the diagonal y = x."""
    if not pairs:
        return []
    panels = [
        (
            pair.undistilled,
            pair.distilled,
            f"{pair.test_set}, τ_dec {pair.tau_dec:g}, γ {pair.gamma}\n{pair.draft}: "
            f"{100 * pair.share_improved:.0f}% of prompts improve",
        )
        for pair in pairs
    ]
    axes = ("un-distilled draft: block efficiency", "distilled draft: block efficiency")
    title = "per-example block efficiency (DistillSpec Fig. 3b)"
    return [_scatter_panels(panels, axes, title, out_dir / "distillspec_per_example.png", size=12)]


def _scatter_panels(
    panels: list[tuple[Any, Any, str]], labels: tuple[str, str], title: str, path: Path, size: int
) -> Path:
    """One scatter panel per (x, y, panel title), each with the diagonal y = x."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4), squeeze=False)
    for ax, (x, y, panel) in zip(axes[0], panels, strict=True):
        ax.scatter(x, y, s=size, alpha=0.7 if size < 14 else 1.0)
        both = np.concatenate([np.asarray(x), np.asarray(y)])
        ends = [float(both.min()), float(both.max())]
        ax.plot(ends, ends, "k--", linewidth=1)
        ax.set_xlabel(labels[0])
        ax.set_ylabel(labels[1])
        ax.set_title(panel, fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path)


# ---------------------------------------------------------------- Fig. 3c


def estimator_pairs(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, test set, τ_dec, γ) measured both ways: analytic and empirical block efficiency."""
    keys = ["draft", "test_set", "tau_dec", "gamma"]
    if cells.empty or BLOCK_EFFICIENCY not in cells or BLOCK_EFFICIENCY_SAMPLED not in cells:
        return pd.DataFrame(columns=[*keys, "analytic", "empirical"])
    analytic = cells[cells.estimator == "analytic"].groupby(keys).block_efficiency_sampled.mean()
    empirical = cells[cells.estimator == "empirical"]
    if "batch_size" in empirical:  # batch-1 decoding, as the paper measures
        empirical = empirical[empirical.batch_size.fillna(1) == 1]
    measured = empirical.groupby(keys).block_efficiency.mean()
    joined = pd.concat([analytic.rename("analytic"), measured.rename("empirical")], axis=1, join="inner")
    return joined.dropna().reset_index()


def spearman(analytic: np.ndarray, empirical: np.ndarray) -> tuple[float, float, float]:
    """(ρ, low, high): Spearman's ρ and its 95% percentile bootstrap interval, resampling drafts."""

    def rho(index: np.ndarray) -> np.ndarray:  # [resamples, drafts] -> [resamples]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.array([spearmanr(analytic[i], empirical[i]).statistic for i in index], dtype=float)

    return bootstrap_interval(rho, len(analytic))


def rankings(pairs: pd.DataFrame) -> list[Ranking]:
    """ρ per (test set, τ_dec, γ) with at least four drafts (fewer leave the interval meaningless)."""
    out = []
    for (test_set, tau, gamma), rows in pairs.groupby(["test_set", "tau_dec", "gamma"]):
        if len(rows) < 4:
            continue
        rho, low, high = spearman(rows.analytic.to_numpy(), rows.empirical.to_numpy())
        out.append(Ranking(str(test_set), float(tau), int(gamma), len(rows), rho, low, high))
    return out


def estimator_ranking(pairs: pd.DataFrame, found: list[Ranking], out_dir: Path) -> list[Path]:
    """DistillSpec Fig. 3c: empirical vs analytic block efficiency, a point per draft, a panel per ρ."""
    if not found:
        return []
    panels = []
    for ranking in found:
        rows = pairs[
            (pairs.test_set == ranking.test_set)
            & np.isclose(pairs.tau_dec, ranking.tau_dec)
            & (pairs.gamma == ranking.gamma)
        ]
        panel = (
            f"{ranking.test_set}, τ_dec {ranking.tau_dec:g}, γ {ranking.gamma}\n"
            f"ρ {ranking.rho:+.2f} [{ranking.low:+.2f}, {ranking.high:+.2f}]"
        )
        panels.append((rows.analytic, rows.empirical, panel))
    axes = ("analytic block efficiency", "empirical block efficiency")
    title = "empirical vs analytic block efficiency per draft (DistillSpec Fig. 3c)"
    return [_scatter_panels(panels, axes, title, out_dir / "distillspec_estimators.png", size=14)]


# ---------------------------------------------------------------- Fig. 5a


def gains(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, test set, τ_dec): the draft-alone quality gain and the analytic block-efficiency gain
    (mean over γ) over the un-distilled draft. `cells` must keep the `ends` records."""
    keys = ["draft", "test_set", "tau_dec"]
    if cells.empty or QUALITY_DRAFT not in cells:
        return pd.DataFrame(columns=[*keys, "quality_gain", "efficiency_gain"])
    quality = cells[cells.estimator == "ends"].groupby(keys).quality_draft.mean()
    efficiency = cells[cells.estimator == "analytic"].groupby(keys).block_efficiency_sampled.mean()
    joined = pd.concat([quality, efficiency], axis=1, join="inner").dropna().reset_index()
    base = joined[joined.draft == BASELINE].drop(columns="draft")
    joined = joined[joined.draft != BASELINE].merge(base, on=["test_set", "tau_dec"], suffixes=("", "_base"))
    return joined.assign(
        quality_gain=joined.quality_draft - joined.quality_draft_base,
        efficiency_gain=joined.block_efficiency_sampled - joined.block_efficiency_sampled_base,
    )[[*keys, "quality_gain", "efficiency_gain"]]


def quality_vs_efficiency(found: pd.DataFrame, out_dir: Path) -> list[Path]:
    """DistillSpec Fig. 5a: a point per draft, a panel per (test set, τ_dec)."""
    if found.empty:
        return []
    groups = list(found.groupby(["test_set", "tau_dec"]))
    fig, axes = plt.subplots(1, len(groups), figsize=(4 * len(groups), 4), squeeze=False)
    for ax, ((test_set, tau), rows) in zip(axes[0], groups, strict=True):
        ax.scatter(rows.efficiency_gain, rows.quality_gain, s=14)
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.set_xlabel("block-efficiency gain over un-distilled")
        ax.set_ylabel("quality gain (draft alone)")
        ax.set_title(f"{test_set}, τ_dec {tau:g}", fontsize=8)
    fig.suptitle("quality gain vs block-efficiency gain per draft (DistillSpec Fig. 5a)")
    return [save_figure(fig, out_dir / "distillspec_quality_vs_efficiency.png")]


def _filled(value: object) -> bool:
    return isinstance(value, list | tuple | np.ndarray) and len(value) > 0


def figure_lines(
    frame: pd.DataFrame, means: pd.DataFrame, pairs: list[PromptPair], out_dir: Path
) -> list[str]:
    """The report's Markdown for Fig. 3b, 3c (with each ρ and its interval) and 5a. `frame`: lossless cells;
    `means`: with the `ends` records."""
    lines = ["", FIG3B_NOTE, *_images(per_example(pairs, out_dir))]
    estimates = estimator_pairs(frame)
    found = rankings(estimates)
    lines += ["", FIG3C_NOTE, *([f"- {r.line}" for r in found] or ["- no cell was measured both ways"]), ""]
    lines += _images(estimator_ranking(estimates, found, out_dir))
    return lines + ["", FIG5A_NOTE, *_images(quality_vs_efficiency(gains(means), out_dir))]


def _images(paths: list[Path]) -> list[str]:
    return [f"![{p.stem}]({p.name})" for p in paths]


# ---------------------------------------------------------------- verdicts

WHITE_BOX = "white-box beats SeqKD"
DIVERGENCE_DEPENDS = "the best divergence depends on the task and decoding strategy"
MOST_IMPROVE = "distillation improves block efficiency for most examples"


def verdicts(tables: Mapping[str, PromptCells], pairs: list[PromptPair]) -> list[Verdict]:
    """The last three DistillSpec claims (`VERDICT_NOTE`)."""
    return [white_box(tables), divergence_depends(tables), most_improve(pairs)]


def white_box(tables: Mapping[str, PromptCells]) -> Verdict:
    """Mean speedup of the online grid drafts minus the offline (SeqKD) draft's at the same τ_kd, over the
    τ_kd both have and τ_dec ≤ 1, on the primary test set."""
    definition = "mean S(online grid drafts) − S(offline SeqKD draft), same τ_kd, over τ_dec ≤ 1"
    if not tables:
        return untestable(WHITE_BOX, "-", definition, "no per-prompt analytic cells")
    test_set = primary(tables)
    table = tables[test_set]
    grid, offline = grid_drafts(table.cells), single_drafts(table, "offline")
    shared = [t for t in offline if np.isclose(grid.tau_kd, t).any()] if not grid.empty else []
    pairs = []  # (the online grid rows, the offline draft's row) per (τ_kd, τ_dec)
    for t, tau in ((t, tau) for t in shared for tau in in_range(table)):
        online = [i for i in grid.index if np.isclose(grid.tau_kd[i], t) and np.isclose(grid.tau_dec[i], tau)]
        row = table.row(offline[t], tau)
        if not online or row is None:
            return untestable(
                WHITE_BOX, test_set, definition, f"no online and offline cells at τ_dec {tau:g}"
            )
        pairs.append((online, row))
    if not pairs:
        return untestable(WHITE_BOX, test_set, definition, "needs an offline draft at a grid τ_kd")

    def gap(index: Mapping[str, np.ndarray]) -> np.ndarray:
        i = index[test_set]
        gaps = [
            stacked([table.speedup(r, i) for r in online]).mean(0) - table.speedup(row, i)
            for online, row in pairs
        ]
        return np.mean(gaps, axis=0)

    return judged(WHITE_BOX, test_set, definition, +1, gap, {test_set: prompt_count(table)})


def divergence_depends(tables: Mapping[str, PromptCells]) -> Verdict:
    """Whether two contexts (test set, τ_dec ≤ 1) rank two divergences oppositely. S_k(d): context k's
    speedup of divergence d, averaged over the algorithms. Effect: the largest, over context pairs (a, b) and
    divergence pairs (d, e), of min(S_a(d) − S_a(e), S_b(e) − S_b(d)) — positive exactly when some ranking
    flips — re-chosen in every resample, as the other verdicts' maxima are."""
    definition = "max over (context a, b; divergence d, e) of min(S_a(d) − S_a(e), S_b(e) − S_b(d))"
    contexts = [
        (name, tau, grid_drafts(table.cells))
        for name, table in sorted(tables.items())
        for tau in in_range(table)
    ]
    contexts = [(n, t, g[np.isclose(g.tau_dec, t)]) for n, t, g in contexts if not g.empty]
    divergences = sorted(set.intersection(*(set(g.divergence) for *_, g in contexts))) if contexts else []
    if len(contexts) < 2 or len(divergences) < 2:
        missing = "needs two divergences in at least two (test set, τ_dec) contexts"
        return untestable(DIVERGENCE_DEPENDS, "all test sets", definition, missing)

    def flip(index: Mapping[str, np.ndarray]) -> np.ndarray:
        scores = [
            {
                d: stacked(
                    [tables[name].speedup(r, index[name]) for r in rows.index[rows.divergence == d]]
                ).mean(0)
                for d in divergences
            }
            for name, _, rows in contexts
        ]
        candidates = [
            np.minimum(a[d] - a[e], b[e] - b[d])
            for a, b in itertools.permutations(scores, 2)
            for d, e in itertools.permutations(divergences, 2)
        ]
        return stacked(candidates).max(axis=0)

    sizes = {name: prompt_count(tables[name]) for name in {n for n, *_ in contexts}}
    return judged(DIVERGENCE_DEPENDS, "all test sets", definition, +1, flip, sizes)


def most_improve(pairs: list[PromptPair]) -> Verdict:
    """Share of (prompt, τ_dec) where the best grid draft's block efficiency beats the un-distilled draft's
    at the same γ, on the primary test set, minus one half."""
    definition = f"share of prompts the best grid draft improves (Fig. 3b), mean over τ_dec ≤ 1, − {MOST:g}"
    test_set = primary({p.test_set for p in pairs}) if pairs else "-"
    here = [p for p in pairs if p.test_set == test_set]
    if not here:
        return untestable(
            MOST_IMPROVE, test_set, definition, "no grid draft and un-distilled draft on the same prompts"
        )
    improved = np.stack([p.improved for p in here]).astype(float)  # [τ_dec, prompts]

    def share(index: Mapping[str, np.ndarray]) -> np.ndarray:
        return improved[:, index[test_set]].mean(axis=(0, -1)) - MOST

    return judged(MOST_IMPROVE, test_set, definition, +1, share, {test_set: improved.shape[1]})
