"""Table 3 at the budget drafts are served at, and whether the search's short budget ranks recipes as the
full budget does. Pure: frames in, frames and Markdown out.

Table 3's intervals. Each row (test set, τ_dec) gives, per contender (the manual recipe, the tuned mixture),
the gain S(contender) / S(best single τ_kd) − 1 with its 95% interval over training replicates and test
prompts (`bootstrap.replicated_interval`, two levels) and how many replicates show a gain on their own.
Each row's figures are the composition verdict (`composition.composition_gains`) of that row alone: one
bootstrap, one rule, whether the sweep report judges the highest τ_dec or Table 3 lists every one.

Rank agreement. Every recipe retrained at the full budget (every single τ_kd of the grid, the manual
recipes, the winner) has a validation objective at the search budget (one training) and one at the full
budget (the mean over its replicates). Spearman's ρ between the two, with its 95% percentile interval
resampling recipes (`distillspec_drafts.spearman`, the same estimator as Fig. 3c's). The search picks its
winner on the short budget; ρ says whether that order survives to the budget the drafts are served at. It is
called weak when ρ is below 0.5 or its interval reaches 0: then the short budget's winner need not be the
best recipe at the full budget, and Table 3 says so beside itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specray.metrics import SPEEDUP
from specray.report.composition import CONTENDERS, Composition, composition_gains, control_verdict
from specray.report.distillspec_drafts import spearman
from specray.report.paired import Verdict, prompt_cells
from specray.report.tables import markdown_table

WEAK_RHO = 0.5
RANK_COLUMNS = ("recipe", "role", "search objective", "full objective", "replicates")  # role: single,
# manual or tuned
MIN_RECIPES = 4  # fewer leave a resampled ρ mostly undefined (ties, constant resamples)


def gain_intervals(composition: Composition) -> pd.DataFrame:
    """`composition.table3` with, per contender, its gain's 95% interval (`<label> gain 95% CI`), the
    replicates that agree (`<label> replicates agree`) and the verdict against the paper's 12–20%."""
    rows, tables = [], prompt_cells(composition.cells)
    for _, row in composition.table3.iterrows():
        one = replace(composition, table3=pd.DataFrame([row]))
        verdicts = composition_gains(one)  # one per contender, in CONTENDERS' order
        extra: dict[str, object] = {}
        for (label, _), verdict in zip(CONTENDERS.items(), verdicts, strict=True):
            extra |= _interval_columns(label.split()[0], verdict)
            if isinstance(row.get(f"{label.split()[0]} control draft"), str):  # `tune.controls`
                versus = control_verdict(tables, row.to_dict(), label, "")
                extra |= _interval_columns(f"{label.split()[0]} vs control", versus)
        rows.append(row.to_dict() | extra)
    return pd.DataFrame(rows)


def _interval_columns(who: str, verdict: Verdict) -> dict[str, object]:
    """`who`: a contender (its gain over the best single τ_kd) or `<contender> vs control`."""
    gain = who if who.endswith("control") else f"{who} gain"
    return {
        f"{gain} low": verdict.low,
        f"{gain} high": verdict.high,
        f"{who} replicates agree": verdict.agreeing or "-",
        f"{who} verdict": verdict.verdict,
    }


def _gain(value: float, low: float, high: float) -> str:
    if np.isnan(low):
        return f"{value:+.1%} (no interval)"
    return f"{value:+.1%} [{low:+.1%}, {high:+.1%}]"


def table3_frame(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3 as the reports show it: each contender's α and speedup, and each gain with its 95% interval
    over training and prompts and the replicates that agree (columns of `gain_intervals`)."""
    if table.empty:
        return table
    shown = []
    for r in table.to_dict("records"):
        row = {
            "test set": r["test_set"],
            "τ_dec": f"{r['tau_dec']:g}",
            "best single τ_kd": r["single tau_kd"],
            SPEEDUP: f"{r['single speedup_model']:.3f}",
            "manual recipe": r["manual recipe"],
            "manual speedup": f"{r['manual speedup_model']:.3f}",
            "tuned speedup": f"{r['tuned speedup_model']:.3f}",
        }
        for who in ("manual", "tuned"):
            if f"{who} gain low" in r:
                interval = (r[f"{who} gain"], r[f"{who} gain low"], r[f"{who} gain high"])
                row[f"{who} gain [95% CI]"] = _gain(*interval)
                row[f"{who}: replicates agree"] = r[f"{who} replicates agree"]
            else:
                row[f"{who} gain"] = f"{r[f'{who} gain']:+.1%}"
        for who in ("manual", "tuned"):  # `tune.controls`: the gain over the same samples at one τ_kd
            if isinstance(r.get(f"{who} control draft"), str):
                row[f"{who} control"] = f"{r[f'{who} control']}: {r[f'{who} control speedup_model']:.3f}"
                versus = f"{who} vs control"
                if f"{versus} low" in r:
                    row[f"{versus} [95% CI]"] = _gain(r[versus], r[f"{versus} low"], r[f"{versus} high"])
                    row[f"{versus}: replicates agree"] = r[f"{versus} replicates agree"]
                else:
                    row[versus] = f"{r[versus]:+.1%}"
        shown.append(row)
    return pd.DataFrame(shown)


# ---------------------------------------------------------------- rank agreement


@dataclass(frozen=True)
class RankAgreement:
    """Spearman's ρ between the search budget's and the full budget's validation objective over the recipes
    in `recipes` (RANK_COLUMNS), with its 95% interval (nan with fewer than MIN_RECIPES recipes)."""

    recipes: pd.DataFrame
    rho: float
    low: float
    high: float

    @property
    def weak(self) -> bool:
        return not self.rho >= WEAK_RHO or np.isnan(self.low) or self.low <= 0.0

    @property
    def line(self) -> str:
        interval = "no interval" if np.isnan(self.low) else f"95% CI [{self.low:+.2f}, {self.high:+.2f}]"
        return f"Spearman's ρ = {self.rho:+.2f} over {len(self.recipes)} recipes ({interval})"

    def best(self, role: str) -> tuple[str, float] | None:
        """The recipe of `role` (single, manual, tuned) with the best full-budget objective."""
        if "role" not in self.recipes or not (self.recipes.role == role).any():
            return None
        row = self.recipes[self.recipes.role == role].sort_values("full objective").iloc[-1]
        return str(row.recipe), float(row["full objective"])

    @property
    def best_single_line(self) -> str:
        """Which single τ_kd is best at the full budget: Table 3's is the search budget's choice."""
        found = self.best("single")
        if found is None:
            return ""
        name, value = found
        return (
            f"At the full budget the best single τ_kd on validation is `{name}` (objective {value:.3f}); "
            "Table 3's best single τ_kd is the search budget's choice, per τ_dec."
        )

    @property
    def warning(self) -> str:
        """What Table 3's reader must know when the short budget ranks recipes weakly ("" otherwise)."""
        if not self.weak:
            return ""
        if np.isnan(self.low):
            return (
                f"**Too few recipes to tell whether the search budget ranks recipes like the full budget** "
                f"({self.line}): the tuned row says how this winner does, not how well tuning can do."
            )
        return (
            f"**The search budget ranks recipes weakly like the full budget** ({self.line}): the recipe the "
            "search picked on its short budget need not be the best at the budget its drafts are served at, "
            "so the tuned row says how this winner does, not how well tuning can do."
        )


def rank_agreement(recipes: pd.DataFrame) -> RankAgreement:
    """ρ and its interval from one row per recipe (RANK_COLUMNS)."""
    search = recipes["search objective"].to_numpy(dtype=float)
    full = recipes["full objective"].to_numpy(dtype=float)
    if len(recipes) < 2 or np.ptp(search) == 0 or np.ptp(full) == 0:
        return RankAgreement(recipes, np.nan, np.nan, np.nan)
    if len(recipes) < MIN_RECIPES:
        from scipy.stats import spearmanr

        return RankAgreement(recipes, float(spearmanr(search, full).statistic), np.nan, np.nan)
    rho, low, high = spearman(search, full)
    return RankAgreement(recipes, rho, low, high)


# ---------------------------------------------------------------- the sections


TABLE3_NOTE = (
    "The best single τ_kd (the best on the validation split at the search budget, per τ_dec), the paper's "
    "manual recipe around it and the tuned mixture, each retrained at the full budget with `tune.replicates` "
    "seeds and measured on the test sets (analytic `speedup_model`, mean over replicates). A gain's 95% "
    "interval covers training replicates and test prompts (two levels); `replicates agree`: how many "
    "replicates show a gain on their own. With `tune.controls`, each mixture's control (as many teacher "
    "samples per prompt at the best single τ_kd, drawn by the mixture's weights) and the mixture's gain "
    "over it: above 0, the temperatures make the gain, not the extra samples.\n"
)


def table3_section(composition: Composition | None, rank: RankAgreement | None) -> list[str]:
    """Table 3 (full budget) with its intervals, the rank-agreement warning beside it when weak, and the
    rank agreement itself."""
    if composition is None or composition.table3.empty:
        return []
    lines = [TABLE3_NOTE, markdown_table(table3_frame(composition.table3))]
    if rank is not None:
        lines += [rank.warning + "\n"] if rank.warning else []
        lines += ["### Does the search budget rank recipes like the full budget?\n", RANK_NOTE]
        lines += [f"{rank.line}. {rank.best_single_line}\n", markdown_table(rank.recipes)]
    return lines


def tune_section(composition: Composition) -> list[str]:
    """The sweep report's Table 3 section from a finished `specray tune` folder's results."""
    rank = rank_agreement(composition.rank) if composition.rank is not None else None
    return table3_section(composition, rank)


RANK_NOTE = (
    "Each recipe retrained at the full budget: its validation objective (mean `speedup_model` over the "
    "objective τ_dec) after the search budget's one training and after the full budget's (mean over its "
    "replicates). ρ is weak below 0.5 or when its interval reaches 0.\n"
)
