"""The pure parts of `specray tune`: search space -> mixture, the manual recipe, the signals, Table 3."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from specray.config import load_spec
from specray.distill.curves import CurvePoint
from specray.errors import SpecError
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.tune.baselines import (
    Contenders,
    best_single,
    manual_recipe,
    peaks,
    relative_gain,
    table3,
    table3_markdown,
)
from specray.sweep.tune.search import _curve_point
from specray.sweep.tune.space import (
    MIN_SCORE,
    MIN_SHARE,
    acceptance_estimate,
    baseline_recipe,
    budget_spec,
    check_tune,
    mixture_from_config,
    normalise,
    objective,
    recipe_from_config,
    search_space,
    speedup_estimate,
    top_k,
    weight_param,
)
from specray.sweep.tune.trial import MEASURED, OBJECTIVE, progress_metrics
from tests.conftest import REPO

GRID = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]


def tiny(*overrides: str):
    return load_spec(REPO / "sweeps" / "tune_tiny.yaml", list(overrides))


# ---------------------------------------------------------------- search space -> mixture


def test_normalise_gives_shares_that_sum_to_one_without_small_ones() -> None:
    shares = normalise({0.0: 0.01, 0.5: 1.0, 1.0: 3.0})
    assert shares == {0.5: 0.25, 1.0: 0.75}  # 0.0 had 0.2% of the data: dropped, the rest renormalised
    assert sum(normalise({t: 1.0 + t for t in GRID}).values()) == pytest.approx(1.0, abs=1e-2)
    assert all(share >= MIN_SHARE for share in normalise({t: t for t in GRID}).values())


def test_normalise_keeps_the_best_and_mixes_equally_when_nothing_is_preferred() -> None:
    assert normalise({0.0: 0.0, 0.5: 1e-9, 1.0: 0.0}) == {0.5: 1.0}
    assert normalise({0.0: 0.0, 1.0: 0.0}) == {0.0: 0.5, 1.0: 0.5}
    assert normalise({0.0: -1.0, 1.0: 2.0}) == {1.0: 1.0}  # negative scores count as 0


def test_top_k_takes_the_highest_scores_with_equal_weights() -> None:
    assert top_k({0.0: 0.2, 0.5: 0.9, 1.0: 0.7}, 2) == {0.5: 1.0, 1.0: 1.0}
    assert top_k({0.0: 0.5, 0.5: 0.5, 1.0: 0.1}, 1) == {0.0: 1.0}  # a tie goes to the lower τ_kd


def test_a_trial_config_maps_to_its_mixture_in_both_spaces() -> None:
    config = {weight_param(t): s for t, s in zip(GRID, [0.0] * 8 + [0.2, 0.5, 0.3], strict=True)}
    assert mixture_from_config(config, GRID, "weights", 3) == {0.8: 0.2, 0.9: 0.5, 1.0: 0.3}
    assert mixture_from_config(config, GRID, "subset", 2) == {0.9: 1.0, 1.0: 1.0}
    assert weight_param(0.1) == "w_tau_kd_0.1" and "/" not in weight_param(1.0)


def test_a_recipe_carries_the_searched_settings_and_the_shared_budget() -> None:
    spec = tiny("tune.steps=40", "tune.paradigms=[offline,online]", "tune.divergences=[fkl,rkl]")
    config = {weight_param(t): 1.0 for t in GRID} | {"paradigm": "online", "divergence": "rkl"}
    recipe = recipe_from_config(spec, config)
    assert recipe.paradigm == "online" and recipe.distill == {"steps": 40, "divergence": "rkl"}
    assert recipe.name.startswith("online/mix=0:0.091,")
    trained = budget_spec(spec, recipe)
    assert trained.distill.steps == 40 and trained.distill.divergence == "rkl"
    longer_online = budget_spec(tiny("tune.steps=40", "distill.online_steps=600"), recipe)
    assert longer_online.for_paradigm("online").distill.steps == 40  # one budget, whatever the paradigm
    baseline = baseline_recipe(spec, {0.9: 1.0})
    assert (
        baseline.paradigm == "offline"
        and baseline.distill == {"steps": 40}
        and baseline.mixture_tag == "0.9:1"
    )
    assert baseline_recipe(tiny(), {0.9: 1.0}).distill == {"steps": 100}  # None = distill.steps
    with pytest.raises(ValidationError):
        budget_spec(spec, recipe.__class__("offline", {0.9: 1.0}, {"divergence": "l2"}))


def test_the_search_space_has_a_score_per_tau_kd_and_choices_only_when_asked() -> None:
    from ray.tune.search.sample import Categorical, Float, LogUniform

    space = search_space(tiny())
    assert sorted(space) == sorted(weight_param(t) for t in GRID)
    assert all(isinstance(v, Float) and (v.lower, v.upper) == (MIN_SCORE, 1.0) for v in space.values())
    assert all(isinstance(v.get_sampler(), LogUniform) for v in space.values())
    searched = search_space(tiny("tune.divergences=[fkl,jsd]", "tune.onpolicy_fractions=[0.25]"))
    assert isinstance(searched["divergence"], Categorical) and searched["divergence"].categories == [
        "fkl",
        "jsd",
    ]
    assert searched["onpolicy_fraction"] == 0.25 and "paradigm" not in searched


# ---------------------------------------------------------------- baselines


@pytest.mark.parametrize(
    ("peak", "k", "expected"),
    [
        (0.5, 3, [0.4, 0.5, 0.6]),
        (0.0, 3, [0.0, 0.1, 0.2]),  # at the low edge: shifted inward
        (1.0, 3, [0.8, 0.9, 1.0]),  # at the high edge
        (0.9, 3, [0.8, 0.9, 1.0]),
        (0.5, 1, [0.5]),
        (0.5, 2, [0.5, 0.6]),  # even k: the extra τ_kd on the high side
        (0.5, 20, GRID),  # k beyond the grid: all of it
    ],
)
def test_the_manual_recipe_is_the_top_k_around_the_peak(peak: float, k: int, expected: list[float]) -> None:
    assert manual_recipe(GRID, peak, k) == dict.fromkeys(expected, 1.0)


def test_the_manual_recipe_needs_a_peak_on_the_grid() -> None:
    with pytest.raises(ValueError, match="0.55 is not in the grid"):
        manual_recipe(GRID, 0.55)


def test_the_peak_is_chosen_per_tau_dec_with_ties_to_the_lower_tau_kd() -> None:
    assert best_single({0.2: 1.5, 0.8: 1.7, 0.9: 1.7}) == 0.8
    records = [
        _record(d, s, f"offline/tau_kd={t:g}")
        for t, d, s in [(0.0, 0.8, 1.1), (1.0, 0.8, 1.3), (0.0, 1.0, 1.2), (1.0, 1.0, 1.0)]
    ] + [_record(0.8, 9.0, "non-distill")]  # not a single τ_kd draft: ignored
    tau_kd_of = {"offline/tau_kd=0": 0.0, "offline/tau_kd=1": 1.0}
    assert peaks(records, tau_kd_of) == {0.8: 1.0, 1.0: 0.0}


# ---------------------------------------------------------------- signals


def _record(
    tau_dec: float,
    speedup: float,
    draft: str = "d",
    test_set: str = "validation",
    alpha: float = 0.5,
    gamma: int = 3,
) -> CellRecord:
    metrics = {"speedup_model": speedup, "acceptance_rate": alpha}
    return CellRecord(
        draft, "K", test_set, tau_dec, "analytic", gamma, f"{draft}{tau_dec}{gamma}", 0.1, 0.0, metrics
    )


def test_the_objective_is_the_mean_speedup_over_the_objective_temperatures() -> None:
    records = [_record(0.6, 9.0), _record(0.8, 1.2), _record(1.0, 1.6)]
    assert objective(records, [0.8, 1.0]) == pytest.approx(1.4)
    with pytest.raises(ValueError, match=r"no analytic record at τ_dec \[0.4\]"):
        objective(records, [0.4, 1.0])


def test_the_asha_signal_and_the_objective_estimate_come_from_the_probe() -> None:
    curve = CurvePoint(20, loss=2.0, acceptance={0.8: 0.6, 1.0: 0.4})
    assert acceptance_estimate(curve, [0.8, 1.0]) == pytest.approx(0.5)
    assert acceptance_estimate(curve, [0.6]) is None
    perfect = CurvePoint(20, acceptance={1.0: 1.0})
    assert speedup_estimate(perfect, [1.0], costs=StepCosts.fixed(0.25), gammas=[4]) == pytest.approx(
        5 / 2
    )  # (γ+1)/(cγ+1)
    assert speedup_estimate(
        CurvePoint(20, acceptance={1.0: 0.0}), [1.0], costs=StepCosts.fixed(0.0), gammas=[4]
    ) == pytest.approx(1.0)


def test_progress_results_carry_both_searcher_metrics_and_mlflow_safe_names() -> None:
    spec = tiny()
    curve = CurvePoint(20, loss=2.0, acceptance={0.8: 0.6, 1.0: 0.4})
    result = progress_metrics(curve, spec, step_costs=StepCosts.fixed(0.1))
    assert result["step"] == 20 and result["acceptance_estimate"] == pytest.approx(0.5)
    assert result[MEASURED] == 0 and result[OBJECTIVE] > 1.0
    assert "acceptance_rate/tau_dec_0.8" in result and not any("=" in key for key in result)
    first = progress_metrics(
        CurvePoint(0), spec, step_costs=StepCosts.fixed(0.1)
    )  # no probe values: NaN, never missing
    assert math.isnan(first["acceptance_estimate"]) and math.isnan(first[OBJECTIVE])
    point = _curve_point(result | {"time_total_s": 3.0, "trial_id": "x"})
    assert point == {
        "step": 20,
        "loss": 2.0,
        "acceptance_rate/tau_dec_0.8": 0.6,
        "acceptance_rate/tau_dec_1": 0.4,
        "acceptance_estimate": pytest.approx(0.5),
        "objective_estimate": pytest.approx(result[OBJECTIVE]),
    }


# ---------------------------------------------------------------- Table 3


def test_table3_reports_each_contender_and_its_gain_over_the_best_single_tau_kd() -> None:
    contenders = Contenders(
        tuned="tuned:x",
        single={0.8: "s8", 1.0: "s9"},
        manual={0.8: "m", 1.0: "m"},
        labels={"s8": "0.8", "s9": "0.9", "m": "0.8+0.9+1", "tuned:x": "0.7:0.5,1:0.5"},
    )
    speedups = {"s8": (1.0, 2.0), "s9": (1.5, 1.6), "m": (1.1, 1.8), "tuned:x": (1.2, 2.4)}
    records = [
        _record(tau, speedups[draft][i], draft, test_set)
        for draft in speedups
        for test_set in ("in_domain", "out_of_domain")
        for i, tau in enumerate((0.8, 1.0))
    ]
    frame = table3(records, contenders)
    assert list(frame.test_set) == ["in_domain", "in_domain", "out_of_domain", "out_of_domain"]
    row = frame[(frame.test_set == "in_domain") & (frame.tau_dec == 1.0)].iloc[0]
    assert row["single tau_kd"] == "0.9" and row["single speedup_model"] == 1.6
    assert (row["single draft"], row["manual draft"], row["tuned draft"]) == ("s9", "m", "tuned:x")
    assert row["manual gain"] == pytest.approx(1.8 / 1.6 - 1)
    assert row["tuned gain"] == pytest.approx(0.5) and row["tuned gain vs manual"] == pytest.approx(
        2.4 / 1.8 - 1
    )
    markdown = table3_markdown(frame, "0.7:0.5,1:0.5", "Table 3")
    assert "| in_domain | 1 | 0.9 | 0.500 | 1.600 | 0.8+0.9+1 |" in markdown and "+50.0%" in markdown
    assert math.isnan(relative_gain(1.0, 0.0))


def test_table3_shows_the_mean_over_a_contenders_replicates() -> None:
    contenders = Contenders(
        tuned="tuned:x", single={1.0: "s"}, manual={1.0: "m"}, labels={"s": "1", "m": "0.9+1", "tuned:x": "x"}
    )
    replicates = {"s": (1.0, 1.2), "m": (1.1, 1.3), "tuned:x": (1.4, 1.0)}
    names = {recipe: [recipe, f"{recipe}/r1"] for recipe in replicates}
    records = [
        _record(1.0, speedup, names[recipe][r], "in_domain")
        for recipe, speedups in replicates.items()
        for r, speedup in enumerate(speedups)
    ]
    recipes = {name: recipe for recipe, both in names.items() for name in both}
    (row,) = table3(records, contenders, recipes).to_dict("records")
    assert row["single speedup_model"] == pytest.approx(1.1) and row["manual speedup_model"] == pytest.approx(
        1.2
    )
    assert row["tuned gain"] == pytest.approx(1.2 / 1.1 - 1)
    assert (row["single draft"], row["manual draft"], row["tuned draft"]) == ("s", "m", "tuned:x")


# ---------------------------------------------------------------- the edge


def test_tune_settings_are_checked_before_any_work() -> None:
    check_tune(tiny())
    problems = {
        "tune.objective_temperatures=[0.6,1.0]": r"\[0.6\] not in eval.temperatures \[0.8, 1.0\]",
        "tune.space=subset tune.subset_size=12": "tune.subset_size: must be between 1 and 11",
        "tune.asha_grace_period=10": "= 100 steps is not below the 100 steps per trial",
        "teacher.temperatures=[0.9]": "a mixture needs at least 2 τ_kd",
    }
    for overrides, message in problems.items():
        with pytest.raises(SpecError, match=message):
            check_tune(tiny(*overrides.split()))


def test_bad_tune_fields_fail_at_load_with_their_path() -> None:
    with pytest.raises(SpecError, match=r"tune.divergences: divergences has duplicates"):
        tiny("tune.divergences=[fkl,fkl]")
    with pytest.raises(
        SpecError, match=r"tune.onpolicy_fractions.0: Input should be less than or equal to 1"
    ):
        tiny("tune.onpolicy_fractions=[1.5]")
    with pytest.raises(SpecError, match=r"tune.steps: Input should be greater than or equal to 1"):
        tiny("tune.steps=0")


@pytest.mark.parametrize("name", ["tune_tiny.yaml", "composition_tune.yaml"])
def test_shipped_tune_sweeps_pass_the_tune_checks(name: str) -> None:
    path = REPO / "sweeps" / name
    if not path.exists():
        pytest.skip(f"{name} is not in this checkout")
    check_tune(load_spec(path))


def test_the_objective_takes_each_tau_dec_at_its_best_gamma() -> None:
    records = [_record(0.8, 1.2, gamma=2), _record(0.8, 1.5, gamma=5), _record(1.0, 1.6, gamma=2)]
    records += [_record(1.0, 1.1, gamma=5)]
    assert objective(records, [0.8, 1.0]) == pytest.approx((1.5 + 1.6) / 2)
