"""The DistillSpec section's per-prompt figure (Zhou et al., 2023, Fig. 3b), the Markdown of its figures
(the per-draft Fig. 3c and 5a are drawn by `distillspec_drafts.py`) and its last three verdicts;
`report/distillspec.py` has the heatmaps, Table D.1 and the first two verdicts.

Fig. 3b compares the best grid draft with the un-distilled draft prompt by prompt at the same γ (the best
draft's best γ by `speedup_model`): block efficiency grows with γ, so each draft at its own best γ would
mix γ into the comparison. A prompt's block efficiency is its Σ tokens / Σ target calls
(`specdec.records`), averaged over training replicates.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specray.metrics import PER_PROMPT_TOKENS, SPEEDUP_MODEL
from specray.names import BASELINE
from specray.report.best import best_rows
from specray.report.distillspec import grid_drafts
from specray.report.distillspec_drafts import (
    FIG3C_NOTE,
    FIG5A_NOTE,
    estimator_pairs,
    estimator_ranking,
    gains,
    quality_vs_efficiency,
    rankings,
)
from specray.report.figures import scatter_panels
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
VERDICT_NOTE = (
    "*white-box beats SeqKD*: mean speedup of the online grid drafts minus the offline draft's at the same "
    "τ_kd (claimed > 0). *the best divergence depends on the task and decoding strategy*: positive when two "
    "(test set, τ_dec) contexts rank two divergences oppositely, each by a margin (claimed > 0; the flip is "
    "re-chosen in every resample, so the interval is honest about the search). *distillation improves block "
    "efficiency for most examples*: the share of prompts Fig. 3b's draft improves, minus 0.5 (claimed > 0).\n"
)
MOST = 0.5  # "most examples": more than half of the prompts improve


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
    return [scatter_panels(panels, axes, title, out_dir / "distillspec_per_example.png", size=12)]


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
