"""Lenience as a grid axis: the spec, the planned cells and their keys, metric names, and the quality of
decoded outputs (a lossless cell's quality is the target's within noise)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specray.config import EvalSpec, LenienceSpec, load_spec
from specray.data.examples import Example
from specray.keys import cell_key_inputs
from specray.models.loading import load_tokenizer
from specray.specdec.cells import plan_jobs
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from specray.specdec.lossy import lossy_betas
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.plan import plan_sweep
from specray.tracking.names import CellAxes, cell_metrics
from tests.conftest import REPO
from tests.plans import draft_at, prompts_fingerprints

SMOKE = load_spec(REPO / "sweeps" / "smoke.yaml")


def _with_lenience(**lenience) -> object:
    raw = SMOKE.model_dump(mode="json")
    raw["eval"]["lenience"] = lenience
    return type(SMOKE).model_validate(raw)


def test_lenience_spec_defaults_to_lossless_and_names_bad_fields() -> None:
    assert LenienceSpec().points(1.0) == [(None, 1.0)]
    assert LenienceSpec(function="sq", epsilon=0.5).function == ["sq"]
    for bad, field in [
        ({"function": "cubic"}, "function"),
        ({"epsilon": 0.0}, "epsilon"),
        ({"epsilon": 1.5}, "epsilon"),
    ]:
        with pytest.raises(ValidationError, match=field):
            EvalSpec(temperatures=[1.0], lenience=bad)
    with pytest.raises(ValidationError, match="duplicates"):
        LenienceSpec(epsilon=[0.5, 0.5])


def test_lossy_cells_exist_only_above_greedy_and_lossless_is_one_cell() -> None:
    spec = EvalSpec(
        temperatures=[0.0, 1.0],
        test_sets=["in_domain"],
        estimators=["analytic", "empirical"],
        empirical_temperatures=[0.0, 1.0],
        lenience=LenienceSpec(function=["lin", "exp"], epsilon=[1.0, 0.5]),
        quality_ends=True,
    )
    jobs = plan_jobs(spec, [draft_at("d", "p")])
    coordinates = {(j.estimator, j.tau_dec, j.lenience, j.epsilon) for j in jobs}
    for estimator in ("analytic", "empirical"):
        assert {(t, f, e) for s, t, f, e in coordinates if s == estimator} == {
            (0.0, None, 1.0),
            (1.0, None, 1.0),
            (1.0, "lin", 0.5),
            (1.0, "exp", 0.5),
        }
    assert sorted(j.tau_dec for j in jobs if j.estimator == "ends") == [0.0, 1.0]


def test_a_lossless_cell_keeps_its_key_and_lossy_cells_get_their_own() -> None:
    lossy_spec = _with_lenience(function=["lin", "sq"], epsilon=[1.0, 0.5])
    fingerprints = prompts_fingerprints(SMOKE)
    costs = StepCosts.fixed(0.1, gammas=[3])

    def keys(spec) -> dict:
        jobs = plan_sweep(spec).cell_jobs(costs, [draft_at("d", "p", "DRAFT")])
        return {(j.test_set, j.estimator, j.tau_dec, j.lenience, j.epsilon): j.key for j in jobs}

    before, after = keys(SMOKE), keys(lossy_spec)
    assert all(after[coordinates] == key for coordinates, key in before.items())
    lossy = {c: k for c, k in after.items() if c[4] < 1.0}
    # 2 test sets × 2 estimators × 2 functions, all at τ_dec = 1 (none at greedy)
    assert len(lossy) == 8 and not set(lossy.values()) & set(before.values())
    assert len(set(lossy.values())) == len(lossy)
    # every cell's key holds its lenience, lossless ones' too: the key is read off its inputs
    fixed = costs.fingerprint()
    inputs = cell_key_inputs(
        SMOKE, "DRAFT", fingerprints["in_domain"], "in_domain", 1.0, "analytic", 3, fixed
    )
    assert inputs["eval.lenience.function"] is None and inputs["eval.lenience.epsilon"] == 1.0
    lossy = cell_key_inputs(
        SMOKE, "DRAFT", fingerprints["in_domain"], "in_domain", 1.0, "analytic", 3, fixed, ("lin", 0.5)
    )
    assert (lossy["eval.lenience.function"], lossy["eval.lenience.epsilon"]) == ("lin", 0.5)


def _record(estimator: str, epsilon: float, lenience: str | None, metrics: dict) -> CellRecord:
    return CellRecord(
        "d", "k", "in_domain", 1.0, estimator, 3, "key", None, 0.0, metrics, {}, lenience, epsilon
    )


def test_metric_names_carry_epsilon_and_function_only_when_the_sweep_varies_them() -> None:
    lossy = _record("empirical", 0.5, "lin", {"speedup": 1.2, "quality": 0.4})
    lossless = _record("empirical", 1.0, None, {"speedup": 1.1, "quality": 0.5})
    assert set(cell_metrics(lossy)) == {"speedup/in_domain/tau_dec_1", "quality/in_domain/tau_dec_1"}
    assert "speedup/in_domain/tau_dec_1/eps_0.5" in cell_metrics(lossy, axes=CellAxes(epsilon=True))
    both = CellAxes(epsilon=True, function=True)
    assert "quality/in_domain/tau_dec_1/lin_eps_0.5" in cell_metrics(lossy, axes=both)
    assert "quality/in_domain/tau_dec_1/eps_1" in cell_metrics(lossless, axes=both)
    ends = _record("ends", 1.0, None, {"quality_target": 0.5, "quality_draft": 0.1})
    assert cell_metrics(ends, axes=CellAxes(True, True, True)) == {
        "quality_target_only/in_domain/tau_dec_1": 0.5,
        "quality_draft_only/in_domain/tau_dec_1": 0.1,
    }


@pytest.fixture(scope="module")
def scored(micro_zoo) -> Evaluator:
    """The micro target with open-ended examples (ROUGE: graded, so noise is visible) as references."""
    tokenizer = load_tokenizer(str(micro_zoo.target))
    texts = [f"### Instruction:\nDescribe item {i}.\n\n### Response:\n" for i in range(10)]
    examples = [
        Example(str(i), f"Describe item {i}.", "", "the item is a small red thing", "describe")
        for i in range(10)
    ]
    settings = EvalSettings(repeats=20, max_new_tokens=16, empirical_prompts=10, seed=3)
    return Evaluator(
        str(micro_zoo.target),
        {"in_domain": tokenizer(texts)["input_ids"]},
        settings,
        examples={"in_domain": examples},
    )


def test_quality_of_a_lossless_cell_is_the_target_quality_within_noise(scored, micro_zoo) -> None:
    job = EvalJob("d", str(micro_zoo.draft), 1.0, "in_domain", "empirical", 3)
    (cell,) = scored.evaluate([job])
    (ends,) = scored.evaluate([EvalJob("d", str(micro_zoo.draft), 1.0, "in_domain", "ends", 0)])
    m, e = cell.metrics, ends.metrics
    assert m["quality_metric"] == "rougeL" and "outputs" not in m
    assert e["quality_target"] > 0  # the scorer sees real overlap, not only zeros
    # the sum of the two 95% half-widths: percentile bootstraps over 10 prompts under-cover a little
    noise = m["quality_ci95"] + e["quality_target_ci95"]
    assert abs(m["quality"] - e["quality_target"]) < noise, (m["quality"], e["quality_target"], noise)


def test_a_lossy_cell_decodes_towards_the_draft(scored, micro_zoo) -> None:
    lossy = EvalJob("d", str(micro_zoo.draft), 1.0, "in_domain", "empirical", 3, lenience="exp", epsilon=0.01)
    lossless = EvalJob("d", str(micro_zoo.draft), 1.0, "in_domain", "empirical", 3)
    (a,), (b,) = scored.evaluate([lossy]), scored.evaluate([lossless])
    assert (a.lenience, a.epsilon) == ("exp", 0.01)
    assert a.metrics["acceptance_rate"] > b.metrics["acceptance_rate"]
    assert 0.0 <= a.metrics["quality"] <= 1.0


def test_an_analytic_pass_scores_lossy_points_along_their_own_decoder_output(scored, micro_zoo) -> None:
    """Lossless and lossy analytic cells in one pass: the lossless β comes from the target's continuations,
    each lossy (point, γ) from `lossy_betas` along that decoder's output, with nothing shared between them."""
    settings = EvalSettings(
        repeats=1, max_new_tokens=12, empirical_prompts=10, seed=3, step_costs=StepCosts.fixed(0.1)
    )
    evaluator = Evaluator(str(micro_zoo.target), scored.prompts, settings)
    draft = str(micro_zoo.draft)
    jobs = [
        EvalJob("d", draft, 1.0, "in_domain", "analytic", 3),
        EvalJob("d", draft, 1.0, "in_domain", "analytic", 3, lenience="lin", epsilon=0.2),
        EvalJob("d", draft, 1.0, "in_domain", "analytic", 2, lenience="lin", epsilon=0.2),
    ]
    lossless, lossy3, lossy2 = (record.metrics for record in evaluator.evaluate(jobs))
    assert lossy3["acceptance_rate"] > lossless["acceptance_rate"]
    tokenizer = evaluator.tokenizer
    direct = lossy_betas(
        evaluator.target,
        evaluator._load_draft(draft),
        scored.prompts["in_domain"],
        1.0,
        "lin",
        0.2,
        3,
        12,
        tokenizer.eos_token_id,
        3,
        tokenizer.pad_token_id,
    )
    assert lossy3["acceptance_rate"] == pytest.approx(float(direct.beta.sum() / direct.mask.sum()))
    assert lossy3["tokens"] == int(direct.mask.sum())
    assert lossy2["tokens"] > 0  # its own decoder (γ = 2): its own sample, not γ = 3's
