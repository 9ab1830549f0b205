"""Paired-bootstrap machinery for the verdicts (`specray.report.verdicts`): per-prompt cells, the interval
and the verdict rule. Pure: frames in, frozen dataclasses out.

Every analytic cell carries per-prompt sums (`per_prompt_tokens`, `per_prompt_beta_sum`,
`per_prompt_target_calls`, `per_prompt_drafted`) and its cost terms, so any statistic of the modelled
speedup can be recomputed on any resample of the prompts: over prompt set P, block efficiency
τ_b = Σ_P tokens / Σ_P target_calls, `speedup_model` = `CostTerms.speedup` of the per-prompt means
(`specray.specdec.records`), α = Σ_P beta_sum / Σ_P tokens. Every draft
is evaluated on the same prompts of a test set, so one resample of prompt indices is applied to all of them
(paired): the drafts are compared on the same prompts, and the prompts' own spread is not counted twice.
Two test sets hold different prompts, so they are resampled independently.

Interval: percentile bootstrap (scipy.stats.bootstrap, 2,000 resamples, a fixed seed so that a report is
reproducible). Percentile rather than BCa: several effects are differences of maxima, where BCa's jackknife
acceleration is unstable, and a percentile interval can be checked by hand (the unit tests pin one).

Verdict, for a claim that the effect is positive (or negative): "reproduced" when the whole interval lies on
the claimed side of 0, "not reproduced" when it lies entirely on the other side, "inconclusive" when it
contains 0 (or no interval could be computed — the reason is given), "not testable on this sweep" when the
grid lacks what the claim needs (what is missing is given).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

from specray.names import BASELINE
from specray.specdec.records import CostTerms

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
INCONCLUSIVE, NOT_TESTABLE = "inconclusive", "not testable on this sweep"
RESAMPLES, SEED = 2000, 0
PER_PROMPT = ("per_prompt_tokens", "per_prompt_beta_sum", "per_prompt_target_calls")

# test set -> resampled prompt indices [resamples, prompts] -> effect [resamples]
Statistic = Callable[[Mapping[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Verdict:
    """One claim on one scope (a paradigm, a test set): its effect, 95% interval and verdict."""

    claim: str
    scope: str
    definition: str  # what `effect` is, in one line
    effect: float  # nan when not testable
    low: float  # 95% interval; nan without one
    high: float
    verdict: str
    note: str = ""  # why inconclusive without an interval, or what the grid lacks

    @property
    def interval(self) -> str:
        return "-" if np.isnan(self.low) else f"[{self.low:+.3f}, {self.high:+.3f}]"


def judge(low: float, high: float, sign: int) -> str:
    """The verdict of an interval for a claim that the effect has `sign` (+1 or −1)."""
    if np.isnan(low) or np.isnan(high):
        return INCONCLUSIVE
    if sign * low > 0 and sign * high > 0:
        return REPRODUCED
    if sign * low < 0 and sign * high < 0:
        return NOT_REPRODUCED
    return INCONCLUSIVE


def paired_interval(
    statistic: Statistic, sizes: Mapping[str, int], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """(effect on all prompts, low, high): the 95% percentile bootstrap of `statistic`, resampling the
    prompt indices of each test set in `sizes` (test set -> prompts) jointly across drafts."""
    names = list(sizes)
    everything = {name: np.arange(sizes[name])[None, :] for name in names}
    effect = float(statistic(everything)[0])

    def vectorised(*indices: np.ndarray, axis: int = -1) -> np.ndarray:
        return statistic({name: np.asarray(i, dtype=int) for name, i in zip(names, indices, strict=True)})

    with np.errstate(invalid="ignore", divide="ignore"):
        result = bootstrap(
            tuple(np.arange(sizes[name]) for name in names),
            vectorised,
            n_resamples=resamples,
            batch=500,
            vectorized=True,
            paired=False,  # test sets hold different prompts; within one, all drafts share each index
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return effect, float(result.confidence_interval.low), float(result.confidence_interval.high)


# ---------------------------------------------------------------- per-prompt cells


@dataclass(frozen=True)
class PromptCells:
    """One test set's analytic cells (each at its best γ) with per-prompt sums: row i of `cells` has
    tokens[i], beta_sum[i], target_calls[i], drafted[i] (each [prompts]) and its cost terms terms[i]."""

    cells: pd.DataFrame  # draft, paradigm, tau_kd, tau_dec, gamma (positional rows)
    tokens: np.ndarray  # [cells, prompts]
    beta_sum: np.ndarray  # [cells, prompts]
    target_calls: np.ndarray  # [cells, prompts]
    drafted: np.ndarray  # [cells, prompts]
    terms: list[CostTerms]  # [cells]

    def row(self, draft: str, tau_dec: float) -> int | None:
        hit = np.flatnonzero((self.cells.draft == draft).to_numpy() & np.isclose(self.cells.tau_dec, tau_dec))
        return int(hit[0]) if len(hit) else None

    def existing_row(self, draft: str, tau_dec: float) -> int:
        """`row` where the caller has already checked the cell is there."""
        row = self.row(draft, tau_dec)
        if row is None:
            raise KeyError(f"no analytic cell with per-prompt sums for {draft!r} at τ_dec {tau_dec:g}")
        return row

    def speedup(self, row: int, index: np.ndarray) -> np.ndarray:
        """speedup_model of cell `row` on prompts `index` [resamples, prompts] -> [resamples]."""
        means = (x[row][index].mean(-1) for x in (self.tokens, self.target_calls, self.drafted))
        tokens, calls, drafted = means
        return self.terms[row].speedup(tokens, calls, drafted, 1.0)

    def acceptance(self, row: int, index: np.ndarray) -> np.ndarray:
        return self.beta_sum[row][index].sum(-1) / self.tokens[row][index].sum(-1)


def prompt_cells(cells: pd.DataFrame) -> dict[str, PromptCells]:
    """Per test set, the analytic cells that carry per-prompt sums, at each (draft, τ_dec)'s best γ by
    `speedup_model`. `cells`: cell rows joined with their drafts (`build.cells_frame(keep_lists=True)`)."""
    if cells.empty or not set(PER_PROMPT) <= set(cells):
        return {}
    analytic = cells[(cells.estimator == "analytic") & cells.per_prompt_tokens.map(_is_list)]
    out = {}
    for test_set, rows in analytic.groupby("test_set"):
        best = rows.loc[rows.groupby(["draft", "tau_dec"])["speedup_model"].idxmax()].reset_index(drop=True)
        if best.per_prompt_tokens.map(len).nunique() != 1:
            continue  # cells scored on different prompts cannot be paired
        tokens, beta_sum, target_calls = (np.array(best[name].tolist(), dtype=float) for name in PER_PROMPT)
        terms, drafted = _terms(best, target_calls)
        out[str(test_set)] = PromptCells(best, tokens, beta_sum, target_calls, drafted, terms)
    return out


def _terms(best: pd.DataFrame, target_calls: np.ndarray) -> tuple[list[CostTerms], np.ndarray]:
    """Each cell's cost terms and per-prompt drafts; cells recorded before they existed (a report rebuilt
    from an old run) get the papers' model at their c: γ drafts per call, verification one target step."""
    if "cost_terms" in best and "per_prompt_drafted" in best and best.cost_terms.map(_is_dict).all():
        drafted = np.array(best.per_prompt_drafted.tolist(), dtype=float)
        return [CostTerms(**t) for t in best.cost_terms], drafted
    c = best.c.astype(float).fillna(0.0).to_numpy()
    gammas = best.gamma.to_numpy()
    return [CostTerms(1.0, float(x)) for x in c], target_calls * gammas[:, None]


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def _is_list(value: object) -> bool:
    return isinstance(value, list | tuple | np.ndarray) and len(value) > 0


def primary(tables: Mapping[str, PromptCells]) -> str:
    return "in_domain" if "in_domain" in tables else sorted(tables)[0]


def in_range(table: PromptCells) -> list[float]:
    """The grid's τ_dec within the KD range (≤ 1), sorted."""
    return sorted(float(t) for t in table.cells.tau_dec.unique() if t <= 1.0 + 1e-9)


def single_drafts(table: PromptCells, paradigm: str) -> dict[float, str]:
    """τ_kd -> draft name of the single-τ_kd drafts of a paradigm (mixtures excluded)."""
    rows = table.cells[(table.cells.paradigm == paradigm) & table.cells.tau_kd.notna()]
    return {float(k): str(d) for k, d in rows.groupby("tau_kd").draft.first().items()}


def peak(table: PromptCells, drafts: Sequence[str], tau_dec: float, index: np.ndarray) -> np.ndarray:
    """Best speedup over `drafts` at τ_dec, re-chosen in every resample -> [resamples]."""
    rows = [r for d in drafts if (r := table.row(d, tau_dec)) is not None]
    return np.max([table.speedup(r, index) for r in rows], axis=0)


def paradigms(table: PromptCells) -> list[str]:
    return sorted(
        p for p in table.cells.paradigm.dropna().unique() if p != BASELINE and single_drafts(table, p)
    )


def prompt_count(table: PromptCells) -> int:
    return table.tokens.shape[1]


def judged(
    claim: str, scope: str, definition: str, sign: int, statistic: Statistic, sizes: Mapping[str, int]
) -> Verdict:
    effect, low, high = paired_interval(statistic, sizes)
    note = "" if np.isfinite(low) else "the bootstrap gave no finite interval (empty resamples)"
    return Verdict(claim, scope, definition, effect, low, high, judge(low, high, sign), note)


def untestable(claim: str, scope: str, definition: str, missing: str) -> Verdict:
    return Verdict(claim, scope, definition, np.nan, np.nan, np.nan, NOT_TESTABLE, missing)


def match(grid: Mapping[float, str], tau: float) -> str | None:
    """The draft whose τ_kd equals `tau` (float-tolerant), if the grid has one."""
    return next((draft for tau_kd, draft in grid.items() if np.isclose(tau_kd, tau)), None)
