"""The report's one rule for "the best" (`specray/report/best.py`): decided on the mean over training
replicates, ties to the smaller γ, every replicate's row kept."""

from __future__ import annotations

import math

import pandas as pd

from specray.report.best import best_gamma, best_gamma_records, best_rows
from specray.specdec.records import CellRecord


def _row(draft: str, gamma: int, speedup: float, replicate: int = 0, **rest: object) -> dict:
    name = f"{draft}/r{replicate}" if replicate else draft
    return {"draft": name, "recipe": draft, "replicate": replicate, "test_set": "t", "tau_dec": 0.5} | {
        "estimator": "analytic",
        "gamma": gamma,
        "speedup_model": speedup,
        **rest,
    }


def test_the_best_gamma_is_chosen_on_the_mean_over_replicates_and_keeps_every_replicate() -> None:
    """γ 6 has the best single replicate (2.0) but γ 4 the best mean (1.6 against 1.45)."""
    rows = [_row("a", 4, 1.6, 0), _row("a", 4, 1.6, 1), _row("a", 6, 2.0, 0), _row("a", 6, 0.9, 1)]
    best = best_gamma(pd.DataFrame(rows))
    assert best.gamma.tolist() == [4, 4] and best.draft.tolist() == ["a", "a/r1"]


def test_a_tie_goes_to_the_smaller_gamma_and_an_unmeasured_cell_has_no_best() -> None:
    rows = [_row("a", 6, 1.5), _row("a", 4, 1.5), _row("b", 4, math.nan), _row("b", 6, math.nan)]
    best = best_gamma(pd.DataFrame(rows))
    assert best[["draft", "gamma"]].values.tolist() == [["a", 4]]


def test_lossy_cells_are_chosen_within_their_epsilon_and_the_best_draft_over_drafts() -> None:
    rows = [
        _row("a", g, s, epsilon=e, lenience="lin")
        for g, s, e in ((4, 1.0, 1.0), (6, 1.2, 1.0), (4, 2.0, 0.5))
    ]
    rows += [_row("b", 4, 1.1, epsilon=1.0, lenience="lin")]
    best = best_gamma(pd.DataFrame(rows))
    assert sorted(zip(best.draft, best.epsilon, best.gamma, strict=True)) == [
        ("a", 0.5, 4),
        ("a", 1.0, 6),
        ("b", 1.0, 4),
    ]
    top = best_rows(pd.DataFrame(rows), "speedup_model", (), ("draft", "gamma", "epsilon"))
    assert (top.draft.item(), top.epsilon.item()) == ("a", 0.5)


def test_records_are_chosen_by_the_same_rule() -> None:
    """What the tune's objective reads: each analytic record at its best γ, other estimators left out."""

    def record(gamma: int, speedup: float, estimator: str = "analytic") -> CellRecord:
        return CellRecord(
            "a", "k", "t", 0.5, estimator, gamma, f"{gamma}{estimator}", 0.1, 1.0, {"speedup_model": speedup}
        )

    records = [record(4, 1.2), record(6, 1.4), record(6, 3.0, "empirical")]
    assert best_gamma_records(records) == [records[1]]
    assert best_gamma_records([]) == []
