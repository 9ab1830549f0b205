"""The composition claim, judged: TempSpec's Table 3 says mixing the KD data of several τ_kd gains 12–20%
in modelled speedup over the best single τ_kd at high τ_dec. Judged on a finished `specray tune`
(`Composition`: its Table 3 and cell records; the paper's manual recipe and the tuned mixture) and on a
sweep's own mixtures (`distill.mixtures`), with the same paired bootstrap as every verdict
(`specray.report.paired`), against the paper's band rather than only its sign (`_against_band`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from specray.report.paired import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    PromptCells,
    Verdict,
    in_range,
    judged,
    paradigms,
    peak,
    prompt_cells,
    prompt_count,
    single_drafts,
    untestable,
)

COMPOSITION = "composition gains 12–20% at high τ_dec"
CONTENDERS = {"manual recipe": "manual draft", "tuned mixture": "tuned draft"}
TEMPERATURE = "a mixture beats as many samples at the best single τ_kd"


@dataclass(frozen=True)
class Composition:
    """What `specray tune` measured: its Table 3 (one row per test set and τ_dec, with the contenders'
    draft names) and the test-set cell records (per-prompt sums where the run kept them); `rank`: each
    retrained recipe's validation objective at the search and the full budget (`report.table3`)."""

    table3: pd.DataFrame
    cells: pd.DataFrame
    rank: pd.DataFrame | None = None


def composition_gains(composition: Composition | None) -> list[Verdict]:
    """Effect, per test set at the highest τ_dec of Table 3: S(composition) / S(best single τ_kd) − 1, for
    the paper's manual recipe (top-k τ_kd around the peak) and for the tuned mixture. Claimed: a gain of
    12–20% (judged against that band, `_against_band`)."""
    definition = "S(mixture) / S(best single τ_kd) − 1 at the highest τ_dec"
    if composition is None or composition.table3.empty:
        return [untestable(COMPOSITION, "-", definition, "no `specray tune` results given")]
    tables = prompt_cells(composition.cells)
    verdicts = []
    highest = composition.table3.loc[composition.table3.groupby("test_set").tau_dec.idxmax()]
    for row in highest.to_dict("records"):
        for label, column in CONTENDERS.items():
            verdicts.append(_composition_verdict(tables, row, label, column, definition))
    return verdicts


def control_gains(composition: Composition | None) -> list[Verdict]:
    """Effect, per test set at the highest τ_dec of Table 3, for each contender that has a control
    (`tune.controls`): S(mixture) / S(control) − 1, the control reading as many teacher samples per prompt
    at the best single τ_kd, drawn by the mixture's weights. Claimed: a gain (judged by its sign): the
    temperatures, not the extra samples, make the mixture's gain. No rows without controls."""
    definition = "S(mixture) / S(its samples at the best single τ_kd) − 1 at the highest τ_dec"
    if composition is None or composition.table3.empty:
        return []
    tables = prompt_cells(composition.cells)
    verdicts = []
    highest = composition.table3.loc[composition.table3.groupby("test_set").tau_dec.idxmax()]
    for row in highest.to_dict("records"):
        for label in CONTENDERS:
            if isinstance(row.get(f"{label.split()[0]} control draft"), str):
                verdicts.append(control_verdict(tables, row, label, definition))
    return verdicts


def control_verdict(tables: Mapping[str, PromptCells], row: Mapping, label: str, definition: str) -> Verdict:
    """One contender's gain over its control in one Table 3 row, with its interval."""
    who = label.split()[0]
    return _composition_verdict(
        tables, row, label, CONTENDERS[label], definition, reference=f"{who} control draft", claim=TEMPERATURE
    )


def _composition_verdict(
    tables: Mapping[str, PromptCells],
    row: Mapping,
    label: str,
    column: str,
    definition: str,
    reference: str = "single draft",
    claim: str = COMPOSITION,
) -> Verdict:
    test_set, tau_dec = str(row["test_set"]), float(row["tau_dec"])
    scope = f"{label}, τ_dec {tau_dec:g} ({test_set})"
    table = tables.get(test_set)
    single_name, contender_name = row.get(reference), row.get(column)
    single, contender = (
        (table.row(single_name, tau_dec), table.row(contender_name, tau_dec))
        if table is not None and single_name and contender_name
        else (None, None)
    )
    who = label.split()[0]
    if table is None or single is None or contender is None:
        point = row[f"{who} gain" if claim == COMPOSITION else f"{who} vs control"]
        reason = "no per-prompt values in the tune records: no interval"
        return Verdict(claim, scope, definition, float(point), np.nan, np.nan, INCONCLUSIVE, reason)

    def statistic(index: Mapping[str, np.ndarray]) -> np.ndarray:
        i = index[test_set]
        return table.speedup(contender, i) / table.speedup(single, i) - 1.0

    result = judged(claim, scope, definition, +1, statistic, {test_set: prompt_count(table)})
    return _against_band(result) if claim == COMPOSITION else result


PAPER_GAIN = (0.12, 0.20)  # TempSpec's composition gains at high τ_dec


def _against_band(result: Verdict) -> Verdict:
    """The claim is a size, not only a sign: reproduced when the interval lies above 0 and reaches the
    paper's 12–20%, not reproduced when it lies entirely below 12% (a gain, if any, smaller than the
    paper's) or entirely below 0, inconclusive otherwise."""
    low, high = result.low, result.high
    band = "inside" if PAPER_GAIN[0] <= result.effect <= PAPER_GAIN[1] else "outside"
    note = f"point estimate {band} the paper's 12–20%"
    if np.isnan(low) or np.isnan(high):
        return replace(result, note="; ".join(filter(None, [result.note, note])))
    if low > 0 and high >= PAPER_GAIN[0]:
        verdict = REPRODUCED
    elif high < PAPER_GAIN[0]:
        verdict = NOT_REPRODUCED
        note += "; the interval lies below 12%" + (" and above 0: a smaller gain" if low > 0 else "")
    else:
        verdict = INCONCLUSIVE
    return replace(result, verdict=verdict, note=note)


def sweep_mixture_gains(tables: Mapping[str, PromptCells]) -> list[Verdict]:
    """The same claim on a sweep's own mixtures (`distill.mixtures`), per paradigm that has them, on each
    test set at the highest τ_dec ≤ 1: S(best mixture) / S(best single τ_kd) − 1, both re-chosen in every
    resample. Claimed: a gain of 12–20% (`_against_band`). No rows when the sweep distilled no mixture."""
    verdicts = []
    for test_set, table in sorted(tables.items()):
        cells, taus = table.cells, in_range(table)
        for paradigm in paradigms(table):
            mixtures = sorted(set(cells.draft[(cells.paradigm == paradigm) & cells.tau_kd.isna()]))
            if mixtures and taus:
                verdicts.append(_mixture_verdict(table, test_set, paradigm, mixtures, taus[-1]))
    return verdicts


def _mixture_verdict(
    table: PromptCells, test_set: str, paradigm: str, mixtures: list[str], tau_dec: float
) -> Verdict:
    singles = list(single_drafts(table, paradigm).values())

    def statistic(index: Mapping[str, np.ndarray]) -> np.ndarray:
        i = index[test_set]
        return peak(table, mixtures, tau_dec, i) / peak(table, singles, tau_dec, i) - 1.0

    definition = "S(best sweep mixture) / S(best single τ_kd) − 1 at the highest τ_dec ≤ 1"
    scope = f"{paradigm} sweep mixtures, τ_dec {tau_dec:g} ({test_set})"
    return _against_band(
        judged(COMPOSITION, scope, definition, +1, statistic, {test_set: prompt_count(table)})
    )
