"""The routing plan's bands and choices (serving/plan.py) and the router that reads them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specray.errors import SpecError
from specray.serving.plan import Band, given_bands, grid_bands, plan_routes
from specray.serving.router import Route, Router
from specray.specdec.records import CellRecord, StepCosts


def cell(draft: str, tau: float, gamma: int, estimator: str, **metrics: float) -> CellRecord:
    key = f"{draft}|{tau}|{gamma}|{estimator}"
    return CellRecord(
        draft, f"key-{draft}", "in_domain", tau, estimator, gamma, key, None, 0.0, dict(metrics)
    )


def analytic(draft: str, tau: float, gamma: int, block_efficiency: float, ci95: float = 0.01) -> CellRecord:
    """An analytic cell whose speedup is the papers' model at c = 0.1: block efficiency / (0.1·γ + 1)."""
    costs = StepCosts.fixed(0.1, gammas=[gamma])
    speedup = costs.speedup(block_efficiency, gamma)
    speedup_ci = costs.speedup_ci95(block_efficiency, ci95, gamma)
    record = cell(
        draft, tau, gamma, "analytic",
        block_efficiency_sampled=block_efficiency, block_efficiency_sampled_ci95=ci95, acceptance_rate=0.5,
        draft_acceptance_hf=0.4, mean_acceptance_length=block_efficiency, speedup_model=speedup,
    )  # fmt: skip
    record.metrics.update(
        {"speedup_model_by_batch": {"1": speedup}, "speedup_model_by_batch_ci95": {"1": speedup_ci}}
    )
    return record


def test_grid_bands_split_at_midpoints_from_zero() -> None:
    bands = grid_bands([0.0, 0.2, 0.6, 1.0, 2.0])
    assert [(b.low, b.high) for b in bands] == [(0.0, 0.1), (0.1, 0.4), (0.4, 0.8), (0.8, 1.5), (1.5, None)]
    assert [b.tau_decs for b in bands] == [(0.0,), (0.2,), (0.6,), (1.0,), (2.0,)]
    assert [b.alias for b in bands] == ["tau-0", "tau-0_2", "tau-0_6", "tau-1", "tau-2"]


def test_given_bands_need_a_measurement_each_and_start_at_zero() -> None:
    bands = given_bands([0, 0.5, 1.2], [0.0, 0.2, 0.6, 1.0, 2.0])
    assert [b.tau_decs for b in bands] == [(0.0, 0.2), (0.6, 1.0), (2.0,)]
    assert bands[1].alias == "tau-0_5-1_2" and bands[2].label == "[1.2, ∞)"
    with pytest.raises(SpecError, match=r"\[0.3, 0.5\) holds none"):
        given_bands([0, 0.3, 0.5], [0.0, 0.6])
    with pytest.raises(SpecError, match="start at 0 and increase"):
        given_bands([0.1, 0.5], [0.2])


def write_plan(folder: Path, bands: list[Band], routes: list[Route]) -> Path:
    entries = [
        {"low": b.low, "high": b.high, "alias": b.alias, "tau_decs": list(b.tau_decs)}
        | (
            {"route": "speculative", "draft": str(r.draft_dir), "gamma": r.gamma}
            if r.gamma
            else {"route": "none"}
        )
        for b, r in zip(bands, routes, strict=True)
    ]
    path = folder / "routing.json"
    path.write_text(json.dumps({"bands": entries}))
    return path


def test_router_band_edges_and_the_no_speculation_band(tmp_path: Path) -> None:
    bands = grid_bands([0.0, 0.6, 1.0])  # [0, 0.3), [0.3, 0.8), [0.8, ∞)
    routes = [Route(Path("drafts/a"), 5), Route(Path("drafts/b"), 3), Route(None, None)]
    router = Router.from_file(write_plan(tmp_path, bands, routes))
    assert router.route(0.0) == (tmp_path / "drafts/a", 5)
    assert router.route(0.29999) == (tmp_path / "drafts/a", 5)
    assert router.route(0.3) == (tmp_path / "drafts/b", 3)  # an edge belongs to the band above it
    assert router.route(0.8) == (None, None)  # no speculation: the target decodes alone
    assert router.route(7.0) == (None, None)  # the last band has no upper edge
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number >= 0"):
            router.route(bad)


def test_bands_must_cover_from_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start at 0"):
        Router([0.2, 0.5], [Route(None, None)] * 2, ["a", "b"])


def test_the_fastest_draft_whose_interval_clears_one_wins() -> None:
    cells = [
        analytic("fast-but-unsure", 0.6, 4, block_efficiency=2.0, ci95=1.0),  # 2/1.4 = 1.43 ± 1.0
        analytic("steady", 0.6, 4, block_efficiency=1.8, ci95=0.05),  # 1.29 ± 0.04
        analytic("steady", 0.6, 2, block_efficiency=1.3, ci95=0.05),  # 1.08 ± 0.04
    ]
    (route,) = plan_routes(cells)
    assert route.basis == "modelled"
    assert (route.choice.draft, route.choice.gamma) == ("steady", 4)
    assert route.choice.speedup.value == pytest.approx(1.8 / 1.4)
    assert route.choice.expected["draft_acceptance_hf"] == 0.4


def test_no_speculation_when_every_lower_end_is_at_most_one() -> None:
    cells = [analytic("slow", 1.0, 4, block_efficiency=1.5, ci95=0.2), analytic("slower", 1.0, 2, 1.1)]
    (route,) = plan_routes(cells)
    assert route.choice is None
    assert route.best.draft == "slow"  # 1.5 / 1.4 = 1.07, but ± 0.14 reaches below 1
    assert "no speculation" in route.reason and "lower end 0.929 ≤ 1" in route.reason
    (lenient,) = plan_routes(cells, min_speedup=0.5)
    assert lenient.choice.draft == "slow"


def test_measured_speedups_decide_where_the_sweep_timed_the_band() -> None:
    cells = [
        analytic("modelled-best", 0.6, 4, block_efficiency=3.0),
        analytic("timed", 0.6, 4, block_efficiency=2.0),
        cell("timed", 0.6, 4, "empirical", speedup=1.3, speedup_ci95=0.1),
    ]
    (route,) = plan_routes(cells)
    assert route.basis == "measured"
    assert route.choice.draft == "timed" and route.choice.speedup.value == 1.3
    assert route.choice.expected["estimator"] == "analytic"  # acceptance from the analytic cell beside it


def test_a_band_of_several_measurements_is_judged_at_its_worst() -> None:
    cells = [
        analytic("even", 0.2, 4, 1.8),
        analytic("even", 0.4, 4, 1.8),
        analytic("peaky", 0.2, 4, 2.6),
        analytic("peaky", 0.4, 4, 1.6),
    ]
    (route,) = plan_routes(cells, edges=[0])
    assert route.choice.draft == "even"
    assert plan_routes(cells, edges=[0, 0.3])[0].choice.draft == "peaky"
    (worst,) = [r for r in plan_routes(cells, edges=[0]) if r.choice]
    assert worst.choice.speedup.tau_dec in (0.2, 0.4)
