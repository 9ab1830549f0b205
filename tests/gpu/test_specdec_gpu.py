"""Speculative decoding on CUDA: the decoder is lossless (a chi-square test, as in
tests/unit/test_specdec_decoder.py) and greedy-exact, the streaming analytic estimator equals a plain
per-token reference, and the evaluator (the eval actor's whole path, without Ray) runs analytic and
empirical cells and measures c on the GPU."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specray.devices import Resources
from specray.ops import warp
from specray.specdec.analytic import AnalyticEstimator
from specray.specdec.continuations import Continuations, sample_continuations
from specray.specdec.decoder import autoregressive_decode, speculative_decode
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from specray.specdec.records import StepCosts

GAMMA, LENGTH = 2, 3  # one block of γ proposals plus the target's own token, as in the CPU test


@torch.no_grad()
def likely_sequences(model, prompt: list[int], tau: float, coverage: float = 0.999, cap: int = 32) -> list:
    """Continuations of LENGTH tokens holding most of the model's mass: each prefix grows by its most likely
    next tokens until `coverage` of that conditional mass (at most `cap` tokens)."""
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(LENGTH):
        inputs = torch.tensor([prompt + list(s) for s in frontier], device=model.device)
        probs = warp(model(input_ids=inputs, logits_to_keep=1).logits[:, -1], tau)  # [n, vocab]
        top = probs.topk(cap, dim=-1)
        keep = (top.values.cumsum(-1) - top.values < coverage).tolist()  # until the coverage is reached
        rows = zip(frontier, top.indices.tolist(), keep, strict=True)
        frontier = [s + (t,) for s, ts, ks in rows for t, k in zip(ts, ks, strict=True) if k]
    return frontier


@torch.no_grad()
def sequence_probs(model, prompt: list[int], sequences: list, tau: float) -> torch.Tensor:
    """P(sequence | prompt) at τ of each sequence (same length): [n] float64, 1,024 sequences a pass."""
    probs = []
    for start in range(0, len(sequences), 1024):
        chunk = sequences[start : start + 1024]
        inputs = torch.tensor([prompt + list(s) for s in chunk], device=model.device)
        logits = model(input_ids=inputs, logits_to_keep=LENGTH + 1).logits[:, :LENGTH]  # predict each token
        picked = warp(logits, tau).gather(-1, inputs[:, -LENGTH:, None])[..., 0]  # [chunk, LENGTH]
        probs.append(picked.double().prod(dim=-1).cpu())
    return torch.cat(probs)


def chi_square_p(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson chi-square p-value, pooling cells whose expected count is below 5 into one (the CPU test's)."""
    expected = expected_probs / expected_probs.sum() * counts.sum()
    small = expected < 5
    observed = torch.cat([counts[~small], counts[small].sum().reshape(1)])
    expected = torch.cat([expected[~small], expected[small].sum().reshape(1)])
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


@pytest.mark.parametrize("tau", [0.6, 1.0])
def test_speculative_sampling_reproduces_the_target_distribution_on_cuda(cuda_pair, prompts, tau) -> None:
    """2,000 seeded decodes (a CUDA generator) of 3 tokens match the target's joint distribution over its
    likely sequences (+ one cell for the rest), and clearly differ from the draft's (the test has power);
    draft tokens were both accepted and rejected along the way (both paths ran)."""
    target, draft = cuda_pair
    prompt = prompts[0]
    cells = likely_sequences(target, prompt, tau)
    index = {cell: i for i, cell in enumerate(cells)}
    counts = torch.zeros(len(cells) + 1, dtype=torch.float64)  # the last cell: any other sequence
    generator = torch.Generator(device="cuda:0").manual_seed(int(tau * 10))
    accepted = tested = 0
    for _ in range(2000):
        decoded = speculative_decode(target, draft, prompt, tau, GAMMA, LENGTH, None, generator)
        counts[index.get(tuple(decoded.tokens), len(cells))] += 1
        accepted, tested = accepted + decoded.stats.accepted, tested + decoded.stats.tested
    assert 0 < accepted < tested
    for model, lossless in ((target, True), (draft, False)):
        probs = sequence_probs(model, prompt, cells, tau)
        expected = torch.cat([probs, (1.0 - probs.sum()).clamp(min=0.0).reshape(1)])
        p_value = chi_square_p(counts, expected)
        assert p_value > 1e-3 if lossless else p_value < 1e-6, (lossless, p_value)


def test_greedy_speculative_equals_target_greedy_on_cuda(cuda_pair, prompts) -> None:
    target, draft = cuda_pair
    for prompt in prompts[:3]:
        greedy = autoregressive_decode(target, prompt, 0.0, 40, None).tokens
        for gamma in (1, 3, 5):
            assert speculative_decode(target, draft, prompt, 0.0, gamma, 40, None).tokens == greedy, gamma


@torch.no_grad()
def reference_beta(target, draft, prompt: list[int], response: list[int], tau: float) -> torch.Tensor:
    """β_t = Σ_v min(p_τ, q_τ) at each response position, from one unpadded pass per model: [T]."""
    inputs = torch.tensor([prompt + response], device=target.device)
    start = len(prompt) - 1
    p = warp(target(input_ids=inputs).logits[0, start:-1], tau)
    q = warp(draft(input_ids=inputs).logits[0, start:-1], tau)
    return torch.minimum(p, q).sum(dim=-1).float().cpu()


@pytest.mark.parametrize("tau", [0.6, 1.0])
def test_the_streaming_estimator_equals_a_per_token_reference_on_cuda(cuda_pair, prompts, tau) -> None:
    target, draft = cuda_pair
    sampled = sample_continuations(target, prompts, tau, 24, 2, seed=0, pad_token_id=0, batch_size=3)
    again = sample_continuations(target, prompts, tau, 24, 2, seed=0, pad_token_id=0, batch_size=3)
    assert again.responses == sampled.responses  # CUDA generators seeded per prompt
    forced = Continuations(tau, prompts, sampled.responses)  # as read back from the disk cache
    for continuations in (sampled, forced):  # the sampling-time logits, or a teacher-forced pass
        (betas,) = AnalyticEstimator(target, continuations, 0, batch_size=3).betas([draft])
        for i, (prompt, response) in enumerate(zip(prompts, sampled.responses, strict=True)):
            expected = reference_beta(target, draft, prompt, response, tau)
            assert int(betas.mask[i].sum()) == len(response)
            torch.testing.assert_close(betas.beta[i, : len(response)], expected, atol=1e-4, rtol=0)
    (own,) = AnalyticEstimator(target, forced, 0, batch_size=3).betas([target])
    assert torch.allclose(own.beta[own.mask], torch.ones(()), atol=1e-4)  # draft == target: β = 1


def test_the_eval_actor_path_runs_on_the_gpu_its_resources_give(pair_dirs, prompts, tmp_path) -> None:
    """What an eval actor with `eval.num_gpus: 1` does, without Ray: its device from its resources, the
    target loaded there, analytic and empirical cells, and c measured on that GPU."""
    device = Resources(1.0, 1.0).enter()
    assert device == torch.device("cuda:0")
    settings = EvalSettings(
        repeats=1, max_new_tokens=16, empirical_prompts=2, step_costs=StepCosts.fixed(0.1)
    )
    evaluator = Evaluator(
        str(pair_dirs.target), {"in_domain": prompts}, settings, "float32", device=str(device),
        continuations_dir=tmp_path,
    )  # fmt: skip
    assert evaluator.target.device.type == "cuda"
    jobs = [EvalJob(name, str(path), 1.0, "in_domain", "analytic", 3)
            for name, path in (("draft", pair_dirs.draft), ("self", pair_dirs.target))]  # fmt: skip
    draft_cell, self_cell = evaluator.evaluate(jobs)
    assert self_cell.metrics["acceptance_rate"] == pytest.approx(1.0, abs=1e-4)
    assert 0.1 < draft_cell.metrics["acceptance_rate"] < 0.9  # the noisy draft: β ≈ 0.5
    (empirical,) = evaluator.evaluate(
        [EvalJob("draft", str(pair_dirs.draft), 1.0, "in_domain", "empirical", 3)]
    )
    assert 0.0 <= empirical.metrics["acceptance_rate"] <= 1.0 and empirical.metrics["speedup"] > 0
    cost = evaluator.measure_step_costs(str(pair_dirs.draft), [1, 4], [4])
    assert cost.device == "cuda" and cost.cost_ratio() > 0.0 and cost.verify_cost(4, 4) > 0.0
    print(f"\nGPU eval: {draft_cell.metrics['acceptance_rate']=:.4f}, c = {cost.describe()}")
