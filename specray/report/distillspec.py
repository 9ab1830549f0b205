"""The report's DistillSpec section: KD algorithm × divergence (Zhou et al., 2023, Fig. 2/4, Table D.1).

An algorithm is a training-data source (`distill.data_sources`, DistillSpec Table 1: SupervisedKD trains on
the dataset's ground truth, SeqKD on teacher samples, ImitKD on ground truth and student samples, f-Distill
on teacher and student samples, GKD on student samples only); the divergence is `distill.divergence`. A
sweep that lists several of either has one online draft per (τ_kd, divergence, data source), tagged with
both (`specray.draft.Draft`); this section compares them at each (τ_dec, γ), where the other figures
of the report (τ_kd × τ_dec) average an online τ_kd's drafts over the two axes. It is left out when a sweep
varies neither.

Heatmaps rather than the paper's bar charts: with 5 × 4 drafts per (τ_dec, γ) a grid shows both axes at
once and keeps the un-distilled draft in the title as the reference. Verdicts use the report's paired
prompt bootstrap (`report/paired.py`), over training replicates where the sweep has them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from specray.metrics import BLOCK_EFFICIENCY_SAMPLED, SPEEDUP, SPEEDUP_MODEL
from specray.names import BASELINE
from specray.report.figures import colour_scale, plt, save_figure
from specray.report.paired import (
    PromptCells,
    Verdict,
    in_range,
    judged,
    primary,
    prompt_count,
    stacked,
    untestable,
)

# DistillSpec's names of the presets that are its algorithms (specray/config/presets.py); any other data
# source (a tempspec preset, explicit fractions) is shown under its own name
ALGORITHMS = {
    "supervised_kd": "SupervisedKD",
    "seqkd": "SeqKD",
    "imitkd": "ImitKD",
    "f_distill": "f-Distill",
    "gkd": "GKD",
}
# "model-generated data beats fixed ground truth": the algorithms whose batches hold no ground truth (λ1 = 0,
# teacher and/or student samples) against the one that holds only ground truth
GENERATED, FIXED = ("seqkd", "f_distill", "gkd"), "supervised_kd"
GKD = "gkd"
NEAR_BEST = 0.98  # "at or near the best": GKD's speedup at least this share of the best algorithm's
METRICS = {BLOCK_EFFICIENCY_SAMPLED: "block efficiency", SPEEDUP_MODEL: SPEEDUP_MODEL}

NOTE = (
    "Online drafts per KD algorithm (the training-data source, DistillSpec Table 1) and divergence, at each "
    "(τ_dec, γ): analytic block efficiency (expected tokens per target call) and modelled speedup "
    "(DistillSpec Fig. 2/4; Table D.1 below). The un-distilled draft's value is in each panel's title. "
    "Then the probe's acceptance during distillation per algorithm and divergence (Fig. 3a). "
    "Where the sweep has several τ_kd, each has its own figures. The τ_kd × τ_dec figures above average "
    "each online τ_kd over these drafts.\n"
)
VERDICT_NOTE = (
    "Paired prompt bootstrap as in the Verdicts table, on the primary test set's analytic cells at each "
    "draft's best γ, averaged over τ_dec ≤ 1 and the divergences. *model-generated data beats fixed ground "
    f"truth*: mean speedup of {', '.join(ALGORITHMS[a] for a in GENERATED)} minus that of SupervisedKD "
    f"(claimed > 0). *GKD is at or near the best*: GKD's speedup over the best algorithm's, minus "
    f"{NEAR_BEST:g} (claimed > 0: within {100 * (1 - NEAR_BEST):g}% of the best).\n"
)


def algorithm(data_source: str) -> str:
    """DistillSpec's name of a data source, or the source's own name."""
    return ALGORITHMS.get(data_source, data_source)


def grid_drafts(cells: pd.DataFrame) -> pd.DataFrame:
    """The online single-τ_kd cells that carry a divergence and a data source, with an `algorithm` column."""
    if cells.empty or "divergence" not in cells or "data_source" not in cells:
        return cells.iloc[0:0]
    rows = cells[(cells.paradigm == "online") & cells.tau_kd.notna()]
    rows = rows[rows.divergence.fillna("").astype(bool) & rows.data_source.fillna("").astype(bool)]
    return rows.assign(algorithm=rows.data_source.map(algorithm))


def varies(cells: pd.DataFrame) -> bool:
    """Whether the sweep varies the divergence or the data source (the section is shown only then)."""
    rows = grid_drafts(cells)
    return not rows.empty and (rows.divergence.nunique() > 1 or rows.data_source.nunique() > 1)


def _ordered(values: pd.Series, order: list[str]) -> list[str]:
    present = list(dict.fromkeys(values))
    return [v for v in order if v in present] + sorted(v for v in present if v not in order)


def heatmaps(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Per (test set, τ_kd, metric): one algorithm × divergence panel per (τ_dec, γ) of the analytic cells."""
    analytic = cells[cells.estimator == "analytic"]
    rows_all = grid_drafts(analytic)
    paths = []
    for (test_set, tau_kd), rows in rows_all.groupby(["test_set", "tau_kd"]):
        base = analytic[(analytic.draft == BASELINE) & (analytic.test_set == test_set)]
        for metric, label in METRICS.items():
            name = f"distillspec_{metric}_{test_set}_tau_kd={tau_kd:g}.png"
            fig = _figure(rows, base, metric, f"{label}, {test_set} test, τ_kd {tau_kd:g}")
            paths.append(save_figure(fig, out_dir / name))
    return paths


def _figure(rows: pd.DataFrame, base: pd.DataFrame, metric: str, title: str) -> plt.Figure:
    taus, gammas = sorted(rows.tau_dec.unique()), sorted(rows.gamma.unique())
    algorithms = _ordered(rows.algorithm, list(ALGORITHMS.values()))
    divergences = _ordered(rows.divergence, ["fkl", "rkl", "jsd", "tvd"])
    fig, axes = plt.subplots(
        len(taus), len(gammas), figsize=(3.2 * len(gammas) + 1, 2.6 * len(taus) + 0.6), squeeze=False
    )
    for (i, tau), (j, gamma) in ((a, b) for a in enumerate(taus) for b in enumerate(gammas)):
        here = rows[np.isclose(rows.tau_dec, tau) & (rows.gamma == gamma)]
        table = here.pivot_table(index="algorithm", columns="divergence", values=metric)
        table = table.reindex(index=algorithms, columns=divergences)
        reference = base[np.isclose(base.tau_dec, tau) & (base.gamma == gamma)][metric]
        ax = axes[i][j]
        values = table.to_numpy(dtype=float)
        scale = (
            colour_scale(values, centred=metric in (SPEEDUP, SPEEDUP_MODEL))
            if np.isfinite(values).any()
            else None
        )
        if scale is not None:  # an all-nan panel stays blank
            ax.imshow(values, aspect="auto", cmap=scale.cmap, norm=scale.norm)
        ax.set_xticks(range(len(divergences)), divergences)
        ax.set_yticks(range(len(algorithms)), algorithms if j == 0 else [""] * len(algorithms))
        none = f"; none {reference.mean():.2f}" if not reference.empty else ""
        ax.set_title(f"τ_dec {tau:g}, γ {gamma}{none}", fontsize=8)
        for (r, c), value in np.ndenumerate(values):
            if scale is not None and np.isfinite(value):
                ax.text(c, r, f"{value:.2f}", ha="center", va="center", fontsize=7, color=scale.text(value))
    fig.suptitle(title)
    return fig


def acceptance_over_steps(curves: pd.DataFrame, out_dir: Path, tau_dec: float = 1.0) -> list[Path]:
    """DistillSpec Fig. 3a: the probe's acceptance during distillation (at the probed τ_dec nearest
    `tau_dec`), one line per algorithm, one panel per divergence, per τ_kd. `curves`: `figures.curve_frame`'s
    rows of replicate 0."""
    rows = grid_drafts(curves)
    if rows.empty:
        return []
    nearest = min(rows.tau_dec.unique(), key=lambda t: abs(t - tau_dec))
    rows = rows[rows.tau_dec == nearest]
    paths = []
    for tau_kd, group in rows.groupby("tau_kd"):
        divergences = _ordered(group.divergence, ["fkl", "rkl", "jsd", "tvd"])
        fig, axes = plt.subplots(1, len(divergences), figsize=(4 * len(divergences), 3.5), squeeze=False)
        for ax, divergence in zip(axes[0], divergences, strict=True):
            here = group[group.divergence == divergence]
            for name in _ordered(here.algorithm, list(ALGORITHMS.values())):
                run = here[here.algorithm == name].sort_values("step")
                ax.plot(run.step, run.acceptance_rate, marker=".", label=name)
            ax.set_title(divergence)
            ax.set_xlabel("KD step")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(f"acceptance_rate at τ_dec={nearest:g}")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"acceptance over KD steps per algorithm, τ_kd {tau_kd:g} (DistillSpec Fig. 3a)")
        paths.append(save_figure(fig, out_dir / f"distillspec_kd_steps_tau_kd={tau_kd:g}.png"))
    return paths


def table_d1(cells: pd.DataFrame) -> pd.DataFrame:
    """Table D.1: per (test set, τ_kd, τ_dec, γ, algorithm, divergence) the analytic block efficiency and
    speedup_model, the measured wall-time speedup where an empirical cell exists, the un-distilled draft
    first in each (test set, τ_dec, γ)."""
    keys = ["test_set", "tau_dec", "gamma"]
    analytic = cells[cells.estimator == "analytic"]
    drafts = grid_drafts(analytic)
    base = analytic[analytic.draft == BASELINE].assign(
        algorithm="(un-distilled)", divergence="-", tau_kd=np.nan
    )
    columns = [*keys, "tau_kd", "algorithm", "divergence", *METRICS]
    table = pd.concat([base, drafts])[columns]
    empirical = cells[cells.estimator == "empirical"]
    if "batch_size" in empirical:  # batch-1 decoding, as the paper measures
        empirical = empirical[empirical.batch_size.fillna(1) == 1]
    if not empirical.empty and SPEEDUP in empirical:
        measured = empirical.groupby(["draft", *keys]).speedup.mean().rename("speedup (measured)")
        names = pd.concat([base, drafts]).draft
        table = table.assign(draft=names.to_numpy()).merge(
            measured.reset_index(), on=["draft", *keys], how="left"
        )
        table = table.drop(columns="draft")
    return table.sort_values([*keys, "tau_kd"], na_position="first").reset_index(drop=True)


# ---------------------------------------------------------------- verdicts

GENERATED_BEATS_FIXED = "model-generated data beats fixed ground truth"
GKD_NEAR_BEST = "GKD is at or near the best"


def verdicts(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """The two claims on the primary test set, averaged over τ_dec ≤ 1 and the divergences."""
    definition_generated = "mean S(SeqKD, f-Distill, GKD) − S(SupervisedKD), over τ_dec ≤ 1 and divergences"
    definition_gkd = f"S(GKD) / max S(algorithm) − {NEAR_BEST:g}, over τ_dec ≤ 1 and divergences"
    if not tables:
        return [
            untestable(GENERATED_BEATS_FIXED, "-", definition_generated, "no per-prompt analytic cells"),
            untestable(GKD_NEAR_BEST, "-", definition_gkd, "no per-prompt analytic cells"),
        ]
    test_set = primary(tables)
    table = tables[test_set]
    grid = grid_drafts(table.cells)
    taus, size = in_range(table), {test_set: prompt_count(table)}
    divergences = sorted(grid.divergence.unique()) if not grid.empty else []

    def rows(sources: tuple[str, ...], divergence: str, tau: float) -> list[int]:
        hit = grid[grid.data_source.isin(sources) & (grid.divergence == divergence)]
        return [i for i in hit.index if np.isclose(table.cells.tau_dec[i], tau)]

    def mean_speedup(found: list[int], index: np.ndarray) -> np.ndarray:
        return stacked([table.speedup(r, index) for r in found]).mean(axis=0)

    pairs = [(d, t) for d in divergences for t in taus]
    result = []
    if all(rows(GENERATED, d, t) and rows((FIXED,), d, t) for d, t in pairs) and pairs:

        def generated(index: Mapping[str, np.ndarray]) -> np.ndarray:
            i = index[test_set]
            gaps = [
                mean_speedup(rows(GENERATED, d, t), i) - mean_speedup(rows((FIXED,), d, t), i)
                for d, t in pairs
            ]
            return np.mean(gaps, axis=0)

        result.append(judged(GENERATED_BEATS_FIXED, test_set, definition_generated, +1, generated, size))
    else:
        missing = "needs SupervisedKD and one of SeqKD, f-Distill, GKD at every divergence"
        result.append(untestable(GENERATED_BEATS_FIXED, test_set, definition_generated, missing))
    sources = tuple(grid.data_source.unique()) if not grid.empty else ()
    if pairs and len(sources) > 1 and all(rows((GKD,), d, t) for d, t in pairs):

        def near_best(index: Mapping[str, np.ndarray]) -> np.ndarray:
            i = index[test_set]
            shares = []
            for d, t in pairs:
                best = stacked([table.speedup(r, i) for r in rows(sources, d, t)]).max(axis=0)
                shares.append(mean_speedup(rows((GKD,), d, t), i) / best)
            return np.mean(shares, axis=0) - NEAR_BEST

        result.append(judged(GKD_NEAR_BEST, test_set, definition_gkd, +1, near_best, size))
    else:
        missing = "needs GKD and another algorithm at every divergence"
        result.append(untestable(GKD_NEAR_BEST, test_set, definition_gkd, missing))
    return result
