"""Property and golden-value tests for specray.ops (pure torch, CPU, fast)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specray.ops import (
    DIVERGENCES,
    acceptance_from_logits,
    acceptance_rate_from_counts,
    block_efficiency_from_counts,
    draft_acceptance_from_counts,
    expected_block_efficiency,
    forward_kl,
    get_divergence,
    jsd,
    log_warp,
    reverse_kl,
    sample,
    simulated_block_efficiency,
    speedup_model,
    token_acceptance,
    total_variation,
    warp,
)

# few examples and no example database: the whole file must stay well under 10 s and write nothing
FAST = settings(max_examples=15, deadline=None, database=None)


@st.composite
def logit_pairs(draw: st.DrawFn, max_scale: float = 8.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random logit tensors [batch, seq, vocab] of the same shape, from a hypothesis-drawn seed."""
    batch, seq, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(2, 12))
    scale = draw(st.floats(0.1, max_scale))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    student = torch.randn(batch, seq, vocab, generator=gen) * scale
    teacher = torch.randn(batch, seq, vocab, generator=gen) * scale
    return student, teacher


def _logits_of(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float().view(1, 1, -1)  # [1, 1, vocab]


# ---- divergences: properties ----


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
@FAST
@given(pair=logit_pairs())
def test_divergence_zero_for_equal_and_positive_for_different(name: str, pair) -> None:
    student, teacher = pair
    fn = get_divergence(name)
    assert fn(teacher.clone(), teacher).item() == pytest.approx(0.0, abs=1e-6)
    # fp64: independent random logits can be close enough that fp32 rounds a tiny divergence to 0
    assert fn(student.double(), teacher.double()).item() > 0.0


@FAST
@given(pair=logit_pairs(), temperature=st.floats(0.3, 3.0))
def test_reverse_kl_is_forward_kl_with_roles_swapped(pair, temperature: float) -> None:
    student, teacher = pair
    rkl = reverse_kl(student, teacher, temperature=temperature)
    fkl_swapped = forward_kl(teacher, student, temperature=temperature)
    torch.testing.assert_close(rkl, fkl_swapped)


@FAST
@given(pair=logit_pairs(max_scale=1.0))
def test_jsd_endpoints_approach_fkl_and_rkl(pair) -> None:
    # JSD(β) = β·KL(P‖Q) + O(β²) needs β·p/q ≪ 1 on the support, so keep the logits moderate
    # (with q(v) ~ 1e-8 where p(v) ~ 1, β = 1e-4 is far from the asymptotic regime). fp64 because the
    # O(β²) term KL(Q‖M) is below fp32 rounding of its log terms, which JSD/β would amplify 1e4 times.
    student, teacher = (x.double() for x in pair)
    small, large = 1e-4, 1 - 1e-4
    fkl, rkl = forward_kl(student, teacher).item(), reverse_kl(student, teacher).item()
    assert jsd(student, teacher, beta=small).item() / small == pytest.approx(fkl, rel=1e-2, abs=1e-5)
    assert jsd(student, teacher, beta=large).item() / (1 - large) == pytest.approx(rkl, rel=1e-2, abs=1e-5)


@FAST
@given(pair=logit_pairs())
def test_jsd_half_bounded_by_log2_and_tvd_in_unit_interval(pair) -> None:
    student, teacher = pair
    assert 0.0 <= jsd(student * 10, teacher * 10, beta=0.5).item() <= math.log(2) + 1e-6
    tvd = total_variation(student, teacher).item()
    assert 0.0 <= tvd <= 1.0


def test_jsd_half_approaches_log2_for_disjoint_supports() -> None:
    student = torch.tensor([[[50.0, -50.0]]])
    teacher = torch.tensor([[[-50.0, 50.0]]])
    assert jsd(student, teacher, beta=0.5).item() == pytest.approx(math.log(2), rel=1e-5)
    assert total_variation(student, teacher).item() == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_mask_excludes_positions(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 7, generator=gen), torch.randn(2, 5, 7, generator=gen)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)
    fn = get_divergence(name)
    before = fn(student, teacher, mask)
    student2, teacher2 = student.clone(), teacher.clone()
    student2[~mask] = torch.randn(int((~mask).sum()), 7, generator=gen) * 5
    teacher2[~mask] = float("nan")  # even garbage at padding must not leak in
    torch.testing.assert_close(fn(student2, teacher2, mask), before)
    # the masked mean equals the mean over the selected rows
    selected = fn(student[mask][None], teacher[mask][None])
    torch.testing.assert_close(before, selected)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_empty_mask_gives_zero_with_grad(name: str) -> None:
    student = torch.randn(2, 3, 5, requires_grad=True)
    loss = get_divergence(name)(student, torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0
    loss.backward()
    assert student.grad is not None and torch.all(student.grad == 0)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_gradients_finite_including_minus_inf_vocab(name: str) -> None:
    gen = torch.Generator().manual_seed(1)
    student = torch.randn(2, 3, 6, generator=gen)
    teacher = torch.randn(2, 3, 6, generator=gen)
    student[..., -1] = -math.inf  # a masked/padded vocab entry in both models
    teacher[..., -1] = -math.inf
    student.requires_grad_(True)
    loss = get_divergence(name)(student, teacher, temperature=0.7)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(student.grad).all()
    assert torch.all(student.grad[..., -1] == 0)


@pytest.mark.parametrize("name", sorted(DIVERGENCES))
def test_bf16_logits_compute_in_fp32(name: str) -> None:
    student = torch.randn(1, 2, 4).bfloat16()
    teacher = torch.randn(1, 2, 4).bfloat16()
    assert get_divergence(name)(student, teacher).dtype == torch.float32


# ---- divergences: golden values on a 2-token vocab, p = [0.5, 0.5] (teacher), q = [0.9, 0.1] (student) ----

P, Q = [0.5, 0.5], [0.9, 0.1]


def _kl(a: list[float], b: list[float]) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b, strict=True))


def test_golden_forward_and_reverse_kl() -> None:
    fkl = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    rkl = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    assert forward_kl(_logits_of(Q), _logits_of(P)).item() == pytest.approx(fkl, rel=1e-5)
    assert reverse_kl(_logits_of(Q), _logits_of(P)).item() == pytest.approx(rkl, rel=1e-5)


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_golden_jsd(beta: float) -> None:
    m = [beta * p + (1 - beta) * q for p, q in zip(P, Q, strict=True)]
    expected = beta * _kl(P, m) + (1 - beta) * _kl(Q, m)
    assert jsd(_logits_of(Q), _logits_of(P), beta=beta).item() == pytest.approx(expected, rel=1e-5)


def test_golden_tvd_and_temperature() -> None:
    assert total_variation(_logits_of(Q), _logits_of(P)).item() == pytest.approx(0.4, rel=1e-5)
    # τ = 2 halves the logits: q_τ ∝ sqrt(q) = [0.75, 0.25]
    assert total_variation(_logits_of(Q), _logits_of(P), temperature=2.0).item() == pytest.approx(
        0.25, rel=1e-5
    )


# ---- divergences: validation ----


def test_get_divergence_unknown_name_lists_valid() -> None:
    with pytest.raises(ValueError, match=r"unknown divergence 'kl'; valid: fkl, jsd, rkl, tvd"):
        get_divergence("kl")
    assert get_divergence("fkl") is forward_kl


@pytest.mark.parametrize("beta", [0.0, 1.0, -0.1, 1.5])
def test_jsd_invalid_beta(beta: float) -> None:
    with pytest.raises(ValueError, match="beta"):
        jsd(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), beta=beta)


def test_invalid_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        forward_kl(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), temperature=0.0)


# ---- warp ----


def test_warp_zero_is_one_hot_argmax_first_tie() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 1.0, 2.0, 5.0]])
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(warp(logits, 0.0), expected)


@FAST
@given(pair=logit_pairs())
def test_warp_one_is_softmax_and_lower_tau_sharpens(pair) -> None:
    logits, _ = pair
    torch.testing.assert_close(warp(logits, 1.0), torch.softmax(logits, dim=-1))
    torch.testing.assert_close(log_warp(logits, 0.7).exp(), warp(logits, 0.7))
    max_probs = [warp(logits, tau).max(dim=-1).values for tau in (2.0, 1.0, 0.5, 0.0)]
    for hotter, colder in zip(max_probs, max_probs[1:], strict=False):
        assert torch.all(colder >= hotter - 1e-6)


def test_warp_bf16_input_gives_fp32() -> None:
    logits = torch.randn(2, 3, 8).bfloat16()
    assert warp(logits, 0.8).dtype == torch.float32
    assert warp(logits, 0.0).dtype == torch.float32
    assert log_warp(logits, 0.8).dtype == torch.float32


def test_invalid_tau() -> None:
    with pytest.raises(ValueError, match="tau must be >= 0"):
        warp(torch.zeros(3), -0.1)
    with pytest.raises(ValueError, match="tau"):
        log_warp(torch.zeros(3), 0.0)


def test_sample_shape_and_distribution() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(2, 3, 4)
    gen = torch.Generator().manual_seed(0)
    assert sample(probs, gen).shape == (2, 3)
    draws = sample(torch.tensor([0.1, 0.0, 0.6, 0.3]).expand(20_000, 4), gen)
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.0, 0.6, 0.3]), atol=0.015, rtol=0)


@pytest.mark.parametrize("rows", [1, 3])
def test_sample_is_torch_multinomial_bit_for_bit(rows: int) -> None:
    """`sample` reimplements multinomial's one-sample path: same tokens and same generator state after,
    on peaked, flat, unnormalised and zero-containing rows."""
    for seed in range(300):
        probs = torch.softmax(torch.randn(rows, 257) * (seed % 7), dim=-1)
        probs[:, seed % 257] = 0.0
        probs = probs * (1 + seed % 3)
        ours, theirs = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert torch.equal(sample(probs, ours), torch.multinomial(probs, 1, generator=theirs)[:, 0])
        assert torch.equal(torch.rand(4, generator=ours), torch.rand(4, generator=theirs))


# ---- acceptance ----


@FAST
@given(pair=logit_pairs(), tau=st.floats(0.2, 2.0))
def test_token_acceptance_is_one_minus_tvd(pair, tau: float) -> None:
    draft, target = pair
    beta = acceptance_from_logits(target, draft, tau)  # [batch, seq]
    tvd = total_variation(draft, target, temperature=tau)
    torch.testing.assert_close(1.0 - beta.mean(), tvd, atol=1e-5, rtol=0)
    same = token_acceptance(warp(target, tau), warp(target, tau))
    torch.testing.assert_close(same, torch.ones_like(same))


def test_acceptance_greedy_is_argmax_agreement() -> None:
    target = torch.tensor([[3.0, 1.0, 0.0], [0.0, 1.0, 3.0]])
    draft = torch.tensor([[2.0, 0.0, 0.0], [5.0, 1.0, 3.0]])
    torch.testing.assert_close(acceptance_from_logits(target, draft, 0.0), torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize(
    ("alpha", "gamma", "expected"),
    [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 3, 1.875), (0.8, 1, 1.8)],
)
def test_expected_block_efficiency_golden(alpha: float, gamma: int, expected: float) -> None:
    assert expected_block_efficiency(alpha, gamma) == pytest.approx(expected, rel=1e-12)


def test_expected_block_efficiency_continuous_near_one() -> None:
    gamma = 5
    for alpha in (1 - 1e-3, 1 - 2e-6, 1 - 5e-7, 1 - 1e-9, 1.0):
        exact = sum(alpha**k for k in range(gamma + 1))
        assert expected_block_efficiency(alpha, gamma) == pytest.approx(exact, rel=1e-9)
    alphas = torch.tensor([0.0, 0.5, 1 - 1e-7, 1.0], dtype=torch.float64)
    out = expected_block_efficiency(alphas, 3)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[[0, 1, 3]], torch.tensor([1.0, 1.875, 4.0], dtype=torch.float64))


def test_expected_block_efficiency_validation() -> None:
    with pytest.raises(ValueError, match="gamma"):
        expected_block_efficiency(0.5, 0)
    with pytest.raises(ValueError, match="alpha"):
        expected_block_efficiency(1.2, 3)
    with pytest.raises(ValueError, match="alpha"):
        expected_block_efficiency(torch.tensor([0.2, -0.1]), 3)


@pytest.mark.parametrize(("alpha", "gamma"), [(0.3, 2), (0.7, 4), (0.9, 6)])
def test_simulated_block_efficiency_matches_iid_formula(alpha: float, gamma: int) -> None:
    beta = torch.full((2, 3000), alpha)
    simulated = simulated_block_efficiency(beta, gamma)
    assert simulated == pytest.approx(expected_block_efficiency(alpha, gamma), rel=1e-2)


def test_simulated_block_efficiency_perfect_draft_and_lengths() -> None:
    gamma = 3
    assert simulated_block_efficiency(torch.ones(3, 8 * (gamma + 1)), gamma) == pytest.approx(gamma + 1)
    # β = 0 everywhere: one token per target call
    assert simulated_block_efficiency(torch.zeros(2, 10), gamma) == pytest.approx(1.0)
    # lengths 8 and 4 with perfect drafts: 2 + 1 calls for 12 tokens; padding (NaN) is ignored
    beta = torch.ones(2, 10)
    beta[1, 4:] = float("nan")
    assert simulated_block_efficiency(beta, gamma, torch.tensor([8, 4])) == pytest.approx(12 / 3)


def test_simulated_block_efficiency_small_case_by_hand() -> None:
    # T = 2, γ = 1, β = (b1, b2): accept first (b1) -> 2 tokens, 1 call; reject -> 1 token, then 1 more call.
    b1, b2 = 0.6, 0.3
    expected_calls = 1 + (1 - b1) * 1
    result = simulated_block_efficiency(torch.tensor([[b1, b2]]), 1)
    assert result == pytest.approx(2 / expected_calls)


def test_speedup_model() -> None:
    assert speedup_model(3.0, 0.05, 4) == pytest.approx(2.5)
    assert speedup_model(2.0, 0.0, 3) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="c "):
        speedup_model(2.0, -0.1, 3)
    with pytest.raises(ValueError, match="gamma"):
        speedup_model(2.0, 0.1, 0)


def test_count_helpers() -> None:
    assert acceptance_rate_from_counts(3, 4) == 0.75
    assert draft_acceptance_from_counts(3, 8) == 0.375
    assert block_efficiency_from_counts(10, 4) == 2.5
    assert math.isnan(acceptance_rate_from_counts(0, 0))
    assert math.isnan(draft_acceptance_from_counts(0, 0))
    assert math.isnan(block_efficiency_from_counts(0, 0))


def test_expected_target_calls_at_the_extremes() -> None:
    """Every draft token accepted: ⌈L / (γ+1)⌉ calls; none accepted: one call per token."""
    from specray.ops import expected_target_calls

    lengths = torch.tensor([7, 4, 0])
    ones, zeros = torch.ones(3, 7), torch.zeros(3, 7)
    assert expected_target_calls(ones, 3, lengths).tolist() == [2.0, 1.0, 0.0]
    assert expected_target_calls(zeros, 3, lengths).tolist() == [7.0, 4.0, 0.0]
