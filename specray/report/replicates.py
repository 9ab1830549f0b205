"""Training replicates in the report: the cells of N replicates of a draft (`distill.replicates`) averaged
into the draft's figures, their spread beside them, and how a cell's variance splits between training and
test prompts. Pure: frames in, frames out.

A replicate's cells carry its draft's `recipe` (the name without `/r<k>`) and `replicate` (0 … N−1), from
the draft descriptions (`specray.draft.Draft`). Every figure and table of the report reads the mean
over replicates under the recipe's name, so a sweep with one replicate reads exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from specray.bootstrap import draws
from specray.metrics import SPEEDUP_MODEL
from specray.names import BASELINE

RECIPE, REPLICATE = "recipe", "replicate"
# what identifies a cell apart from its draft (`CellRecord`'s coordinates)
COORDINATES = ("test_set", "tau_dec", "estimator", "gamma", "lenience", "epsilon", "batch_size")
HEADLINE = SPEEDUP_MODEL


def replicate_count(frame: pd.DataFrame) -> int:
    """How many training replicates the frame's distilled drafts have (1 without replicates)."""
    if frame.empty or REPLICATE not in frame:
        return 1
    return int(frame[REPLICATE].fillna(0).max()) + 1


def first_replicate(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of replicate 0 (and of drafts without replicates), for figures that draw one draft's
    history (the training curves)."""
    if frame.empty or REPLICATE not in frame:
        return frame
    return frame[frame[REPLICATE].fillna(0) == 0]


def replicate_means(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (recipe, cell coordinates): the mean over the recipe's replicates of every numeric
    column and of every dict of numbers (per key, e.g. `speedup_model_by_batch`), the first value of the
    others; `draft` is the recipe and `replicates` how many rows were averaged. Lists (per-prompt sums)
    are dropped from averaged rows. Unchanged without replicates."""
    if replicate_count(frame) == 1:
        return frame
    frame = frame.assign(draft=frame[RECIPE].fillna(frame.draft)).drop(columns=[REPLICATE])
    keys = ["draft", *(c for c in COORDINATES if c in frame)]
    rows = []
    for _, group in frame.groupby(keys, dropna=False, sort=False):
        row = group.iloc[0].to_dict()
        for column in group.columns:
            if column in keys:
                continue
            row[column] = _mean(group[column])
        row["replicates"] = len(group)
        rows.append(row)
    return pd.DataFrame(rows, columns=[*frame.columns, "replicates"])


def _mean(values: pd.Series) -> object:
    first = values.iloc[0]
    if isinstance(first, bool | np.bool_):
        return first
    if pd.api.types.is_numeric_dtype(values):
        return float(values.mean()) if values.notna().any() else first
    if isinstance(first, dict) and all(isinstance(v, dict) for v in values):
        shared = set.intersection(*(set(v) for v in values))
        if all(isinstance(first[k], int | float) for k in shared):
            return {k: float(np.mean([v[k] for v in values])) for k in first if k in shared}
    if isinstance(first, list | tuple | np.ndarray):
        return None
    return first


def replicate_spread(frame: pd.DataFrame, at_best: pd.DataFrame, metric: str = HEADLINE) -> pd.DataFrame:
    """`at_best` (mean rows at each recipe's best γ) with `metric` replaced by its standard deviation over
    the recipe's replicates at that γ (ddof 1; NaN for a draft with one replicate, e.g. the un-distilled
    one): the companion of the mean heatmaps."""
    if replicate_count(frame) == 1 or at_best.empty:
        return at_best.iloc[0:0]
    analytic = frame[frame.estimator == "analytic"].assign(draft=frame[RECIPE].fillna(frame.draft))
    keys = ["draft", "test_set", "tau_dec", "gamma"]
    spread = analytic.groupby(keys)[metric].std(ddof=1).rename(f"{metric}_sd").reset_index()
    best = at_best[at_best.estimator == "analytic"].merge(spread, on=keys, how="left")
    return best.assign(**{metric: best[f"{metric}_sd"]})


def variance_table(tables: Mapping[str, object]) -> pd.DataFrame:
    """Per test set and paradigm, how the variance of a cell's headline figure (S, the modelled speedup at
    the cell's best γ) splits: between replicates (the spread of S across training runs, scored on the
    same prompts) and between prompts (the bootstrap variance of S over resampled test prompts, per
    replicate), averaged over the paradigm's cells; `training share` = V_train / (V_train + V_prompt).
    `tables`: `paired.prompt_cells`'s, replicate-aware."""
    from specray.report.paired import PromptCells, prompt_count

    rows = []
    for test_set, table in sorted(tables.items()):
        assert isinstance(table, PromptCells)
        prompts = prompt_count(table)
        drawn = draws(prompts)
        all_prompts = np.arange(prompts)[None, :]
        per_paradigm: dict[str, list[tuple[float, float]]] = {}
        for row, cell in enumerate(table.cells.itertuples()):
            if cell.paradigm == BASELINE or table.replicates(row) < 2:
                continue
            own = table.speedup(row, all_prompts)[0]  # each replicate's S on every prompt [R]
            resampled = table.speedup(row, drawn)  # [resamples, R]
            v_prompt = float(np.var(resampled, axis=0, ddof=1).mean())
            per_paradigm.setdefault(str(cell.paradigm), []).append((float(np.var(own, ddof=1)), v_prompt))
        for paradigm, parts in sorted(per_paradigm.items()):
            v_train, v_prompt = (float(np.mean(x)) for x in zip(*parts, strict=True))
            rows.append(
                {
                    "test_set": test_set,
                    "paradigm": paradigm,
                    "cells": len(parts),
                    "replicates": max(table.replicates(i) for i in range(len(table.cells))),
                    "sd between replicates": np.sqrt(v_train),
                    "sd between prompts": np.sqrt(v_prompt),
                    "training share": v_train / (v_train + v_prompt) if v_train + v_prompt > 0 else np.nan,
                }
            )
    return pd.DataFrame(rows)
