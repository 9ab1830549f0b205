"""The analytic estimator and the in-process evaluator on a micro zoo (no Ray)."""

from __future__ import annotations

import pytest
import torch

from specray.config import EvalSpec
from specray.errors import ModelError
from specray.models.loading import load_model, load_tokenizer
from specray.specdec import evaluator as evaluator_module
from specray.specdec.analytic import AnalyticEstimator, analytic_result, ratio_ci95
from specray.specdec.cells import check_drafts, passes, plan_jobs
from specray.specdec.continuations import Continuations, sample_continuations
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from specray.specdec.records import StepCosts
from tests.conftest import micro_zoo_spec
from tests.plans import draft_at

SETTINGS = EvalSettings(repeats=2, max_new_tokens=12, empirical_prompts=3, step_costs=StepCosts.fixed(0.1))
GAMMA = 3


@pytest.fixture(scope="module")
def prompts(micro_zoo) -> dict[str, list[list[int]]]:
    tokenizer = load_tokenizer(str(micro_zoo.target))
    texts = [
        "### Instruction:\nCopy.\n\n### Response:\n",
        "List two fruits.",
        "Sort 3, 1, 2.",
        "Count words.",
    ]
    return {"in_domain": tokenizer(texts)["input_ids"], "out_of_domain": tokenizer(texts[::-1])["input_ids"]}


@pytest.fixture(scope="module")
def evaluator(micro_zoo, prompts) -> Evaluator:
    return Evaluator(str(micro_zoo.target), prompts, SETTINGS)


def _job(name: str, path, tau: float, test_set: str, estimator: str, gamma: int = GAMMA) -> EvalJob:
    return EvalJob(name, str(path), tau, test_set, estimator, gamma)


def test_draft_equal_to_target_is_accepted_everywhere(evaluator, micro_zoo) -> None:
    for tau in (0.0, 0.7):
        (record,) = evaluator.evaluate([_job("self", micro_zoo.target, tau, "in_domain", "analytic")])
        assert record.metrics["acceptance_rate"] == pytest.approx(1.0, abs=1e-5)
        assert record.metrics["block_efficiency"] == pytest.approx(GAMMA + 1)
        (empirical,) = evaluator.evaluate([_job("self", micro_zoo.target, tau, "in_domain", "empirical")])
        assert empirical.metrics["acceptance_rate"] == 1.0


def test_greedy_beta_is_zero_or_one_and_records_are_complete(evaluator, micro_zoo) -> None:
    target, pad = evaluator.target, evaluator.tokenizer.pad_token_id
    estimator = AnalyticEstimator(target, evaluator.continuations("in_domain", 0.0), pad)
    beta, mask = estimator.beta(load_model(str(micro_zoo.draft)))
    assert set(beta[mask].unique().tolist()) <= {0.0, 1.0}
    (record,) = evaluator.evaluate([_job("d", micro_zoo.draft, 0.5, "out_of_domain", "analytic")])
    row = record.flat()
    keys = ["acceptance_rate", "beta_per_position", "block_efficiency", "block_efficiency_simulated"]
    keys += ["speedup_model", "c", "tau_dec", "test_set", "draft", "gamma", "acceptance_rate_per_sequence"]
    keys += ["empirical_prompts_acceptance_rate", "empirical_prompts_acceptance_rate_ci95"]
    assert set(keys) <= set(row)
    assert 0.0 <= row["acceptance_rate"] <= 1.0
    # a fixed c: the papers' model on the exact E, with the drafts each step actually proposes
    drafted = row["drafted_per_step"]
    assert 0.0 < drafted <= GAMMA
    assert row["speedup_model"] == pytest.approx(row["block_efficiency_sampled"] / (0.1 * drafted + 1))


def test_one_pass_gives_every_gamma_from_the_same_beta(evaluator, micro_zoo) -> None:
    """Analytic cells of two drafts × three γ in one pass: acceptance is γ-free, block efficiency grows
    with γ, and every cell equals the same cell evaluated alone."""
    jobs = [
        _job(n, p, 0.8, "in_domain", "analytic", g)
        for n, p in (("d", micro_zoo.draft), ("t", micro_zoo.target))
        for g in (1, 3, 6)
    ]
    records = evaluator.evaluate(jobs)
    assert [(r.draft, r.gamma) for r in records] == [(j.draft, j.gamma) for j in jobs]
    drafts = [r for r in records if r.draft == "d"]
    assert len({r.metrics["acceptance_rate"] for r in drafts}) == 1
    efficiencies = [r.metrics["block_efficiency_simulated"] for r in drafts]
    assert efficiencies == sorted(efficiencies) and efficiencies[0] < efficiencies[-1]
    for job, record in zip(jobs, records, strict=True):
        (alone,) = evaluator.evaluate([job])
        assert alone.metrics["speedup_model"] == pytest.approx(record.metrics["speedup_model"], abs=1e-9)


def test_streaming_equals_keeping_every_target_distribution(micro_zoo, prompts) -> None:
    """β from the streaming pass (several drafts, one target pass) equals β with the target's batches
    kept in memory, per draft, to 1e-6, for any batch size."""
    target, draft = load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft))
    many = [p + p[: i % 3] for i, p in enumerate(prompts["in_domain"] * 4)]  # 16 prompts, mixed lengths
    continuations = sample_continuations(target, many, 0.9, 10, 2, seed=3, keep_logits=False)
    kept = AnalyticEstimator(target, continuations, pad_id=0, batch_size=16, keep_target=True)
    reference = [kept.beta(model) for model in (draft, target)]
    for batch_size in (1, 5, 16):
        streamed = AnalyticEstimator(target, continuations, pad_id=0, batch_size=batch_size)
        for (beta, mask), result in zip(reference, streamed.betas([draft, target]), strict=True):
            assert torch.equal(mask, result.mask)
            assert torch.allclose(beta, result.beta, atol=1e-6)


def test_continuations_are_sampled_once_and_cached(micro_zoo, prompts, monkeypatch) -> None:
    first = Evaluator(str(micro_zoo.target), prompts, SETTINGS).continuations("in_domain", 0.9)

    def no_sampling(*args, **kwargs):
        raise AssertionError("continuations should come from the cache")

    monkeypatch.setattr(evaluator_module, "sample_continuations", no_sampling)
    again = Evaluator(str(micro_zoo.target), prompts, SETTINGS).continuations("in_domain", 0.9)
    assert again == first


def test_one_target_pass_serves_every_draft(micro_zoo, prompts) -> None:
    """Streaming: the target runs once per batch whatever the number of drafts; kept logits skip it."""
    target, draft = load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft))
    continuations = sample_continuations(target, prompts["in_domain"], 1.0, 10, None, seed=0)
    cached = Continuations(continuations.tau, continuations.prompts, continuations.responses)
    calls = []
    target.register_forward_hook(lambda *a: calls.append(1))
    estimator = AnalyticEstimator(target, cached, pad_id=0, batch_size=2)
    estimator.betas([draft, draft, draft])
    assert len(calls) == len(estimator.batches) == 2  # 4 prompts in batches of 2
    calls.clear()
    AnalyticEstimator(target, continuations, pad_id=0, batch_size=2).betas([draft, draft])
    assert calls == []  # the target's distributions came from the logits kept while sampling


@pytest.mark.parametrize("tau", [0.0, 0.7, 1.3])
def test_sampling_logits_equal_a_teacher_forced_target_pass(micro_zoo, prompts, tau) -> None:
    """β from the logits kept while sampling (KV cache, left padding, rows leaving the batch) equals β
    from a separate right-padded teacher-forced pass over the same continuations."""
    target, draft = load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft))
    many = [p + p[: i % 3] for i, p in enumerate(prompts["in_domain"] * 3)]  # 12 prompts, mixed lengths
    continuations = sample_continuations(target, many, tau, 10, 2, seed=5, batch_size=5)
    assert [len(r) for r in continuations.responses] == [len(x) for x in continuations.target_logits]
    cached = Continuations(tau, many, continuations.responses)
    fresh = AnalyticEstimator(target, continuations, pad_id=0, batch_size=4)
    forced = AnalyticEstimator(target, cached, pad_id=0, batch_size=7)
    (beta_fresh, mask_fresh), (beta_forced, mask_forced) = fresh.beta(draft), forced.beta(draft)
    assert mask_fresh.sum() == sum(len(r) for r in continuations.responses)
    assert torch.equal(mask_fresh, mask_forced)
    assert torch.allclose(beta_fresh, beta_forced, atol=1e-5)


def test_analytic_matches_a_hand_computed_beta() -> None:
    """β = Σ min(p, q) along the continuation, with right padding ignored."""
    torch.manual_seed(0)

    class Fixed(torch.nn.Module):  # logits depend only on the position: easy to compute by hand
        def __init__(self, table: torch.Tensor):
            super().__init__()
            self.table = table
            self.device = torch.device("cpu")

        def forward(self, input_ids, attention_mask=None, logits_to_keep=0):  # HF: 0 keeps every position
            logits = self.table[: input_ids.shape[1]].expand(input_ids.shape[0], -1, -1)
            return type("Out", (), {"logits": logits[:, -logits_to_keep:]})

    target_table, draft_table = torch.randn(8, 5), torch.randn(8, 5)
    continuations = Continuations(1.0, [[1, 2], [1]], [[3, 4, 0], [2]])
    estimator = AnalyticEstimator(Fixed(target_table), continuations, pad_id=0)
    beta, mask = estimator.beta(Fixed(draft_table))
    p, q = target_table.softmax(-1), draft_table.softmax(-1)
    expected_first = [
        float(torch.minimum(p[i], q[i]).sum()) for i in (1, 2, 3)
    ]  # prompt len 2: positions 1..3
    assert beta[0].tolist() == pytest.approx(expected_first, abs=1e-6)
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert beta[1, 0] == pytest.approx(float(torch.minimum(p[0], q[0]).sum()), abs=1e-6)
    # the target's entropy along the same positions, whatever the draft; its per-prompt mean in the record
    (betas,) = estimator.betas([Fixed(draft_table)])
    entropy = -(p * p.log()).sum(-1)  # [positions]
    assert betas.target_entropy is not None
    assert betas.target_entropy[0].tolist() == pytest.approx(entropy[1:4].tolist(), abs=1e-5)
    assert betas.target_entropy[1].tolist() == pytest.approx([float(entropy[0]), 0.0, 0.0], abs=1e-5)
    record = analytic_result(betas, 2, StepCosts.fixed(0.1, [1], [2]))
    assert record.per_prompt_target_entropy == pytest.approx([float(entropy[1:4].mean()), float(entropy[0])])


def test_ratio_ci_shrinks_with_more_clusters() -> None:
    a = torch.tensor([3.0, 5.0, 2.0, 4.0] * 4)
    b = torch.tensor([6.0, 7.0, 5.0, 6.0] * 4)
    assert ratio_ci95(a, b) < ratio_ci95(a[:4], b[:4])
    assert ratio_ci95(a[:1], b[:1]) != ratio_ci95(a[:1], b[:1])  # nan with one cluster


def test_plan_covers_the_grid() -> None:
    spec = EvalSpec(
        temperatures=[0.0, 0.5, 1.0],
        estimators=["analytic", "empirical"],
        empirical_temperatures=[1.0],
        gamma=[2, 4],
    )
    jobs = plan_jobs(spec, [draft_at("a", "/a"), draft_at("b", "/b")])
    assert len(jobs) == 2 * 2 * (3 + 1) * 2
    assert len({job.label for job in jobs}) == len(jobs)
    units = passes(jobs, drafts_per_pass=1)
    analytic = [unit for unit in units if unit[0].estimator == "analytic"]
    assert len(analytic) == 2 * 3 * 2  # (test set, τ_dec) × drafts, each with both γ
    assert all(
        len({(j.test_set, j.tau_dec, j.draft) for j in unit}) == 1 and len(unit) == 2 for unit in analytic
    )
    assert sorted(j.label for unit in units for j in unit) == sorted(j.label for j in jobs)
    diagonal = spec.model_copy(update={"empirical_drafts": "diagonal", "gamma": [3]})
    refs = [draft_at("base", "/b"), draft_at("kd1", "/k1", tau_kd=1.0), draft_at("kd5", "/k5", tau_kd=0.5)]
    jobs = plan_jobs(diagonal, refs)
    empirical = {(j.draft, j.test_set) for j in jobs if j.estimator == "empirical"}
    assert empirical == {(d, t) for d in ("base", "kd1") for t in ("in_domain", "out_of_domain")}
    # beyond the τ_kd grid, the nearest τ_kd's drafts: a band an export routes there is measured too
    beyond = diagonal.model_copy(update={"empirical_temperatures": [0.4, 2.0]})
    empirical = {(j.draft, j.tau_dec) for j in plan_jobs(beyond, refs) if j.estimator == "empirical"}
    assert empirical == {("base", 0.4), ("kd5", 0.4), ("base", 2.0), ("kd1", 2.0)}


def test_draft_with_another_vocabulary_is_refused_before_decoding(micro_zoo, tmp_path) -> None:
    from specray.models.zoo import build_zoo

    other = build_zoo(micro_zoo_spec(vocab_size=300, corpus_size=100), root=tmp_path)
    with pytest.raises(ModelError, match="different vocabularies"):
        check_drafts(str(micro_zoo.target), {"other": str(other.draft)})
    with pytest.raises(ModelError, match="not found"):
        check_drafts(str(micro_zoo.target), {"missing": str(tmp_path / "missing")})


def test_per_prompt_counts_rebuild_the_pooled_metrics(evaluator, micro_zoo) -> None:
    """What a paired bootstrap over prompts resamples adds up to the cell's own numbers."""
    (record,) = evaluator.evaluate([_job("d", micro_zoo.draft, 0.9, "in_domain", "analytic")])
    m = record.metrics
    tokens, calls = sum(m["per_prompt_tokens"]), sum(m["per_prompt_target_calls"])
    assert len(m["per_prompt_tokens"]) == len(evaluator.prompts["in_domain"])
    assert sum(m["per_prompt_beta_sum"]) / tokens == pytest.approx(m["acceptance_rate"], abs=1e-9)
    assert tokens / calls == pytest.approx(m["block_efficiency_sampled"], abs=1e-9)
    assert sum(m["per_prompt_drafted"]) / calls == pytest.approx(m["drafted_per_step"], abs=1e-9)
