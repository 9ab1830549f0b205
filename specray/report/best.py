"""The one rule for "the best": among cells that differ only in what is being chosen (γ, or the draft and
γ), the one whose figure, **averaged over the draft's training replicates**, is highest; a tie goes to the
first in sorted order (the smaller γ). Every replicate's row of the chosen cell is kept, so the per-prompt
bootstrap can resample them side by side; a frame of replicate means has one row per cell already.

Deciding on the mean keeps one lucky training run from choosing the γ (or the draft) that its own noise
favours, and makes every table and figure of a report, and the tune's objective, choose the same γ for
the same cell. A draft's replicates share its `recipe` (its name without `/r<k>`); a frame without that
column has one replicate per draft.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from specray.metrics import SPEEDUP_MODEL
from specray.specdec.records import CellRecord

CELL = ("draft", "test_set", "tau_dec")  # what a best γ is chosen within, besides a lossy cell's ε


def best_rows(cells: pd.DataFrame, metric: str, within: Sequence[str], over: Sequence[str]) -> pd.DataFrame:
    """The rows of `cells` at each `within` group's best `over` values (module docstring), sorted by
    `within` (no `within`: the best over all rows). A group whose `metric` is NaN on every row has no best
    and no row."""
    if cells.empty:
        return cells
    columns = [*within, *over]
    recipe = cells["recipe"].fillna(cells["draft"]) if "recipe" in cells else cells.get("draft")
    keys = cells.assign(draft=recipe)[columns].astype(object)
    keys = keys.where(keys.notna(), "-")  # a lossless cell's lenience (None) is a value to group by
    mean = keys.assign(value_=cells[metric].to_numpy()).groupby(columns)["value_"].mean().dropna()
    if mean.empty:
        return cells.iloc[0:0]
    best = mean.groupby(level=list(range(len(within)))).idxmax().tolist() if within else [mean.idxmax()]
    winners = pd.DataFrame([w if isinstance(w, tuple) else (w,) for w in best], columns=columns)
    winners = winners.assign(best_=True)
    picked = keys.merge(winners, on=columns, how="left")["best_"].eq(True).to_numpy()
    return cells[picked].sort_values(list(within), kind="stable").reset_index(drop=True)


def best_gamma(
    cells: pd.DataFrame, metric: str = SPEEDUP_MODEL, within: Sequence[str] = CELL
) -> pd.DataFrame:
    """The analytic cells at each (draft, test set, τ_dec)'s best γ by `metric`, decided on its mean over
    the draft's training replicates (module docstring); lossy cells are chosen within their ε."""
    analytic = cells[cells.estimator == "analytic"]
    lossy = [c for c in ("lenience", "epsilon") if c in analytic and c not in within]
    return best_rows(analytic, metric, [*within, *lossy], ["gamma"])


def best_gamma_records(records: Sequence[CellRecord], metric: str = SPEEDUP_MODEL) -> list[CellRecord]:
    """`best_gamma` over cell records whose drafts have one replicate each (a tune's trial): each analytic
    record at its (draft, test set, τ_dec)'s best γ."""
    frame = pd.DataFrame([{**r.flat(), "record_": i} for i, r in enumerate(records)])
    if frame.empty:
        return []
    return [records[i] for i in best_gamma(frame, metric).record_]
