"""The routing plan's bands (serving/bands.py) and choices (serving/plan.py), and the router reading them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specray.draft import replicate_name
from specray.errors import SpecError
from specray.serving.bands import Band, batch_bands, given_bands, grid_bands
from specray.serving.engines import VLLM_OPEN_BATCH_END
from specray.serving.export import band_entry, write_engines
from specray.serving.plan import Route as BandRoute
from specray.serving.plan import plan_batched
from specray.serving.readme import export_readme
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
    assert router.route(0.3, batch_size=64) == router.route(0.3)  # no per-batch entries: one γ for all
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite number >= 0"):
            router.route(bad)


def test_bands_must_cover_from_zero(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="start at 0"):
        Router([0.2, 0.5], [Route(None, None)] * 2, ["a", "b"])


def band_routes(cells: list[CellRecord], **options: Any) -> list[BandRoute]:
    """Each temperature band's route at the smallest batch size the cells modelled (B = 1 here): the
    first column of the plan the export writes."""
    return [plan.route for plan in plan_batched(cells, **options)]


def test_the_fastest_draft_whose_interval_clears_one_wins() -> None:
    cells = [
        analytic("fast-but-unsure", 0.6, 4, block_efficiency=2.0, ci95=1.0),  # 2/1.4 = 1.43 ± 1.0
        analytic("steady", 0.6, 4, block_efficiency=1.8, ci95=0.05),  # 1.29 ± 0.04
        analytic("steady", 0.6, 2, block_efficiency=1.3, ci95=0.05),  # 1.08 ± 0.04
    ]
    (route,) = band_routes(cells)
    assert route.basis == "modelled"
    assert (route.choice.draft, route.choice.gamma) == ("steady", 4)
    assert route.choice.speedup.value == pytest.approx(1.8 / 1.4)
    assert route.choice.expected["draft_acceptance_hf"] == 0.4


def test_no_speculation_when_every_lower_end_is_at_most_one() -> None:
    cells = [analytic("slow", 1.0, 4, block_efficiency=1.5, ci95=0.2), analytic("slower", 1.0, 2, 1.1)]
    (route,) = band_routes(cells)
    assert route.choice is None
    assert route.best.draft == "slow"  # 1.5 / 1.4 = 1.07, but ± 0.14 reaches below 1
    assert "no speculation" in route.reason and "lower end 0.929 ≤ 1" in route.reason
    (lenient,) = band_routes(cells, min_speedup=0.5)
    assert lenient.choice.draft == "slow"


def test_a_lucky_replicate_does_not_win_a_band_over_a_recipe_with_the_better_mean() -> None:
    # recipe a: two good trainings (block efficiency 2.0, 1.9) and a poor one; recipe b: three steady ones
    # whose mean is higher (1.683 vs 1.633), though each is below a's best two
    efficiencies = {"a": (2.0, 1.9, 1.0), "b": (1.7, 1.7, 1.65)}
    cells = [
        analytic(replicate_name(recipe, r), 1.0, 4, e)
        for recipe, values in efficiencies.items()
        for r, e in enumerate(values)
    ]
    (alone,) = band_routes([c for c in cells if c.draft in ("a", "b")])  # one replicate each
    assert alone.choice.draft == "a"  # 2.0 beats 1.7: what choosing among single draws gives
    (route,) = band_routes(cells)  # neither a's best draw nor the draw closest to a's mean (1.9) wins
    assert route.choice.draft == "b"  # of b's, the replicate closest to b's mean
    assert route.choice.replicates == 3
    assert route.choice.recipe_speedup == pytest.approx(np.mean(efficiencies["b"]) / 1.4)
    assert route.choice.speedup.value == pytest.approx(1.7 / 1.4)  # what the served replicate itself does
    assert "closest to its recipe's mean 1.202 over 3" in route.reason
    (only_a,) = band_routes([c for c in cells if c.draft.startswith("a")])
    assert only_a.choice.draft == "a/r1"  # closest to a's mean 1.633: 1.9, not the luckiest 2.0


def test_measured_speedups_decide_where_the_sweep_timed_the_band() -> None:
    cells = [
        analytic("modelled-best", 0.6, 4, block_efficiency=3.0),
        analytic("timed", 0.6, 4, block_efficiency=2.0),
        cell("timed", 0.6, 4, "empirical", speedup=1.3, speedup_ci95=0.1),
    ]
    (route,) = band_routes(cells)
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
    (route,) = band_routes(cells, edges=[0])
    assert route.choice.draft == "even"
    assert band_routes(cells, edges=[0, 0.3])[0].choice.draft == "peaky"
    (worst,) = [r for r in band_routes(cells, edges=[0]) if r.choice]
    assert worst.choice.speedup.tau_dec in (0.2, 0.4)


def batched(draft: str, tau: float, gamma: int, speedups: dict[int, tuple[float, float]]) -> CellRecord:
    """An analytic cell with its modelled speedup (value, 95% half-width) at each batch size."""
    record = analytic(draft, tau, gamma, block_efficiency=2.0)
    record.metrics["speedup_model_by_batch"] = {str(b): v for b, (v, _) in speedups.items()}
    record.metrics["speedup_model_by_batch_ci95"] = {str(b): ci for b, (_, ci) in speedups.items()}
    return record


def sweep_at_three_batch_sizes() -> list[CellRecord]:
    """Drafts a, b at γ 2, 4 and B 1, 4, 16, τ_dec 0.2, 0.8, 1.5 (bands [0, 0.5), [0.5, 1.15), [1.15, ∞))."""
    s = 0.05
    return [
        # τ 0.2: a γ4 wins at B 1 and 4; b γ4 is fastest at B 16, but the band holds a: a γ2 there
        batched("a", 0.2, 4, {1: (2.0, s), 4: (1.5, s), 16: (0.9, s)}),
        batched("a", 0.2, 2, {1: (1.6, s), 4: (1.4, s), 16: (1.1, s)}),
        batched("b", 0.2, 4, {1: (1.8, s), 4: (1.45, s), 16: (1.3, s)}),
        batched("b", 0.2, 2, {1: (1.5, s), 4: (1.3, s), 16: (1.2, s)}),
        # τ 0.8: a γ4 at B 1; nothing's interval clears 1 at B 4 or 16: γ = 0
        batched("a", 0.8, 4, {1: (1.3, s), 4: (1.05, 0.1), 16: (0.8, s)}),
        batched("a", 0.8, 2, {1: (1.2, s), 4: (1.02, 0.1), 16: (0.9, s)}),
        batched("b", 0.8, 4, {1: (1.1, 0.2), 4: (0.9, s), 16: (0.7, s)}),
        # τ 1.5: no speculation at B 1, so none at any B, though a γ2 would clear 1 at B 4
        batched("a", 1.5, 2, {1: (0.95, 0.02), 4: (1.2, 0.02), 16: (1.1, 0.02)}),
    ]


def test_batch_bands_start_at_one_and_split_at_each_modelled_batch_size() -> None:
    bands = batch_bands([16, 1, 4])
    assert [(b.low, b.high, b.batch_size) for b in bands] == [(1, 4, 1), (4, 16, 4), (16, None, 16)]
    assert [b.label for b in bands] == ["[1, 4)", "[4, 16)", "[16, ∞)"]
    assert batch_bands([2, 8])[0].low == 1  # the first band starts at 1 whatever the smallest B
    assert bands[1].contains(4) and not bands[0].contains(4) and bands[2].contains(10_000)


def test_a_gamma_per_batch_band_with_one_draft_per_temperature_band() -> None:
    plans = plan_batched(sweep_at_three_batch_sizes())
    assert [p.band.label for p in plans] == ["[0, 0.5)", "[0.5, 1.15)", "[1.15, ∞)"]
    table = [[(r.route.choice.draft if r.route.choice else None, r.gamma) for r in p.batches] for p in plans]
    assert table == [
        [("a", 4), ("a", 4), ("a", 2)],
        [("a", 4), (None, 0), (None, 0)],
        [(None, 0), (None, 0), (None, 0)],
    ]
    low = plans[0]
    assert low.route is low.batches[0].route and low.route.choice.speedup.value == 2.0
    assert low.batches[2].route.choice.speedup.value == 1.1  # modelled at B 16
    assert "one draft per deployment (a, chosen at B=1)" in low.batches[2].reason
    assert "best at B=16 is (b, γ=4)" in low.batches[2].reason
    assert (
        "no speculation" in plans[1].batches[1].reason and "lower end 0.950 ≤ 1" in plans[1].batches[1].reason
    )
    held = plans[2].batches[1].reason
    assert "chosen at B=1, where none cleared 1" in held and "(a, γ=2)" in held


def test_export_writes_the_per_batch_table_vllm_schedule_and_router_edges(tmp_path: Path) -> None:
    plans = plan_batched(sweep_at_three_batch_sizes())
    folders = {"key-a": "a", "key-b": "b"}
    bands = [band_entry(p, folders) for p in plans]
    low, mid, high = bands
    # the band's own fields: the smallest batch size's, as format 1 wrote them
    assert (low["route"], low["draft"], low["gamma"]) == ("speculative", "drafts/a", 4)
    assert (high["route"], high["gamma"]) == ("none", None)
    assert [(e["low"], e["high"], e["batch_size"], e["gamma"]) for e in low["batch_sizes"]] == [
        (1, 4, 1, 4),
        (4, 16, 4, 4),
        (16, None, 16, 2),
    ]
    last = low["batch_sizes"][2]
    assert last["draft"] == "drafts/a" and last["speedup"]["value"] == 1.1
    assert last["speedup"]["low"] == pytest.approx(1.05) and "one draft per deployment" in last["reason"]
    assert [e["gamma"] for e in mid["batch_sizes"]] == [4, 0, 0] and mid["batch_sizes"][1]["draft"] is None
    assert mid["batch_sizes"][1]["best_candidate"]["draft_name"] == "a"

    plan = {
        "sweep": {"name": "s", "source": "outputs/s", "spec_key": "k", "test_set": "in_domain"},
        "target": {"name_or_path": "org/target", "architectures": ["X"], "vocab_size": 8},
        "step_costs_summary": "c = 0.1",
        "rule": {"min_speedup": 1.0},
        "engines": {"vllm": "0.33.0", "sglang": "0.5.23"},
        "bands": bands,
    }
    write_engines(plan, tmp_path)
    vllm_low = json.loads((tmp_path / "vllm" / f"{low['alias']}.json").read_text())
    assert vllm_low["num_speculative_tokens"] == 4
    assert vllm_low["num_speculative_tokens_per_batch_size"] == [
        [1, 3, 4],
        [4, 15, 4],
        [16, VLLM_OPEN_BATCH_END, 2],
    ]
    vllm_mid = json.loads((tmp_path / "vllm" / f"{mid['alias']}.json").read_text())
    assert vllm_mid["num_speculative_tokens_per_batch_size"] == [
        [1, 3, 4],
        [4, 15, 0],
        [16, VLLM_OPEN_BATCH_END, 0],
    ]
    assert not (tmp_path / "vllm" / f"{high['alias']}.json").exists()
    sglang = json.loads((tmp_path / "sglang" / f"{low['alias']}.json").read_text())
    assert sglang[sglang.index("--speculative-num-steps") + 1] == "4"  # one γ: the smallest batch size's

    readme = export_readme(plan)
    assert "## γ per batch size" in readme
    assert "| band (τ) | draft | B [1, 4) | B [4, 16) | B [16, ∞) |" in readme
    assert "| [0, 0.5) | a | 4 (2.000 ± 0.050) | 4 (1.500 ± 0.050) | 2 (1.100 ± 0.050) |" in readme
    assert "| [1.15, ∞) | - | 0 | 0 | 0 |" in readme

    (tmp_path / "drafts" / "a").mkdir(parents=True)
    path = tmp_path / "routing.json"
    path.write_text(json.dumps(plan))
    router = Router.from_file(path)
    a = tmp_path / "drafts" / "a"
    assert router.route(0.2) == router.route(0.2, 1) == (a, 4)
    assert router.route(0.2, 3) == (a, 4)
    assert router.route(0.2, 4) == (a, 4)  # a batch size on an edge belongs to the band above it
    assert router.route(0.2, 15) == (a, 4)
    assert router.route(0.2, 16) == (a, 2)
    assert router.route(0.2, 10_000) == (a, 2)  # the last batch band is open above
    assert router.route(0.49, 16) == (a, 2) and router.route(0.5, 16) == (None, None)
    assert router.route(0.5, 1) == (a, 4) and router.route(0.5, 4) == (None, None)  # γ = 0
    assert router.route(2.0, 8) == (None, None)
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(ValueError, match="batch size must be an integer >= 1"):
            router.route(0.2, bad)


def test_a_batch_size_below_the_first_edge_takes_the_first_batch_band(tmp_path: Path) -> None:
    entry = {"route": "speculative", "draft": "drafts/a"}
    band = {"low": 0.0, "high": None, "alias": "tau-0", "tau_decs": [0.0], **entry, "gamma": 5}
    band["batch_sizes"] = [
        {"low": 2, "high": 8, **entry, "gamma": 5},
        {"low": 8, "high": None, "route": "none", "draft": None, "gamma": 0},
    ]
    path = tmp_path / "routing.json"
    path.write_text(json.dumps({"bands": [band]}))
    router = Router.from_file(path)
    assert router.route(0.3, 1) == router.route(0.3, 7) == (tmp_path / "drafts/a", 5)
    assert router.route(0.3, 8) == (None, None)
