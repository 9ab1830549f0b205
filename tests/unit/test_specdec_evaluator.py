"""The analytic estimator and the in-process evaluator on a micro zoo (no Ray)."""

from __future__ import annotations

import pytest
import torch

from specray.config import EvalSpec
from specray.errors import ModelError
from specray.models.loading import load_model, load_tokenizer
from specray.specdec import evaluator as evaluator_module
from specray.specdec.analytic import AnalyticEstimator, Continuations, ratio_ci95, sample_continuations
from specray.specdec.cells import check_drafts, plan_jobs
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from tests.conftest import micro_zoo_spec

SETTINGS = EvalSettings(gamma=3, repeats=2, max_new_tokens=12, empirical_prompts=3, cost_ratio=0.1)


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


def test_draft_equal_to_target_is_accepted_everywhere(evaluator, micro_zoo) -> None:
    for tau in (0.0, 0.7):
        record = evaluator.evaluate(EvalJob("self", str(micro_zoo.target), tau, "in_domain", "analytic"))
        assert record["acceptance_rate"] == pytest.approx(1.0, abs=1e-5)
        assert record["block_efficiency"] == pytest.approx(SETTINGS.gamma + 1)
        empirical = evaluator.evaluate(EvalJob("self", str(micro_zoo.target), tau, "in_domain", "empirical"))
        assert empirical["acceptance_rate"] == 1.0


def test_greedy_beta_is_zero_or_one_and_records_are_complete(evaluator, micro_zoo) -> None:
    estimator = evaluator._estimator("in_domain", 0.0)
    beta, mask = estimator.beta(load_model(str(micro_zoo.draft)))
    assert set(beta[mask].unique().tolist()) <= {0.0, 1.0}
    record = evaluator.evaluate(EvalJob("d", str(micro_zoo.draft), 0.5, "out_of_domain", "analytic"))
    keys = ["acceptance_rate", "beta_per_position", "block_efficiency", "block_efficiency_simulated"]
    keys += ["speedup_model", "c", "tau_dec", "test_set", "draft"]
    assert set(keys) <= set(record)
    assert 0.0 <= record["acceptance_rate"] <= 1.0
    assert record["speedup_model"] == pytest.approx(record["block_efficiency_simulated"] / (0.1 * 3 + 1))


def test_continuations_are_sampled_once_and_cached(micro_zoo, prompts, monkeypatch) -> None:
    first = Evaluator(str(micro_zoo.target), prompts, SETTINGS).continuations("in_domain", 0.9)

    def no_sampling(*args, **kwargs):
        raise AssertionError("continuations should come from the cache")

    monkeypatch.setattr(evaluator_module, "sample_continuations", no_sampling)
    again = Evaluator(str(micro_zoo.target), prompts, SETTINGS).continuations("in_domain", 0.9)
    assert again == first


def test_one_target_pass_serves_every_draft(micro_zoo, prompts) -> None:
    target = load_model(str(micro_zoo.target))
    continuations = sample_continuations(target, prompts["in_domain"], 1.0, 10, None, seed=0)
    estimator = AnalyticEstimator(target, continuations, pad_id=0)
    calls = []
    target.register_forward_hook(lambda *a: calls.append(1))
    for draft in (load_model(str(micro_zoo.draft)), target):
        estimator.evaluate(draft, 3, 0.1)
    # the target's distributions came from sampling; only the second "draft" (the target itself) ran it
    assert len(calls) == 1
    calls.clear()
    cached = Continuations(continuations.tau, continuations.prompts, continuations.responses)
    AnalyticEstimator(target, cached, pad_id=0)  # read back from disk: no logits, one teacher-forced pass
    assert len(calls) == 1


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
    for p, f in zip(fresh.target_probs, fresh.batches, strict=True):
        assert p.shape[:2] == f[3].shape
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

        def forward(self, input_ids, attention_mask=None):
            return type(
                "Out", (), {"logits": self.table[: input_ids.shape[1]].expand(input_ids.shape[0], -1, -1)}
            )

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


def test_ratio_ci_shrinks_with_more_clusters() -> None:
    a = torch.tensor([3.0, 5.0, 2.0, 4.0] * 4)
    b = torch.tensor([6.0, 7.0, 5.0, 6.0] * 4)
    assert ratio_ci95(a, b) < ratio_ci95(a[:4], b[:4])
    assert ratio_ci95(a[:1], b[:1]) != ratio_ci95(a[:1], b[:1])  # nan with one cluster


def test_plan_covers_the_grid() -> None:
    spec = EvalSpec(
        temperatures=[0.0, 0.5, 1.0], estimators=["analytic", "empirical"], empirical_temperatures=[1.0]
    )
    jobs = plan_jobs(spec, {"a": "/a", "b": "/b"})
    assert len(jobs) == 2 * 2 * (3 + 1)
    assert len({job.key for job in jobs}) == len(jobs)
    diagonal = spec.model_copy(update={"empirical_drafts": "diagonal"})
    jobs = plan_jobs(
        diagonal, {"base": "/b", "kd1": "/k1", "kd5": "/k5"}, {"base": None, "kd1": 1.0, "kd5": 0.5}
    )
    empirical = {(j.draft, j.test_set) for j in jobs if j.estimator == "empirical"}
    assert empirical == {(d, t) for d in ("base", "kd1") for t in ("in_domain", "out_of_domain")}


def test_draft_with_another_vocabulary_is_refused_before_decoding(micro_zoo, tmp_path) -> None:
    from specray.models.zoo import build_zoo

    other = build_zoo(micro_zoo_spec(vocab_size=300, corpus_size=100), root=tmp_path)
    with pytest.raises(ModelError, match="different vocabularies"):
        check_drafts(str(micro_zoo.target), {"other": str(other.draft)})
    with pytest.raises(ModelError, match="not found"):
        check_drafts(str(micro_zoo.target), {"missing": str(tmp_path / "missing")})
