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

Interval: the percentile bootstrap over prompts of `specray.bootstrap` (`bootstrap_interval`), or with
training replicates the interval over replicates and prompts (`replicated_interval`).

Verdict, for a claim that the effect is positive (or negative): "reproduced" when the whole interval lies on
the claimed side of 0, "not reproduced" when it lies entirely on the other side, "inconclusive" when it
contains 0 (or no interval could be computed — the reason is given), "not testable on this sweep" when the
grid lacks what the claim needs (what is missing is given).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specray.bootstrap import bootstrap_interval, replicated_interval
from specray.metrics import (
    COST_TERMS,
    PER_PROMPT_BETA_SUM,
    PER_PROMPT_DRAFTED,
    PER_PROMPT_TARGET_CALLS,
    PER_PROMPT_TOKENS,
)
from specray.names import BASELINE
from specray.report.best import best_gamma
from specray.specdec.records import CostTerms

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
INCONCLUSIVE, NOT_TESTABLE = "inconclusive", "not testable on this sweep"
TRAINING_NOT_MEASURED = "training variance not measured"
PER_PROMPT = (PER_PROMPT_TOKENS, PER_PROMPT_BETA_SUM, PER_PROMPT_TARGET_CALLS)

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
    replicates: int = 1  # training replicates the interval covers (1: prompts only)
    agreeing: str = ""  # how many replicates show the claimed sign on their own, e.g. "3/3"

    @property
    def training(self) -> str:
        """The verdict table's replicates column."""
        if np.isnan(self.effect):
            return "-"
        if self.replicates < 2:
            return TRAINING_NOT_MEASURED
        return f"{self.agreeing} replicates agree"

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


# ---------------------------------------------------------------- per-prompt cells


@dataclass(frozen=True)
class PromptCells:
    """One test set's analytic cells (each at its best γ, chosen on the mean over training replicates) with
    per-prompt sums: row i of `cells` has tokens[i], beta_sum[i], target_calls[i], drafted[i], each
    [prompts, replicates of row i] (one column for a draft without replicates, e.g. the un-distilled one:
    it then broadcasts against the others), and its cost terms terms[i]. `cells.draft` is the recipe's
    name (without `/r<k>`)."""

    cells: pd.DataFrame  # draft, paradigm, tau_kd, tau_dec, gamma (positional rows)
    tokens: list[np.ndarray]  # [cells] of [prompts, replicates]
    beta_sum: list[np.ndarray]
    target_calls: list[np.ndarray]
    drafted: list[np.ndarray]
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

    def replicates(self, row: int) -> int:
        return int(self.tokens[row].shape[1])

    def speedup(self, row: int, index: np.ndarray) -> np.ndarray:
        """speedup_model of cell `row` on prompts `index` [resamples, prompts] -> [resamples, replicates],
        each replicate scored on the same resampled prompts (paired)."""
        means = (x[row][index].mean(-2) for x in (self.tokens, self.target_calls, self.drafted))
        tokens, calls, drafted = means
        return self.terms[row].speedup(tokens, calls, drafted, 1.0)

    def acceptance(self, row: int, index: np.ndarray) -> np.ndarray:
        """[resamples, replicates], as `speedup`."""
        return self.beta_sum[row][index].sum(-2) / self.tokens[row][index].sum(-2)


def prompt_cells(cells: pd.DataFrame) -> dict[str, PromptCells]:
    """Per test set, the analytic cells that carry per-prompt sums, at each (draft, τ_dec)'s best γ by
    `speedup_model` (averaged over the draft's training replicates), every replicate's sums side by side.
    `cells`: cell rows joined with their drafts (`build.cells_frame(keep_lists=True)`); a draft's
    replicates share its `recipe` and are told apart by `replicate`. Where drafts have different numbers of
    replicates (a sweep stopped part way), each keeps the smallest number above one that all have."""
    if cells.empty or not set(PER_PROMPT) <= set(cells):
        return {}
    analytic = cells[(cells.estimator == "analytic") & cells.per_prompt_tokens.map(_is_list)]
    recipe = analytic["recipe"].fillna(analytic.draft) if "recipe" in analytic else analytic.draft
    replicate = analytic["replicate"].fillna(0).astype(int) if "replicate" in analytic else 0
    analytic = analytic.assign(draft=recipe, replicate=replicate)
    out = {}
    for test_set, rows in analytic.groupby("test_set"):
        chosen = best_gamma(rows)  # every replicate's row at the γ best on their mean
        if chosen.per_prompt_tokens.map(len).nunique() != 1:
            continue  # cells scored on different prompts cannot be paired
        groups = [g.sort_values("replicate") for _, g in chosen.groupby(["draft", "tau_dec"], sort=False)]
        several = [len(g) for g in groups if len(g) > 1]
        kept = [g.iloc[: min(several)] if len(g) > 1 else g for g in groups] if several else groups
        first = pd.DataFrame([g.iloc[0] for g in kept]).reset_index(drop=True)
        stacks = {name: [np.array(g[name].tolist(), dtype=float).T for g in kept] for name in PER_PROMPT}
        terms, drafted = _terms(first, kept, stacks[PER_PROMPT_TARGET_CALLS])
        tokens, beta_sum, target_calls = (stacks[name] for name in PER_PROMPT)
        out[str(test_set)] = PromptCells(first, tokens, beta_sum, target_calls, drafted, terms)
    return out


def analytic_test_sets(
    with_lists: pd.DataFrame, column: str
) -> Iterator[tuple[str, pd.DataFrame, PromptCells]]:
    """(test set, its analytic cell rows, its paired per-prompt table) for each test set with a per-prompt
    table, where the cells have `column` at all: the loop of the report's per-prompt sections."""
    if with_lists.empty or column not in with_lists:
        return
    tables = prompt_cells(with_lists)
    for test_set, rows in with_lists[with_lists.estimator == "analytic"].groupby("test_set"):
        if str(test_set) in tables:
            yield str(test_set), rows, tables[str(test_set)]


def _terms(
    first: pd.DataFrame, groups: Sequence[pd.DataFrame], target_calls: Sequence[np.ndarray]
) -> tuple[list[CostTerms], list[np.ndarray]]:
    """Each cell's cost terms (its replicates share the sweep's step costs) and per-prompt drafts; cells
    whose metrics lack them get the papers' model at their c: γ drafts per call, verification one target
    step."""
    if COST_TERMS in first and PER_PROMPT_DRAFTED in first and first.cost_terms.map(_is_dict).all():
        drafted = [np.array(g.per_prompt_drafted.tolist(), dtype=float).T for g in groups]
        return [CostTerms(**t) for t in first.cost_terms], drafted
    c = first.c.astype(float).fillna(0.0).to_numpy()
    gammas = first.gamma.to_numpy()
    return [CostTerms(1.0, float(x)) for x in c], [
        calls * g for calls, g in zip(target_calls, gammas, strict=True)
    ]


def _is_dict(value: object) -> bool:
    return isinstance(value, dict)


def _is_list(value: object) -> bool:
    return isinstance(value, list | tuple | np.ndarray) and len(value) > 0


def primary(test_sets: Collection[str]) -> str:
    """The test set a one-scope verdict is judged on: in-domain where there is one, else the first by name."""
    return "in_domain" if "in_domain" in test_sets else sorted(test_sets)[0]


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
    return stacked([table.speedup(r, index) for r in rows]).max(axis=0)


def stacked(values: Sequence[np.ndarray]) -> np.ndarray:
    """Per-draft values [resamples, replicates] stacked on a new first axis; a draft without replicates
    (one column, e.g. the un-distilled one) is broadcast to the others' replicates."""
    return np.stack(np.broadcast_arrays(*values))


def paradigms(table: PromptCells) -> list[str]:
    return sorted(
        p for p in table.cells.paradigm.dropna().unique() if p != BASELINE and single_drafts(table, p)
    )


def prompt_count(table: PromptCells) -> int:
    return int(table.tokens[0].shape[0])


def judged(
    claim: str, scope: str, definition: str, sign: int, statistic: Statistic, sizes: Mapping[str, int]
) -> Verdict:
    """The verdict of an effect. `statistic(index)` -> [resamples, replicates] (the effect of each training
    replicate, on the same resampled prompts) or [resamples] (no replicates). With one replicate the
    interval is the paired percentile bootstrap over prompts (`bootstrap.bootstrap_interval`); with several
    it covers training too (`bootstrap.replicated_interval`), and the verdict says how many replicates
    agree."""
    all_prompts = {name: np.arange(n)[None, :] for name, n in sizes.items()}
    shape = np.shape(statistic(all_prompts))
    replicates = shape[-1] if len(shape) == 2 else 1
    if replicates == 1:

        def single(index: Mapping[str, np.ndarray]) -> np.ndarray:
            values = np.asarray(statistic(index))
            return values[..., 0] if values.ndim == 2 or (values.ndim == 1 and len(shape) == 2) else values

        effect, low, high = bootstrap_interval(single, sizes)
        note = "" if np.isfinite(low) else "the bootstrap gave no finite interval (empty resamples)"
        return Verdict(claim, scope, definition, effect, low, high, judge(low, high, sign), note)

    def averaged(chosen: np.ndarray, index: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.asarray(statistic(index))[:, chosen].mean(-1)

    interval = replicated_interval(averaged, replicates, dict(sizes))
    low, high = interval.low, interval.high
    note = "" if np.isfinite(low) else "no finite interval (empty resamples)"
    verdict = judge(low, high, sign)
    agreeing = interval.agreeing(sign)
    return Verdict(claim, scope, definition, interval.effect, low, high, verdict, note, replicates, agreeing)


def untestable(claim: str, scope: str, definition: str, missing: str) -> Verdict:
    return Verdict(claim, scope, definition, np.nan, np.nan, np.nan, NOT_TESTABLE, missing)


def match(grid: Mapping[float, str], tau: float) -> str | None:
    """The draft whose τ_kd equals `tau` (float-tolerant), if the grid has one."""
    return next((draft for tau_kd, draft in grid.items() if np.isclose(tau_kd, tau)), None)
