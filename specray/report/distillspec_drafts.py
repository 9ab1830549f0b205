"""The DistillSpec section's per-draft figures (Zhou et al., 2023, Fig. 3c, 5a); the per-prompt figure,
the Markdown that places them and the last three verdicts are `distillspec_prompts.py`'s.

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

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specray.bootstrap import bootstrap_interval
from specray.metrics import BLOCK_EFFICIENCY, BLOCK_EFFICIENCY_SAMPLED, QUALITY_DRAFT
from specray.names import BASELINE
from specray.report.figures import plt, save_figure, scatter_panels

FIG3C_NOTE = (
    "Fig. 3c: per draft, empirical vs analytic block efficiency at the same (test set, τ_dec, γ); Spearman's "
    "ρ of the two rankings with a 95% percentile bootstrap interval resampling drafts (at least four).\n"
)
FIG5A_NOTE = (
    "Fig. 5a: per draft, the task-quality gain of the draft decoding alone (quality_ends) over the "
    "un-distilled draft against its analytic block-efficiency gain (mean over γ).\n"
)


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
    # scipy.stats here, not at the top: it costs about half a second of imports, and every `specray run`
    # imports this module for its report, which has this section only for a grid of drafts
    from scipy.stats import spearmanr

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
    return [scatter_panels(panels, axes, title, out_dir / "distillspec_estimators.png", size=14)]


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
