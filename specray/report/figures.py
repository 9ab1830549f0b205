"""The paper's figures, drawn from a sweep's cell records with matplotlib (Agg: no display needed).

`cells` is a DataFrame with one row per (draft, test set, τ_dec, estimator) and columns draft, paradigm,
tau_kd, test_set, tau_dec, estimator and the metrics; `curves` is `curve_frame`'s: one row per (draft,
KD step, probed τ_dec).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402

from specray.distill.curves import CurvePoint  # noqa: E402
from specray.draft import Draft, mixture_tag  # noqa: E402
from specray.metrics import (
    ACCEPTANCE_RATE,
    ACCEPTANCE_RATE_CI95,
    EMPIRICAL_PROMPTS_ACCEPTANCE_RATE,
    EMPIRICAL_PROMPTS_ACCEPTANCE_RATE_CI95,
    PER_PROMPT_BETA_SUM,
    PER_PROMPT_TOKENS,
    SPEEDUP,
    SPEEDUP_MODEL,
)
from specray.names import BASELINE  # noqa: E402

CURVE_COLUMNS = ("draft", "step", "tau_dec", ACCEPTANCE_RATE, PER_PROMPT_TOKENS, PER_PROMPT_BETA_SUM)


# where a draft goes in the figures (`draft_columns`), by its name in `draft`
DRAFT_COLUMNS = ("draft", "paradigm", "tau_kd", "mixture", "divergence", "data_source", "recipe", "replicate")


def draft_columns(draft: Draft) -> dict[str, Any]:
    """A draft's place in the figures: its paradigm (None for the un-distilled draft), its single τ_kd (None
    for mixtures and the un-distilled draft), its mixture as a tag, divergence and data source ("" where
    its sweep does not vary them), and the recipe its training replicates are averaged under."""
    return {
        "paradigm": draft.paradigm,
        "tau_kd": draft.tau_kd,
        "mixture": mixture_tag(draft.mixture),
        "divergence": draft.divergence,
        "data_source": draft.data_source,
        "recipe": draft.recipe,
        "replicate": draft.replicate,
    }


def curve_frame(curves: Mapping[str, Sequence[CurvePoint]], drafts: Sequence[Draft]) -> pd.DataFrame:
    """The probe's acceptance during distillation, one row per (draft, KD step, probed τ_dec): where the
    draft goes (`draft_columns`), step, tau_dec, acceptance_rate and the per-prompt lists it pools (None
    where the point has none)."""
    placed = {d.name: draft_columns(d) for d in drafts}
    rows = []
    for name, points in curves.items():
        for point in points:
            for tau_dec, alpha in point.acceptance.items():
                sums = point.per_prompt.get(tau_dec)
                rows.append(
                    {**placed.get(name, {}), "draft": name, "step": point.step, "tau_dec": tau_dec}
                    | {ACCEPTANCE_RATE: alpha}
                    | {PER_PROMPT_TOKENS: list(sums.tokens) if sums else None}
                    | {PER_PROMPT_BETA_SUM: list(sums.beta_sums) if sums else None}
                )
    return pd.DataFrame(rows, columns=None if rows else list(CURVE_COLUMNS))


def save_figure(fig: plt.Figure, path: Path) -> Path:
    """Write `fig` to `path` as PNG and close it (pyplot keeps every open figure alive)."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def scatter_panels(
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


def heatmaps(cells: pd.DataFrame, metric: str, out_dir: Path) -> list[Path]:
    """τ_kd × τ_dec heatmaps of `metric` (analytic), one panel per paradigm, one figure per test set
    (paper Fig. 2 in-domain, Fig. 4 out-of-domain). The un-distilled draft is the top row."""
    analytic = cells[cells.estimator == "analytic"]
    paths = []
    for test_set, rows in analytic.groupby("test_set"):
        paradigms = sorted(p for p in rows.paradigm.dropna().unique() if p != BASELINE)
        fig, axes = plt.subplots(
            1, max(1, len(paradigms)), figsize=(5.5 * max(1, len(paradigms)), 5), squeeze=False
        )
        scale = colour_scale(rows[metric].to_numpy(dtype=float), centred=metric.startswith(SPEEDUP))
        for ax, paradigm in zip(axes[0], paradigms, strict=False):  # one scale: panels compare
            _heatmap_panel(ax, rows, paradigm, metric, scale)
        fig.suptitle(f"{metric} ({test_set} test)")
        paths.append(save_figure(fig, out_dir / f"heatmap_{metric}_{test_set}.png"))
    return paths


def _heatmap_panel(ax: plt.Axes, rows: pd.DataFrame, paradigm: str, metric: str, scale: ColourScale) -> None:
    single = rows[(rows.paradigm == paradigm) & rows.tau_kd.notna()]
    grid = single.pivot_table(index="tau_kd", columns="tau_dec", values=metric)
    baseline = rows[rows.draft == BASELINE].pivot_table(index="draft", columns="tau_dec", values=metric)
    table = pd.concat([baseline.rename(index={BASELINE: "none"}), grid]) if not baseline.empty else grid
    image = ax.imshow(table.values, aspect="auto", cmap=scale.cmap, norm=scale.norm)
    ax.set_xticks(range(table.shape[1]), [f"{t:g}" for t in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) if isinstance(i, str) else f"{i:g}" for i in table.index])
    ax.set_xlabel("τ_dec (decoding)")
    ax.set_ylabel("τ_kd (KD data)")
    ax.set_title(paradigm)
    for (i, j), value in np.ndenumerate(table.values):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=scale.text(value))
    plt.colorbar(image, ax=ax, fraction=0.046)


@dataclass(frozen=True)
class ColourScale:
    """A heatmap's colours and the text colour that stays readable on each cell."""

    cmap: str
    norm: Normalize

    def text(self, value: float) -> str:
        shade = float(self.norm(value))
        if self.cmap == BREAK_EVEN_CMAP:  # diverging: dark at both ends, pale at break-even
            return "white" if abs(shade - 0.5) > 0.3 else "black"
        return "black" if shade > 0.5 else "white"  # viridis: bright at the top, dark at the bottom


BREAK_EVEN_CMAP = "RdBu"  # red: slower than the target alone; white: break-even; blue: faster


def colour_scale(values: np.ndarray, centred: bool) -> ColourScale:
    """A speedup's scale is diverging and centred at 1.0, symmetric around it, so break-even is white at a
    glance and 0.99 and 1.01 get opposite hues (viridis coloured them alike and gave slowdowns no colour of
    their own); other metrics keep viridis over their range."""
    low, high = float(np.nanmin(values)), float(np.nanmax(values))
    if not centred:
        return ColourScale("viridis", Normalize(low, high))
    span = max(abs(high - 1.0), abs(1.0 - low), 0.01)
    return ColourScale(BREAK_EVEN_CMAP, Normalize(1.0 - span, 1.0 + span))


def peak_speedup(cells: pd.DataFrame, out_dir: Path, metric: str = SPEEDUP_MODEL) -> list[Path]:
    """Best τ_kd's value per τ_dec, offline vs online vs the un-distilled draft, and on a second axis the
    relative gain of online over offline, online / offline − 1 (paper Fig. 3)."""
    analytic = cells[cells.estimator == "analytic"]
    paths = []
    for test_set, rows in analytic.groupby("test_set"):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        best = rows.groupby(["paradigm", "tau_dec"])[metric].max().unstack("paradigm")
        for paradigm in best.columns:
            ax.plot(best.index, best[paradigm], marker="o", label=paradigm)
        ax.set_xlabel("τ_dec")
        ax.set_ylabel(f"peak {metric} over τ_kd")
        ax.set_title(f"peak {metric} per τ_dec ({test_set})")
        ax.grid(alpha=0.3)
        handles = ax.get_lines()
        if {"online", "offline"} <= set(best.columns):
            relative = ax.twinx()
            gain = 100 * (best["online"] / best["offline"] - 1)
            relative.plot(gain.index, gain.values, "k--", marker="x", label="online / offline − 1 (right)")
            relative.axhline(0, color="grey", linewidth=0.5)
            relative.set_ylabel("online vs offline (%)")
            handles = [*handles, relative.get_lines()[0]]
        ax.legend(handles=handles, fontsize=7, loc="best", framealpha=0.8)
        paths.append(save_figure(fig, out_dir / f"peak_{metric}_{test_set}.png"))
    return paths


def nearest_tau_kd(cells: pd.DataFrame, paradigm: str, tau_kd: float) -> float | None:
    """The grid τ_kd of a paradigm's single-τ_kd drafts nearest to `tau_kd` (None if it has none)."""
    grid = cells[(cells.paradigm == paradigm) & cells.tau_kd.notna()].tau_kd.unique()
    return float(grid[np.abs(grid - tau_kd).argmin()]) if len(grid) else None


def against_tau_dec(cells: pd.DataFrame, out_dir: Path, tau_kd: float = 0.2) -> list[Path]:
    """Modelled speedup and acceptance vs τ_dec of the un-distilled draft and each paradigm's draft at the
    grid τ_kd nearest `tau_kd`, on the in-domain test set where there is one (paper Fig. 1)."""
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty:
        return []
    test_set = "in_domain" if (analytic.test_set == "in_domain").any() else analytic.test_set.iloc[0]
    rows = analytic[analytic.test_set == test_set]
    lines = {"un-distilled": rows[rows.draft == BASELINE]}
    for paradigm in sorted(p for p in rows.paradigm.dropna().unique() if p != BASELINE):
        near = nearest_tau_kd(rows, paradigm, tau_kd)
        if near is not None:
            lines[f"{paradigm}, τ_kd={near:g}"] = rows[(rows.paradigm == paradigm) & (rows.tau_kd == near)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, (SPEEDUP_MODEL, ACCEPTANCE_RATE), strict=True):
        for label, line in lines.items():
            line = line.sort_values("tau_dec")
            ax.plot(line.tau_dec, line[metric], marker="o", label=label)
        ax.set_xlabel("τ_dec")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"speedup and acceptance vs decoding temperature ({test_set})")
    return [save_figure(fig, out_dir / "fig1_against_tau_dec.png")]


def kd_step_curves(curves: pd.DataFrame, out_dir: Path, tau_dec: float = 1.0) -> list[Path]:
    """Acceptance during distillation at one τ_dec (1.0, or the probed τ_dec nearest it) of the τ_kd = 0
    and τ_kd = 1 drafts, one panel per paradigm (paper Fig. 6). `curves`: `curve_frame`'s."""
    if curves.empty or "tau_kd" not in curves:
        return []
    nearest = min(curves.tau_dec.unique(), key=lambda t: abs(t - tau_dec))
    at_tau = curves[curves.tau_dec == nearest]
    paradigms = sorted(curves.paradigm.dropna().unique())
    fig, axes = plt.subplots(1, len(paradigms), figsize=(5.5 * len(paradigms), 4), squeeze=False)
    for ax, paradigm in zip(axes[0], paradigms, strict=True):
        group = at_tau[at_tau.paradigm == paradigm]
        for tau_kd in (0.0, 1.0):
            run = group[np.isclose(group.tau_kd.astype(float), tau_kd)].sort_values("step")
            run = run[run.draft == run.draft.iloc[0]] if not run.empty else run  # one of a τ_kd's drafts
            if not run.empty and run.acceptance_rate.notna().any():
                ax.plot(run.step, run.acceptance_rate, marker=".", label=f"τ_kd={tau_kd:g}")
        ax.set_xlabel("KD step")
        ax.set_ylabel(f"acceptance_rate at τ_dec={nearest:g} (validation)")
        ax.set_title(paradigm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return [save_figure(fig, out_dir / "fig6_kd_steps.png")]


def acceptance_vs_steps(curves: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Analytic acceptance during distillation, at τ_dec = τ_kd where the grid has it (paper Fig. 6).
    `curves`: `curve_frame`'s."""
    if curves.empty:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, (paradigm, group) in zip(axes[0], curves.groupby("paradigm"), strict=False):
        for tau_kd, run in group.groupby("tau_kd"):
            diagonal = run[np.isclose(run.tau_dec, tau_kd)].sort_values("step")
            if diagonal.acceptance_rate.notna().any():
                ax.plot(diagonal.step, diagonal.acceptance_rate, marker=".", label=f"τ_kd=τ_dec={tau_kd:g}")
        ax.set_xlabel("KD step")
        ax.set_ylabel("acceptance_rate (validation)")
        ax.set_title(paradigm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return [save_figure(fig, out_dir / "acceptance_vs_steps.png")]


def length_distribution(lengths: Mapping[str, Mapping[float, list[int]]], out_dir: Path) -> list[Path]:
    """Token lengths of the target's test outputs per τ_dec (paper Fig. 5)."""
    if not lengths:
        return []
    fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4), squeeze=False)
    for ax, (test_set, by_tau) in zip(axes[0], sorted(lengths.items()), strict=True):
        taus = sorted(by_tau)
        ax.boxplot([by_tau[t] for t in taus], tick_labels=[f"{t:g}" for t in taus])
        ax.set_xlabel("τ_dec")
        ax.set_ylabel("response tokens")
        ax.set_title(f"target output length ({test_set})")
    return [save_figure(fig, out_dir / "output_lengths.png")]


def token_length_distribution(counts: dict[str, dict[int, int]], out_dir: Path) -> list[Path]:
    """Share of generated tokens by length in characters, one bar group per test set, with the total
    tokens generated on each (paper Fig. 5). `counts`: test set -> characters -> tokens."""
    if not counts:
        return []
    sizes = np.arange(max(k for by in counts.values() for k in by) + 1)
    bar = 0.8 / len(counts)  # side by side: test set j is shifted by (j − (n − 1) / 2) bars
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, (test_set, by) in enumerate(sorted(counts.items())):
        total = sum(by.values())
        share = np.array([by.get(int(k), 0) for k in sizes]) / max(total, 1)
        shift = (j - (len(counts) - 1) / 2) * bar
        ax.bar(sizes + shift, share, width=bar, label=f"{test_set} ({total:,} tokens generated)")
    ax.set_xticks(sizes)
    ax.set_xlabel("token length (characters)")
    ax.set_ylabel("share of generated tokens")
    ax.set_title("token lengths of the target's test outputs")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    return [save_figure(fig, out_dir / "fig5_token_lengths.png")]


def agreement(cells: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Analytic vs empirical acceptance_rate on the cells measured both ways, with 95% intervals."""
    both = paired_estimates(cells)
    if both.empty:
        return []
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.errorbar(
        both.analytic, both.empirical, xerr=both.analytic_ci95, yerr=both.empirical_ci95, fmt="o", alpha=0.7
    )
    ax.plot([0, 1], [0, 1], "k--", linewidth=1)
    ax.set_xlabel("analytic acceptance_rate, same prompts (±95%)")
    ax.set_ylabel("empirical acceptance_rate (±95%)")
    ax.set_title("estimator agreement")
    return [save_figure(fig, out_dir / "analytic_vs_empirical.png")]


def paired_estimates(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per empirical cell with its analytic twin on the same prompts: analytic, analytic_ci95,
    empirical, empirical_ci95, and whether they agree within the combined 95% interval."""
    keys = ["draft", "test_set", "tau_dec", "gamma"]
    columns = [EMPIRICAL_PROMPTS_ACCEPTANCE_RATE, EMPIRICAL_PROMPTS_ACCEPTANCE_RATE_CI95]
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty or not set(columns) <= set(analytic) or "gamma" not in cells:
        return pd.DataFrame()
    analytic = analytic.set_index(keys)[columns]
    analytic.columns = ["analytic", "analytic_ci95"]
    empirical = cells[cells.estimator == "empirical"].set_index(keys)[[ACCEPTANCE_RATE, ACCEPTANCE_RATE_CI95]]
    joined = empirical.join(analytic, how="inner")
    joined = joined.rename(columns={ACCEPTANCE_RATE: "empirical", ACCEPTANCE_RATE_CI95: "empirical_ci95"})
    combined = np.sqrt(joined.analytic_ci95**2 + joined.empirical_ci95**2)
    joined["difference"] = joined.empirical - joined.analytic
    joined["agree"] = np.where(joined.difference.abs() <= combined, "yes", "no")
    return joined
