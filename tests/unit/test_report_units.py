"""The report's speedup in the papers' units and its convergence table, on constructed cells and curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specray.distill.curves import CurvePoint
from specray.names import BASELINE
from specray.report.convergence import convergence_table, projected_heading
from specray.report.speedup_units import MEASURED, MODELLED, speedup_heatmaps, speedup_in_units


def _cell(draft: str, tau_dec: float, estimator: str, gamma: int, **metrics: float) -> dict:
    paradigm = BASELINE if draft == BASELINE else draft.split("/")[0]
    tau_kd = None if draft == BASELINE else float(draft.split("=")[1])
    row = {"draft": draft, "paradigm": paradigm, "tau_kd": tau_kd, "test_set": "in_domain"}
    return row | {"tau_dec": tau_dec, "estimator": estimator, "gamma": gamma, **metrics}


CELLS = pd.DataFrame(
    [
        _cell(BASELINE, 1.0, "analytic", 4, speedup_model=0.8),
        _cell(BASELINE, 1.0, "empirical", 4, speedup=0.7),  # measured: shown instead of 0.8
        _cell("online/tau_kd=1", 1.0, "analytic", 4, speedup_model=1.1),
        _cell("online/tau_kd=1", 1.0, "analytic", 6, speedup_model=1.3),  # the best γ is shown
        _cell("online/tau_kd=1", 0.0, "analytic", 4, speedup_model=1.2),
        _cell("online/tau_kd=1", 0.0, "empirical", 4, speedup=float("nan")),  # no measurement: modelled
    ]
)


def test_measured_speedup_wins_and_the_rest_is_modelled_at_the_best_gamma() -> None:
    shown = speedup_in_units(CELLS).set_index(["draft", "tau_dec"])
    assert shown.loc[(BASELINE, 1.0), ["shown", "source"]].tolist() == [0.7, MEASURED]
    assert shown.loc[("online/tau_kd=1", 1.0), ["shown", "source"]].tolist() == [1.3, MODELLED]
    assert shown.loc[("online/tau_kd=1", 0.0), ["shown", "source"]].tolist() == [1.2, MODELLED]
    assert len(shown) == 3


def test_without_empirical_cells_everything_is_modelled(tmp_path: Path) -> None:
    analytic = CELLS[CELLS.estimator == "analytic"].drop(columns="speedup")
    assert set(speedup_in_units(analytic).source) == {MODELLED}
    (path,) = speedup_heatmaps(CELLS, tmp_path)
    assert path.name == "heatmap_speedup_measured_or_modelled_in_domain.png" and path.stat().st_size > 0


def test_convergence_table_and_projection_heading() -> None:
    rising = [CurvePoint(s, acceptance={1.0: 0.5 + 0.001 * s}) for s in range(0, 401, 10)]
    flat = [CurvePoint(s, acceptance={1.0: 0.6}) for s in range(0, 401, 10)]
    table = convergence_table({"online/tau_kd=1": rising, "offline/tau_kd=1": flat, "short": rising[:3]})
    rows = table.set_index("draft")
    assert rows.loc["online/tau_kd=1", "slope per 100 steps"] == "+0.1000"
    assert rows.loc["online/tau_kd=1", "flat"] == "no" and rows.loc["offline/tau_kd=1", "flat"] == "yes"
    assert rows.loc["online/tau_kd=1", "window"] == "300–400 (11 points)"
    assert rows.loc["short", "window"] == "too few points"
    assert "13B" in projected_heading(0.05) and "c = 0.05" in projected_heading(0.05)
