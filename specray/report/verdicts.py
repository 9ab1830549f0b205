"""The papers' claims, judged on one sweep: each claim's effect, its 95% paired-bootstrap interval over the
test prompts and a verdict (`specray.report.paired` has the bootstrap and the verdict rule). Pure: frames
in, frozen dataclasses out.

S below is the modelled speedup (`speedup_model`, analytic estimator, each cell at its best γ) recomputed
from the per-prompt sums on each resample; "peak" or "best τ_kd" is the maximum over a paradigm's single-τ_kd
drafts, re-chosen in every resample (so the interval includes the choice). Claims are TempSpec's (Ouyang et
al., 2024) and are checked on the in-domain test set unless they are about the test sets. Each function's
docstring defines its effect exactly and the side the paper claims; the composition claim (Table 3) is in
`specray.report.composition`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from specray.metrics import ACCEPTANCE_RATE, PER_PROMPT_BETA_SUM, PER_PROMPT_TOKENS
from specray.names import BASELINE
from specray.report.composition import Composition, composition_gains, control_gains, sweep_mixture_gains
from specray.report.paired import (
    INCONCLUSIVE,
    PromptCells,
    Verdict,
    in_range,
    judged,
    match,
    paradigms,
    peak,
    primary,
    prompt_cells,
    prompt_count,
    single_drafts,
    stacked,
    untestable,
)

NO_CELLS = "no analytic cells with per-prompt values"
FALLS = "speedup falls as τ_dec rises"


def speedup_falls(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Effect: S(τ_hi) − S(τ_lo), with τ_lo / τ_hi the lowest / highest τ_dec ≤ 1 of the grid, on the
    in-domain test set, for the un-distilled draft and for each paradigm's best τ_kd (the peak over τ_kd,
    re-chosen in every resample). Claimed < 0."""
    definition = "S(highest τ_dec ≤ 1) − S(lowest τ_dec)"
    if not tables:
        return [untestable(FALLS, "-", definition, NO_CELLS)]
    test_set = primary(tables)
    table, taus = tables[test_set], in_range(tables[test_set])
    if len(taus) < 2:
        return [untestable(FALLS, test_set, definition, "needs two τ_dec ≤ 1")]
    low, high = taus[0], taus[-1]
    scopes = {"un-distilled": [BASELINE]} if table.row(BASELINE, low) is not None else {}
    scopes |= {f"{p}, best τ_kd": list(single_drafts(table, p).values()) for p in paradigms(table)}
    verdicts = []
    for scope, drafts in scopes.items():

        def statistic(index: Mapping[str, np.ndarray], drafts: list[str] = drafts) -> np.ndarray:
            i = index[test_set]
            return peak(table, drafts, high, i) - peak(table, drafts, low, i)

        verdicts.append(
            judged(FALLS, f"{scope} ({test_set})", definition, -1, statistic, {test_set: prompt_count(table)})
        )
    return verdicts


DIAGONAL = "the diagonal τ_kd ≈ τ_dec is best"


def diagonal_best(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Effect, per paradigm on the in-domain test set: the mean over the τ_dec ≤ 1 that are also a grid
    τ_kd of S(τ_kd = τ_dec) − max over every other τ_kd of S (the best rival, re-chosen per resample).
    Claimed > 0: the matched draft beats all others."""
    definition = "mean over τ_dec of S(τ_kd = τ_dec) − S(best other τ_kd)"
    if not tables:
        return [untestable(DIAGONAL, "-", definition, NO_CELLS)]
    test_set = primary(tables)
    table = tables[test_set]
    verdicts = []
    for paradigm in paradigms(table):
        grid = single_drafts(table, paradigm)
        matched = [(t, d) for t in in_range(table) if (d := match(grid, t)) is not None]
        scope = f"{paradigm} ({test_set})"
        if not matched or len(grid) < 2:
            verdicts.append(
                untestable(DIAGONAL, scope, definition, "needs ≥ 2 τ_kd and a τ_dec equal to one")
            )
            continue

        def statistic(index: Mapping[str, np.ndarray], grid=grid, matched=matched) -> np.ndarray:
            i = index[test_set]
            gaps = [
                table.speedup(table.existing_row(d, t), i)
                - peak(table, [o for o in grid.values() if o != d], t, i)
                for t, d in matched
            ]
            return np.mean(gaps, axis=0)

        verdicts.append(judged(DIAGONAL, scope, definition, +1, statistic, {test_set: prompt_count(table)}))
    return verdicts


NEIGHBOUR = "a higher neighbour beats a lower one at equal distance"


def higher_neighbour(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Effect, per paradigm on the in-domain test set: the mean over τ_dec ≤ 1 whose neighbours τ_dec ± δ
    are both grid τ_kd (δ = the τ_kd grid's smallest spacing) of S(τ_kd = τ_dec + δ) − S(τ_kd = τ_dec − δ).
    Claimed > 0."""
    definition = "mean over τ_dec of S(τ_kd = τ_dec + δ) − S(τ_kd = τ_dec − δ)"
    if not tables:
        return [untestable(NEIGHBOUR, "-", definition, NO_CELLS)]
    test_set = primary(tables)
    table = tables[test_set]
    verdicts = []
    for paradigm in paradigms(table):
        grid = single_drafts(table, paradigm)
        delta = float(np.diff(sorted(grid)).min()) if len(grid) > 1 else np.nan
        pairs = [
            (t, up, down)
            for t in in_range(table)
            if (up := match(grid, t + delta)) and (down := match(grid, t - delta))
        ]
        scope = f"{paradigm} ({test_set})"
        if not pairs:
            verdicts.append(untestable(NEIGHBOUR, scope, definition, "needs τ_kd on both sides of a τ_dec"))
            continue

        def statistic(index: Mapping[str, np.ndarray], pairs=pairs) -> np.ndarray:
            i = index[test_set]
            gaps = [
                table.speedup(table.existing_row(u, t), i) - table.speedup(table.existing_row(d, t), i)
                for t, u, d in pairs
            ]
            return np.mean(gaps, axis=0)

        verdicts.append(judged(NEIGHBOUR, scope, definition, +1, statistic, {test_set: prompt_count(table)}))
    return verdicts


KD_HIGH = "KD helps most at high τ_dec"


def kd_helps_most_at_high(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Effect, per paradigm on the in-domain test set: G(τ_hi) − G(τ_lo), with G(τ) = peak S over τ_kd at
    τ_dec τ / S(un-distilled at τ) − 1 and τ_lo / τ_hi the lowest / highest τ_dec ≤ 1. Claimed > 0."""
    definition = "relative gain of the best τ_kd over un-distilled at the highest τ_dec ≤ 1 − at the lowest"
    if not tables:
        return [untestable(KD_HIGH, "-", definition, NO_CELLS)]
    test_set = primary(tables)
    table, taus = tables[test_set], in_range(tables[test_set])
    if len(taus) < 2 or table.row(BASELINE, taus[0]) is None:
        return [untestable(KD_HIGH, test_set, definition, "needs two τ_dec ≤ 1 and the un-distilled draft")]
    verdicts = []
    for paradigm in paradigms(table):
        drafts = list(single_drafts(table, paradigm).values())

        def gain(tau: float, i: np.ndarray, drafts: list[str] = drafts) -> np.ndarray:
            return peak(table, drafts, tau, i) / table.speedup(table.existing_row(BASELINE, tau), i) - 1.0

        def statistic(index: Mapping[str, np.ndarray], gain=gain) -> np.ndarray:
            return gain(taus[-1], index[test_set]) - gain(taus[0], index[test_set])

        scope = f"{paradigm} ({test_set})"
        verdicts.append(judged(KD_HIGH, scope, definition, +1, statistic, {test_set: prompt_count(table)}))
    return verdicts


ONLINE = "online beats offline"
ONLINE_HIGH = "online beats offline more at higher τ_dec"


def online_beats_offline(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Per test set, with Δ(τ) = peak S over online τ_kd − peak S over offline τ_kd at τ_dec τ:
    effect 1 = mean of Δ over the τ_dec ≤ 1 (claimed > 0); effect 2 = Δ(τ_hi) − Δ(τ_lo) (claimed > 0)."""
    if not tables:
        return [untestable(ONLINE, "-", "mean over τ_dec ≤ 1 of Δ", NO_CELLS)]
    verdicts = []
    for test_set, table in sorted(tables.items()):
        taus, size = in_range(table), {test_set: prompt_count(table)}
        online, offline = single_drafts(table, "online"), single_drafts(table, "offline")
        if not online or not offline or not taus:
            missing = "needs both paradigms and a τ_dec ≤ 1"
            verdicts += [untestable(c, test_set, "-", missing) for c in (ONLINE, ONLINE_HIGH)]
            continue

        def delta(tau: float, i: np.ndarray, on=online, off=offline, table=table) -> np.ndarray:
            return peak(table, list(on.values()), tau, i) - peak(table, list(off.values()), tau, i)

        def mean_gap(index, delta=delta, taus=taus, test_set=test_set) -> np.ndarray:
            return np.mean([delta(t, index[test_set]) for t in taus], axis=0)

        def widening(index, delta=delta, taus=taus, test_set=test_set) -> np.ndarray:
            return delta(taus[-1], index[test_set]) - delta(taus[0], index[test_set])

        verdicts.append(judged(ONLINE, test_set, "mean over τ_dec ≤ 1 of Δ", +1, mean_gap, size))
        if len(taus) > 1:
            definition = "Δ(highest τ_dec ≤ 1) − Δ(lowest)"
            verdicts.append(judged(ONLINE_HIGH, test_set, definition, +1, widening, size))
    return verdicts


OOD_LARGER = "out-of-domain speedup is larger"
OOD_SENSITIVE = "out-of-domain speedup is more sensitive to τ_dec"


def out_of_domain(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """M_s(τ) = mean S over the drafts scored on both test sets at τ_dec τ, on test set s (its prompts
    resampled independently of the other's). Effect 1 = mean over τ_dec ≤ 1 of M_ood − M_in (claimed
    > 0); effect 2 = the drop M(τ_lo) − M(τ_hi) out of domain − the same in domain (claimed > 0)."""
    definitions = ("mean S out of domain − in domain", "drop of S from lowest to highest τ_dec ≤ 1, ood − in")
    if not {"in_domain", "out_of_domain"} <= set(tables):
        missing = "needs both test sets"
        return [
            untestable(c, "-", d, missing)
            for c, d in zip((OOD_LARGER, OOD_SENSITIVE), definitions, strict=True)
        ]
    inside, outside = tables["in_domain"], tables["out_of_domain"]
    taus = [t for t in in_range(inside) if t in in_range(outside)]
    drafts = sorted(set(inside.cells.draft) & set(outside.cells.draft))

    def mean_speedup(table: PromptCells, tau: float, i: np.ndarray) -> np.ndarray:
        rows = [r for d in drafts if (r := table.row(d, tau)) is not None]
        return stacked([table.speedup(r, i) for r in rows]).mean(axis=0)

    def gap(tau: float, index: Mapping[str, np.ndarray]) -> np.ndarray:
        return mean_speedup(outside, tau, index["out_of_domain"]) - mean_speedup(
            inside, tau, index["in_domain"]
        )

    def larger(index: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.mean([gap(t, index) for t in taus], axis=0)

    def sensitive(index: Mapping[str, np.ndarray]) -> np.ndarray:  # (ood drop) − (in-domain drop)
        return gap(taus[0], index) - gap(taus[-1], index)

    sizes = {"in_domain": prompt_count(inside), "out_of_domain": prompt_count(outside)}
    verdicts = [judged(OOD_LARGER, "all drafts", definitions[0], +1, larger, sizes)] if taus else []
    if len(taus) > 1:
        verdicts.append(judged(OOD_SENSITIVE, "all drafts", definitions[1], +1, sensitive, sizes))
    return verdicts or [untestable(OOD_LARGER, "-", definitions[0], "no τ_dec ≤ 1 on both test sets")]


U_CURVE = "the U-curve over τ_kd out of range"


def u_curve(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """Effect, per paradigm on the in-domain test set: the mean over τ_dec > 1 of [mean S of the lowest and
    highest τ_kd − mean S of the τ_kd between them] (Table 2's U: both ends above the middle). Claimed > 0."""
    definition = "mean over τ_dec > 1 of S(end τ_kd) − S(interior τ_kd)"
    if not tables:
        return [untestable(U_CURVE, "-", definition, NO_CELLS)]
    test_set = primary(tables)
    table = tables[test_set]
    beyond = sorted(float(t) for t in table.cells.tau_dec.unique() if t > 1.0 + 1e-9)
    verdicts = []
    for paradigm in paradigms(table):
        grid = single_drafts(table, paradigm)
        scope = f"{paradigm} ({test_set})"
        if not beyond or len(grid) < 3:
            verdicts.append(untestable(U_CURVE, scope, definition, "needs a τ_dec > 1 and ≥ 3 τ_kd"))
            continue
        taus = sorted(grid)
        ends, middle = [grid[taus[0]], grid[taus[-1]]], [grid[t] for t in taus[1:-1]]

        def mean_of(drafts: list[str], tau: float, i: np.ndarray) -> np.ndarray:
            return np.mean([table.speedup(table.existing_row(d, tau), i) for d in drafts], axis=0)

        def statistic(index: Mapping[str, np.ndarray], ends=ends, middle=middle) -> np.ndarray:
            i = index[test_set]
            return np.mean([mean_of(ends, t, i) - mean_of(middle, t, i) for t in beyond], axis=0)

        verdicts.append(judged(U_CURVE, scope, definition, +1, statistic, {test_set: prompt_count(table)}))
    return verdicts


CURVES_PART = "the KD-step curves of τ_kd 0 and 1 part late in training"


def curves_part_late(curves: pd.DataFrame) -> list[Verdict]:
    """Effect, per paradigm: |α₁ − α₀| at the last reported KD step − |α₁ − α₀| at the report nearest half
    of it, α_k the training probe's acceptance of the τ_kd = k draft at τ_dec = 1 (or the highest probed
    τ_dec): the gap that opens in the second half of training (at step 0 both are the same initial draft,
    so the first report would measure any gap at all). Claimed > 0. `curves` is `figures.curve_frame`'s;
    where its rows also hold the per-prompt lists (on the probe's prompts) they are bootstrapped (paired),
    else the verdict is inconclusive with the point effect."""
    definition = "gap = abs(α(τ_kd=1) − α(τ_kd=0)): gap at the last KD step − gap at mid-training"
    if curves.empty or "tau_kd" not in curves:
        return [untestable(CURVES_PART, "-", definition, "no acceptance-vs-step curves")]
    tau_dec = max(curves.tau_dec.unique(), key=lambda t: (np.isclose(t, 1.0), t))
    at_tau = curves[(curves.tau_dec == tau_dec) & curves.tau_kd.notna()]
    if "replicate" not in at_tau:
        at_tau = at_tau.assign(replicate=0)
    verdicts = []
    for paradigm, runs in at_tau.groupby("paradigm"):
        ends = {
            k: [
                run.sort_values("step")
                for _, run in runs[np.isclose(runs.tau_kd, k)].groupby(runs.replicate.fillna(0))
            ]
            for k in (0.0, 1.0)
        }
        scope = f"{paradigm}, τ_dec {tau_dec:g}"
        if any(not ends[k] or all(r.acceptance_rate.isna().all() for r in ends[k]) for k in ends):
            verdicts.append(untestable(CURVES_PART, scope, definition, "needs τ_kd 0 and 1 drafts' curves"))
            continue
        common = min(len(ends[0.0]), len(ends[1.0]))  # replicates with both curves
        verdicts.append(_curve_verdict({k: r[:common] for k, r in ends.items()}, scope, definition))
    return verdicts


def _middle_and_last(run: pd.DataFrame) -> pd.DataFrame:
    """The report nearest half the last step, and the last one (rows sorted by step)."""
    middle = int(np.abs(run.step.to_numpy() - run.step.iloc[-1] / 2).argmin())
    return run.iloc[[middle, -1]]


def _curve_verdict(ends: Mapping[float, Sequence[pd.DataFrame]], scope: str, definition: str) -> Verdict:
    """`ends`: τ_kd 0 and 1 -> each training replicate's curve (one or more)."""
    rows = {
        k: [_middle_and_last(r.dropna(subset=[ACCEPTANCE_RATE])) for r in runs] for k, runs in ends.items()
    }
    lists = (PER_PROMPT_TOKENS, PER_PROMPT_BETA_SUM)
    every = [r for runs in rows.values() for r in runs]
    if all(r[column].notna().all() for r in every for column in lists):
        arrays = {  # (τ_kd, middle 0 / last 1) -> tokens, β sums [probe prompts, replicates]
            (k, s): tuple(np.array([r[column].iloc[s] for r in runs], dtype=float).T for column in lists)
            for k, runs in rows.items()
            for s in (0, 1)
        }

        def statistic(index: Mapping[str, np.ndarray]) -> np.ndarray:
            i = index["probe"]
            alpha = {ks: b[i].sum(-2) / t[i].sum(-2) for ks, (t, b) in arrays.items()}
            return np.abs(alpha[1.0, 1] - alpha[0.0, 1]) - np.abs(alpha[1.0, 0] - alpha[0.0, 0])

        size = {"probe": len(arrays[0.0, 0][0])}
        return judged(CURVES_PART, scope, definition, +1, statistic, size)
    alpha = {k: np.mean([r.acceptance_rate.to_numpy() for r in runs], axis=0) for k, runs in rows.items()}
    effect = float(abs(alpha[1.0][1] - alpha[0.0][1]) - abs(alpha[1.0][0] - alpha[0.0][0]))
    reason = "no interval: the probe logs one pooled α per step, not per-prompt values"
    return Verdict(CURVES_PART, scope, definition, effect, np.nan, np.nan, INCONCLUSIVE, reason)


# ---------------------------------------------------------------- all of them


def all_verdicts(
    cells: pd.DataFrame, curves: pd.DataFrame, composition: Composition | None = None
) -> list[Verdict]:
    """Every claim's verdicts, in the order of `checks` below. `cells` keeps the per-prompt lists."""
    tables = prompt_cells(cells)
    checks = (speedup_falls, diagonal_best, higher_neighbour, kd_helps_most_at_high, online_beats_offline)
    verdicts = [v for check in (*checks, out_of_domain, u_curve) for v in check(tables)]
    verdicts += composition_gains(composition) + control_gains(composition) + sweep_mixture_gains(tables)
    return verdicts + curves_part_late(curves)


def verdict_frame(verdicts: Sequence[Verdict]) -> pd.DataFrame:
    """The report's verdict table: claim, scope, effect, 95% CI, verdict, and what the effect is."""
    return pd.DataFrame(
        [
            {
                "claim": v.claim,
                "scope": v.scope,
                "effect": "-" if np.isnan(v.effect) else f"{v.effect:+.3f}",
                "95% CI": v.interval,
                "verdict": v.verdict,
                "replicates": v.training,
                # a "|" would split the Markdown cell
                "effect is": (v.definition + (f" — {v.note}" if v.note else "")).replace("|", "\\|"),
            }
            for v in verdicts
        ]
    )
