"""Batch sizes as grid axes: the cells they add, the keys they change, the records of the old speedup model
never served, the metric names, and the report's batch-size section."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from specray.config import load_spec
from specray.draft import Draft
from specray.errors import SpecError
from specray.keys import cost_ratio_inputs, digest
from specray.report import batching
from specray.specdec.records import CellRecord, StepCosts, Timing
from specray.sweep.plan import plan_sweep
from specray.sweep.survey import cell_stage
from specray.tracking.names import CellAxes, cell_metrics
from tests.conftest import REPO

SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")
COSTS = StepCosts.fixed(0.1, gammas=[3])


def _with(**fields) -> object:
    return load_spec(REPO / "sweeps" / "smoke.yaml", [f"eval.{k}={v}" for k, v in fields.items()])


def _jobs(spec, costs: StepCosts = COSTS):
    return plan_sweep(spec).cell_jobs(costs, [Draft("d", None, {}, Path("p"), "DRAFT")])


def test_at_batch_size_one_the_cells_keep_their_coordinates_and_empirical_ones_their_keys() -> None:
    plain, batched = _jobs(SMOKE), _jobs(_with(empirical_batch_sizes="[1,2]"))
    coordinates = {(j.test_set, j.estimator, j.tau_dec, j.gamma, j.batch_size) for j in plain}
    assert {j.batch_size for j in plain} == {1}
    # B = 2 adds one empirical cell per empirical (test set, τ_dec); the B = 1 cells are the same cells
    extra = [j for j in batched if j.batch_size == 2]
    assert len(extra) == sum(j.estimator == "empirical" for j in plain) and all(
        j.estimator == "empirical" for j in extra
    )
    kept = {(j.test_set, j.estimator, j.tau_dec, j.gamma, j.batch_size): j.key for j in batched}
    assert all(kept[(j.test_set, j.estimator, j.tau_dec, j.gamma, 1)] == j.key for j in plain)
    assert coordinates <= set(kept)
    assert plain[0].key_inputs["batch_size"] == 1 and extra[0].key_inputs["batch_size"] == 2
    assert extra[0].label.endswith("|B=2")


def test_a_record_of_the_old_speedup_model_is_not_served() -> None:
    jobs = [j for j in _jobs(SMOKE) if j.estimator == "analytic"]
    job = jobs[0]
    # the record an older specray saved for the same cell: format 4, keyed by the value of c
    old_inputs = {k: v for k, v in job.key_inputs.items() if k != "step_costs"}
    old_inputs |= {"record_format": 4, "c": 0.1}
    old = CellRecord(
        job.draft, job.draft_key, job.test_set, job.tau_dec, "analytic", job.gamma, digest(old_inputs),
        0.1, 1.0, {"speedup_model": 9.9, "block_efficiency_simulated": 2.0}, old_inputs,
    )  # fmt: skip
    stage, todo = cell_stage(jobs, {old.key: old})
    assert job in todo and stage.reused == 0
    reason = next(r for r in stage.reasons if "record_format" in r)
    assert "record_format 4 → (none)" in reason


def test_the_step_costs_key_changes_with_the_timed_grid_and_analytic_keys_with_their_values() -> None:
    assert digest(cost_ratio_inputs(SMOKE)) != digest(cost_ratio_inputs(_with(batch_sizes="[1,4]")))
    assert digest(cost_ratio_inputs(SMOKE)) != digest(cost_ratio_inputs(_with(gamma="[3,5]")))
    # another timing precision times again; the default is in the key like any other value
    assert cost_ratio_inputs(SMOKE)["eval.timing_precision"] == 0.1
    assert digest(cost_ratio_inputs(SMOKE)) != digest(cost_ratio_inputs(_with(timing_precision="0.05")))
    assert cost_ratio_inputs(_with(timing_precision="0.02"))["eval.timing_precision"] == 0.02
    moved = StepCosts.fixed(0.11, gammas=[3])
    before = {j.key for j in _jobs(SMOKE) if j.estimator == "analytic"}
    after = {j.key for j in _jobs(SMOKE, moved) if j.estimator == "analytic"}
    assert not before & after
    empirical = [{j.key for j in _jobs(SMOKE, c) if j.estimator == "empirical"} for c in (COSTS, moved)]
    assert empirical[0] == empirical[1]  # measured cells do not depend on the model


def test_bad_batch_settings_are_refused_naming_the_field() -> None:
    with pytest.raises(SpecError, match="empirical_batch_sizes \\[8\\] exceed empirical_prompts"):
        _with(empirical_batch_sizes="[1,8]")
    with pytest.raises(SpecError, match="draft_cost_ratio .* batch_sizes"):
        _with(draft_cost_ratio=0.1, batch_sizes="[1,4]")
    with pytest.raises(SpecError, match="batch_sizes has duplicates"):
        _with(batch_sizes="[1,1]")


def _analytic(tau: float, by_batch: dict[int, tuple[float, float]], draft: str = "d", gamma: int = 3):
    metrics = {
        "speedup_model": by_batch[min(by_batch)][0],
        "speedup_model_by_batch": {str(b): v for b, (v, _) in by_batch.items()},
        "speedup_model_by_batch_ci95": {str(b): h for b, (_, h) in by_batch.items()},
    }
    return CellRecord(
        draft, "K", "in_domain", tau, "analytic", gamma, f"{draft}{tau}{gamma}", 0.1, 0.0, metrics
    )


def test_metric_names_carry_the_batch_size_only_when_the_sweep_has_several() -> None:
    one = cell_metrics(_analytic(1.0, {1: (1.5, 0.1)}))
    assert "speedup_model/in_domain/tau_dec_1" in one and not any("batch_" in k for k in one)
    several = cell_metrics(_analytic(1.0, {1: (1.5, 0.1), 4: (1.2, 0.1), 16: (0.8, 0.1)}))
    assert several["speedup_model/in_domain/tau_dec_1/batch_16"] == 0.8
    empirical = CellRecord(
        "d", "K", "in_domain", 1.0, "empirical", 3, "e", None, 0.0, {"speedup": 1.1}, {}, None, 1.0, 4
    )
    assert "speedup/in_domain/tau_dec_1/batch_4" in cell_metrics(empirical, axes=CellAxes(batch=True))
    assert "speedup/in_domain/tau_dec_1" in cell_metrics(empirical)


def test_break_even_is_the_largest_batch_whose_lower_bound_clears_one() -> None:
    cells = [
        _analytic(0.0, {1: (1.8, 0.1), 4: (1.3, 0.1), 16: (1.05, 0.1), 32: (0.9, 0.1)}),
        _analytic(0.0, {1: (1.7, 0.1), 4: (1.5, 0.1), 16: (1.2, 0.1), 32: (0.95, 0.1)}, draft="e", gamma=2),
        _analytic(1.0, {1: (0.95, 0.01), 4: (0.9, 0.01), 16: (0.8, 0.01), 32: (0.7, 0.01)}),
    ]
    frame = pd.DataFrame([c.flat() for c in cells])
    best = batching.best_per_batch(batching.batch_frame(frame))
    at = best.set_index(["tau_dec", "B"])
    assert at.loc[(0.0, 1)].draft == "d" and at.loc[(0.0, 4)].draft == "e"  # the best γ moves with B
    even = batching.break_even(best).set_index("tau_dec")["break-even B"]
    assert even[0.0] == 16 and even[1.0] == 0  # 1.2 − 0.1 > 1 at 16; 0.95 − 0.1 < 1 at 32; never at τ 1


def test_the_report_compares_each_empirical_cell_with_the_model_from_its_own_counts() -> None:
    costs = StepCosts({1: {1: Timing(2.0, 0.0), 4: Timing(2.6, 0.0)}}, {1: Timing(0.5, 0.0)}, "measured")
    row = {
        "draft": "d", "test_set": "in_domain", "tau_dec": 1.0, "estimator": "empirical", "gamma": 3,
        "batch_size": 1, "epsilon": 1.0, "block_efficiency": 2.5, "drafted_per_step": 3.0,
        "tokens_per_decode": 20.0, "speedup": 1.2, "speedup_ci95": 0.05,
    }  # fmt: skip
    table = batching.modelled_vs_measured(pd.DataFrame([row]), costs)
    model = costs.speedup(2.5, 3, 1, 3.0, 20.0)
    assert table["modelled"].iloc[0] == pytest.approx(model)
    assert table["measured / modelled"].iloc[0] == pytest.approx(1.2 / model)
    assert "1 of 1 within" in batching.agreement_lines(table)[0] or not math.isclose(
        1.2 / model, 1.0, abs_tol=0.1
    )
    assert batching.modelled_vs_measured(pd.DataFrame([row]), None).empty


def test_a_cell_off_the_model_is_explained_by_its_interval_or_named() -> None:
    table = pd.DataFrame(
        {
            "draft": ["a", "b", "c"], "test_set": ["in_domain"] * 3, "tau_dec": [0.0, 1.0, 1.0],
            "gamma": [2] * 3, "modelled": [1.0, 1.0, 1.0], "measured": [1.05, 1.3, 1.3],
            "measured_ci95": [0.01, 0.4, 0.1],
        }
    )  # fmt: skip
    table["measured / modelled"] = table["measured"] / table["modelled"]
    lines = batching.agreement_lines(table)
    assert (
        "1 of 3 within [0.9, 1.1], 1 more whose measured 95% interval holds the modelled speedup" in lines[0]
    )
    assert "1 neither" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("- neither: c on in_domain at τ_dec 1")


def test_a_cells_metrics_read_as_its_estimators_typed_result_and_missing_fields_are_unknown() -> None:
    record = _analytic(1.0, {1: (1.5, 0.1), 4: (1.2, 0.2)})
    result = record.analytic()
    assert result.speedup_model == 1.5 and result.speedup_model_by_batch == {"1": 1.5, "4": 1.2}
    # a field an older record lacks is unknown, never a zero a table would show as measured
    assert math.isnan(result.acceptance_rate) and result.beta_per_position == [] and result.cost_terms == {}
    with pytest.raises(ValueError, match="not an empirical one"):
        record.empirical()
    measured = CellRecord("d", "K", "in_domain", 1.0, "empirical", 3, "e", None, 0.0, {"speedup": 1.1})
    assert measured.empirical().speedup == 1.1 and math.isnan(measured.empirical().speedup_ci95)
    assert measured.empirical().batch_size == 1 and measured.empirical().outputs == []


def test_step_costs_are_kept_per_grid_so_switching_back_reuses_them(tmp_path) -> None:
    from dataclasses import replace

    from specray.files import write_json
    from specray.sweep.survey import step_costs_file, step_costs_stage

    def stage_of(spec):  # noqa: ANN001, ANN202
        return step_costs_stage(replace(plan_sweep(spec), folder=tmp_path))

    def timed(spec) -> StepCosts:
        inputs = cost_ratio_inputs(spec)
        costs = replace(StepCosts.fixed(0.2, gammas=spec.eval.gamma), key=digest(inputs), key_inputs=inputs)
        costs = replace(costs, source="measured")
        write_json(step_costs_file(tmp_path, costs.key), costs.to_json())
        return costs

    stage, none = stage_of(SMOKE)
    assert none is None and stage.reasons == {"new": 1}
    first = timed(SMOKE)
    wider = _with(gamma="[3,6]")
    stage, none = stage_of(wider)
    assert none is None and "eval.gamma [3] → [3, 6]" in stage.line()
    timed(wider)
    stage, back = stage_of(SMOKE)  # back to γ = 3: the first timing, not a new one
    assert stage.reused == 1 and back == first and back.fingerprint() == first.fingerprint()
    step_costs_file(tmp_path, first.key).write_text("{truncated")
    assert stage_of(SMOKE)[1] is None  # a damaged file is timed again
