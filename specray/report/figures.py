"""The paper's figures, drawn from a sweep's cell records with matplotlib (Agg: no display needed).

`cells` is a DataFrame with one row per (draft, test set, τ_dec, estimator) and columns draft, paradigm,
tau_kd, test_set, tau_dec, estimator and the metrics; `curves` has draft, paradigm, tau_kd, step and the
reported metrics of training.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

BASELINE = "non-distill"


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
        for ax, paradigm in zip(axes[0], paradigms, strict=False):
            _heatmap_panel(ax, rows, paradigm, metric)
        fig.suptitle(f"{metric} ({test_set} test)")
        paths.append(_save(fig, out_dir / f"heatmap_{metric}_{test_set}.png"))
    return paths


def _heatmap_panel(ax: plt.Axes, rows: pd.DataFrame, paradigm: str, metric: str) -> None:
    single = rows[(rows.paradigm == paradigm) & rows.tau_kd.notna()]
    grid = single.pivot_table(index="tau_kd", columns="tau_dec", values=metric)
    baseline = rows[rows.draft == BASELINE].pivot_table(index="draft", columns="tau_dec", values=metric)
    table = pd.concat([baseline.rename(index={BASELINE: "none"}), grid]) if not baseline.empty else grid
    image = ax.imshow(table.values, aspect="auto", cmap="viridis")
    ax.set_xticks(range(table.shape[1]), [f"{t:g}" for t in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) if isinstance(i, str) else f"{i:g}" for i in table.index])
    ax.set_xlabel("τ_dec (decoding)")
    ax.set_ylabel("τ_kd (KD data)")
    ax.set_title(paradigm)
    middle = np.nanmean([np.nanmin(table.values), np.nanmax(table.values)])
    for (i, j), value in np.ndenumerate(table.values):
        if np.isfinite(value):  # dark text on the bright end of viridis, light text on the dark end
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    plt.colorbar(image, ax=ax, fraction=0.046)


def peak_speedup(cells: pd.DataFrame, out_dir: Path, metric: str = "speedup_model") -> list[Path]:
    """Best τ_kd's value per τ_dec, offline vs online vs the un-distilled draft (paper Fig. 3)."""
    analytic = cells[cells.estimator == "analytic"]
    paths = []
    for test_set, rows in analytic.groupby("test_set"):
        fig, ax = plt.subplots(figsize=(6, 4))
        for paradigm, group in rows.groupby("paradigm"):
            best = group.groupby("tau_dec")[metric].max()
            ax.plot(best.index, best.values, marker="o", label=paradigm)
        ax.set_xlabel("τ_dec")
        ax.set_ylabel(f"peak {metric} over τ_kd")
        ax.set_title(f"peak {metric} per τ_dec ({test_set})")
        ax.legend()
        ax.grid(alpha=0.3)
        paths.append(_save(fig, out_dir / f"peak_{metric}_{test_set}.png"))
    return paths


def acceptance_vs_steps(curves: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Analytic acceptance during distillation, at τ_dec = τ_kd where the grid has it (paper Fig. 6)."""
    if curves.empty:
        return []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for ax, (paradigm, group) in zip(axes[0], curves.groupby("paradigm"), strict=False):
        for tau_kd, run in group.groupby("tau_kd"):
            column = f"acceptance_rate/tau_dec={tau_kd:g}"
            if column in run and run[column].notna().any():
                ax.plot(run.step, run[column], marker=".", label=f"τ_kd=τ_dec={tau_kd:g}")
        ax.set_xlabel("KD step")
        ax.set_ylabel("acceptance_rate (validation)")
        ax.set_title(paradigm)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    return [_save(fig, out_dir / "acceptance_vs_steps.png")]


def length_distribution(lengths: dict[str, dict[float, list[int]]], out_dir: Path) -> list[Path]:
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
    return [_save(fig, out_dir / "output_lengths.png")]


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
    return [_save(fig, out_dir / "analytic_vs_empirical.png")]


def paired_estimates(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per empirical cell with its analytic twin on the same prompts: analytic, analytic_ci95,
    empirical, empirical_ci95, and whether they agree within the combined 95% interval."""
    keys = ["draft", "test_set", "tau_dec", "gamma"]
    columns = ["empirical_prompts_acceptance_rate", "empirical_prompts_acceptance_rate_ci95"]
    analytic = cells[cells.estimator == "analytic"]
    if analytic.empty or not set(columns) <= set(analytic) or "gamma" not in cells:
        return pd.DataFrame()
    analytic = analytic.set_index(keys)[columns]
    analytic.columns = ["analytic", "analytic_ci95"]
    empirical = cells[cells.estimator == "empirical"].set_index(keys)[
        ["acceptance_rate", "acceptance_rate_ci95"]
    ]
    joined = empirical.join(analytic, how="inner")
    joined = joined.rename(columns={"acceptance_rate": "empirical", "acceptance_rate_ci95": "empirical_ci95"})
    combined = np.sqrt(joined.analytic_ci95**2 + joined.empirical_ci95**2)
    joined["difference"] = joined.empirical - joined.analytic
    joined["agree"] = np.where(joined.difference.abs() <= combined, "yes", "no")
    return joined
