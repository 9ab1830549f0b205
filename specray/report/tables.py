"""The paper's tables as frames: Table 2 (out-of-range τ_dec, every τ_kd), and reading a finished `specray
tune`'s results (Table 3, `report/table3.py`) from its folder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specray.errors import SpecError
from specray.metrics import SPEEDUP_MODEL
from specray.names import BASELINE
from specray.report.composition import Composition

TABLE3_FILE, TUNE_CELLS_FILE, TUNE_RANK_FILE = "table3.csv", "cells.json", "rank.csv"


def markdown_table(frame: pd.DataFrame, float_format: str = "{:.3f}") -> str:
    """`frame` as a Markdown table (floats as `float_format`); `_no data_` when it is empty."""
    if frame.empty:
        return "_no data_\n"
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "---|" * len(frame.columns)
    rows = [
        "| " + " | ".join(float_format.format(v) if isinstance(v, float) else str(v) for v in row) + " |"
        for row in frame.itertuples(index=False)
    ]
    return "\n".join([header, rule, *rows]) + "\n"


def table2(cells: pd.DataFrame, metric: str = SPEEDUP_MODEL) -> pd.DataFrame:
    """Out-of-range τ_dec (> 1), analytic at each cell's best γ (`cells` holds one γ per cell): one row
    per (test set, paradigm, τ_dec), the un-distilled draft and one column per τ_kd, and the best τ_kd —
    so the curve over τ_kd (the paper's U) can be read along a row (paper Table 2)."""
    beyond = cells[(cells.estimator == "analytic") & (cells.tau_dec > 1.0)]
    single = beyond[beyond.tau_kd.notna()]
    if single.empty:
        return pd.DataFrame()
    wide = single.pivot_table(index=["test_set", "paradigm", "tau_dec"], columns="tau_kd", values=metric)
    best = wide.idxmax(axis=1)
    wide.columns = [f"τ_kd={t:g}" for t in wide.columns]
    base = beyond[beyond.draft == BASELINE].set_index(["test_set", "tau_dec"])[metric]
    wide.insert(0, "un-distilled", [base.get((ts, td), np.nan) for ts, _, td in wide.index])
    wide["best τ_kd"] = [f"{t:g}" for t in best]
    return wide.reset_index()


def load_composition(folder: Path) -> Composition:
    """A finished `specray tune`'s Table 3 and cell records, from its folder (`<output>/<name>/tune`) or
    that folder's `report/`."""
    report = folder / "report" if (folder / "report" / TABLE3_FILE).exists() else folder
    if not (report / TABLE3_FILE).exists():
        raise SpecError(f"{folder}: no {TABLE3_FILE} (is it a finished `specray tune` folder?)")
    cells: list[Mapping[str, Any]] = []
    if (report / TUNE_CELLS_FILE).exists():
        cells = json.loads((report / TUNE_CELLS_FILE).read_text())
    rank = pd.read_csv(report / TUNE_RANK_FILE) if (report / TUNE_RANK_FILE).exists() else None
    return Composition(pd.read_csv(report / TABLE3_FILE), pd.DataFrame(cells), rank)
