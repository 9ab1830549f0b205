"""Lossy speculative sampling (specray/ops/lenience.py): golden values, monotonicity, ε = 1 is lossless
bit for bit, and a chi-square test that ε < 1 leaves the target distribution (and ε = 1 does not)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from specray.ops import (
    LENIENCES,
    get_lenience,
    lenient_acceptance,
    lenient_acceptance_from_logits,
    lenient_target,
    lenient_token_acceptance,
    token_acceptance,
    verify_block,
    verify_block_lenient,
    warp,
)

FAST = settings(max_examples=25, deadline=None, database=None)
EPSILONS = (1.0, 0.5, 0.1, 0.01)


def _distribution(gen: torch.Generator, shape: tuple[int, ...], scale: float) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=gen) * scale, dim=-1)  # [..., vocab] fp32


@st.composite
def prob_pairs(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Target and draft probabilities [rows, vocab], from a hypothesis-drawn seed and sharpness."""
    rows, vocab, scale = draw(st.integers(1, 4)), draw(st.integers(2, 12)), draw(st.floats(0.1, 8.0))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return _distribution(gen, (rows, vocab), scale), _distribution(gen, (rows, vocab), scale)


# ---- the lenience functions ----


def test_golden_values() -> None:
    p = torch.tensor([0.0, 0.01, 0.25, 1.0])
    assert get_lenience("lin")(p, 0.5).tolist() == pytest.approx([0.0, 0.02, 0.5, 2.0])
    assert get_lenience("sq")(p, 0.5).tolist() == pytest.approx([0.0, 0.04, 1.0, 4.0])
    assert get_lenience("exp")(p, 0.5).tolist() == pytest.approx([0.0, 0.1, 0.5, 1.0])
    assert get_lenience("sq")(p, 0.1).tolist() == pytest.approx([0.0, 1.0, 25.0, 100.0])
    assert get_lenience("exp")(torch.tensor([0.01]), 0.01).item() == pytest.approx(0.01**0.01)  # 0.955


@pytest.mark.parametrize("name", sorted(LENIENCES))
def test_epsilon_one_is_the_identity(name: str) -> None:
    p = torch.softmax(torch.randn(5, 11, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert torch.equal(get_lenience(name)(p, 1.0), p)  # the raw function, not only the ε = 1 shortcut
    assert torch.equal(lenient_target(p, name, 1.0), p)


def test_unknown_name_and_bad_epsilon() -> None:
    with pytest.raises(ValueError, match="unknown lenience function 'cube'; valid: lin, sq, exp"):
        get_lenience("cube")
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"epsilon must be in \(0, 1\]"):
            lenient_target(torch.tensor([0.5]), "lin", bad)


def test_acceptance_of_a_token_golden() -> None:
    p_x, q_x = torch.tensor([0.1, 0.1, 0.3, 0.0]), torch.tensor([0.4, 0.15, 0.2, 0.0])
    assert lenient_acceptance(p_x, q_x, "lin", 1.0).tolist() == pytest.approx([0.25, 2 / 3, 1.0, 1.0])
    assert lenient_acceptance(p_x, q_x, "lin", 0.5).tolist() == pytest.approx([0.5, 1.0, 1.0, 1.0])
    assert lenient_acceptance(p_x, q_x, "exp", 0.5).tolist() == pytest.approx([0.1**0.5 / 0.4, 1.0, 1.0, 1.0])


# ---- β_ε ----


@pytest.mark.parametrize("name", sorted(LENIENCES))
@FAST
@given(pair=prob_pairs())
def test_beta_at_epsilon_one_is_one_minus_tvd(name: str, pair) -> None:
    p, q = pair
    tvd = 0.5 * (p - q).abs().sum(dim=-1)
    assert torch.allclose(lenient_token_acceptance(p, q, name, 1.0), 1.0 - tvd, atol=1e-6)
    assert torch.equal(lenient_token_acceptance(p, q, name, 1.0), token_acceptance(p, q))


@pytest.mark.parametrize("name", sorted(LENIENCES))
@FAST
@given(pair=prob_pairs())
def test_acceptance_rises_as_epsilon_falls(name: str, pair) -> None:
    p, q = pair
    betas = torch.stack([lenient_token_acceptance(p, q, name, eps) for eps in EPSILONS])  # [ε, rows]
    assert (betas[1:] >= betas[:-1]).all() and (betas <= 1.0).all()
    tokens = torch.multinomial(q, 1).squeeze(-1)  # [rows]: one drafted token per row
    rows = torch.arange(len(tokens))
    per_token = torch.stack(
        [lenient_acceptance(p[rows, tokens], q[rows, tokens], name, eps) for eps in EPSILONS]
    )
    assert (per_token[1:] >= per_token[:-1]).all()


def test_beta_golden_and_the_cap() -> None:
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    # lin ε=0.5: f = [1.0, 0.6, 0.4]; min(q, f) = [0.2, 0.3, 0.4]
    assert lenient_token_acceptance(p, q, "lin", 0.5).item() == pytest.approx(0.9)
    # sq ε=0.1: f ≥ q everywhere, every draft is accepted: β = Σ q = 1, not more
    assert lenient_token_acceptance(p, q, "sq", 0.1).item() == pytest.approx(1.0)
    assert lenient_token_acceptance(p, q * 1.0000001, "sq", 0.1).item() <= 1.0


def test_greedy_lenience_changes_nothing() -> None:
    """τ = 0: one-hot p and q, so β_ε = β ∈ {0, 1} for every ε and function (the module docstring's rule)."""
    gen = torch.Generator().manual_seed(3)
    target, draft = torch.randn(64, 9, generator=gen), torch.randn(64, 9, generator=gen)
    lossless = lenient_acceptance_from_logits(target, draft, 0.0, "lin", 1.0)
    assert set(lossless.tolist()) == {0.0, 1.0}
    for name in LENIENCES:
        for eps in EPSILONS:
            assert torch.equal(lenient_acceptance_from_logits(target, draft, 0.0, name, eps), lossless)


# ---- verification ----


def _random_block(gen: torch.Generator, vocab: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft tokens [γ], q [γ, vocab], p [γ + 1, vocab]) at a random τ, one-hot (τ = 0) included."""
    gamma = int(torch.randint(1, 6, (1,), generator=gen))
    tau = [0.0, 0.3, 0.7, 1.0, 1.5][int(torch.randint(5, (1,), generator=gen))]
    q = warp(torch.randn(gamma, vocab, generator=gen) * 3, tau)
    p = warp(torch.randn(gamma + 1, vocab, generator=gen) * 3, tau)
    if int(torch.randint(4, (1,), generator=gen)) == 0:
        p[:gamma] = q  # a perfect draft: every token is accepted
    return torch.multinomial(q, 1, generator=gen).squeeze(-1), q, p


@pytest.mark.parametrize("name", sorted(LENIENCES))
def test_epsilon_one_decodes_bit_identically_to_verify_block(name: str) -> None:
    """Same result and the same generator state afterwards (the random stream is consumed identically)."""
    gen = torch.Generator().manual_seed(11)
    for case in range(500):
        tokens, q, p = _random_block(gen)
        lossless_gen, lossy_gen = torch.Generator().manual_seed(case), torch.Generator().manual_seed(case)
        expected = verify_block(tokens, q, p, lossless_gen)
        assert verify_block_lenient(tokens, q, p, name, 1.0, lossy_gen) == expected, case
        assert torch.equal(lossless_gen.get_state(), lossy_gen.get_state()), case


@pytest.mark.parametrize("name", sorted(LENIENCES))
def test_greedy_verification_ignores_epsilon(name: str) -> None:
    gen = torch.Generator().manual_seed(5)
    for case in range(200):
        tokens, q, p = _random_block(gen)
        q, p = warp(q.log(), 0.0), warp(p.log(), 0.0)  # one-hot at each row's argmax
        tokens = q.argmax(dim=-1)
        expected = verify_block(tokens, q, p, torch.Generator().manual_seed(case))
        for eps in (0.5, 0.01):
            assert (
                verify_block_lenient(tokens, q, p, name, eps, torch.Generator().manual_seed(case)) == expected
            )


def test_lossy_verification_accepts_what_lossless_rejects() -> None:
    q = torch.tensor([[0.1, 0.9]])  # drafted token 1 with q = 0.9, target gives it p = 0.3
    p = torch.tensor([[0.7, 0.3], [0.5, 0.5]])
    tokens = torch.tensor([1])
    lossless = sum(verify_block(tokens, q, p, torch.Generator().manual_seed(s))[0] for s in range(2000))
    lossy = sum(
        verify_block_lenient(tokens, q, p, "lin", 0.5, torch.Generator().manual_seed(s))[0]
        for s in range(2000)
    )
    assert lossless / 2000 == pytest.approx(1 / 3, abs=0.04)  # min(1, 0.3/0.9)
    assert lossy / 2000 == pytest.approx(2 / 3, abs=0.04)  # min(1, 0.6/0.9)


# ---- the output distribution of a lossy sampler ----

P = torch.tensor([0.40, 0.30, 0.15, 0.10, 0.05])  # target
Q = torch.tensor([0.10, 0.20, 0.30, 0.25, 0.15])  # draft


def lossy_distribution(p: torch.Tensor, q: torch.Tensor, name: str, eps: float) -> torch.Tensor:
    """Exact law of the emitted token: accepted draft mass min(q, f(p)) plus (1 − β_ε) times the residual."""
    accepted = torch.minimum(q, lenient_target(p, name, eps))
    residual = (p - q).clamp(min=0.0)
    return accepted + (1.0 - accepted.sum()) * residual / residual.sum()


def sampled_counts(name: str, eps: float, n: int, seed: int) -> torch.Tensor:
    """Counts of the first emitted token of n one-token blocks: draft y ~ Q, verify_block_lenient."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.stack([P, P])  # [γ + 1, vocab]: the bonus row never matters for the first token
    counts = torch.zeros(len(P), dtype=torch.float64)
    for _ in range(n):
        y = torch.multinomial(Q, 1, generator=gen)  # [1]
        accepted, next_token = verify_block_lenient(y, Q[None], p, name, eps, gen)
        counts[int(y) if accepted else next_token] += 1
    return counts


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    probs = probs.double()
    return float(chisquare(counts.numpy(), (probs / probs.sum() * counts.sum()).numpy()).pvalue)


# an ε per function at which some drafts are still rejected, so the residual's law is tested too
REJECTING_EPSILON = {"lin": 0.5, "sq": 0.8, "exp": 0.8}


@pytest.mark.parametrize("name", sorted(LENIENCES))
def test_lossy_sampler_leaves_the_target_distribution(name: str) -> None:
    """ε < 1: 8k samples match the exact lossy law and reject the target's (the test has power);
    ε = 1: the same sampler reproduces the target's distribution."""
    eps = REJECTING_EPSILON[name]
    assert 0.6 < lenient_token_acceptance(P, Q, name, eps) < 0.95
    lossy = sampled_counts(name, eps, 8000, seed=1)
    assert chi_square_p(lossy, lossy_distribution(P, Q, name, eps)) > 1e-3
    assert chi_square_p(lossy, P) < 1e-6
    lossless = sampled_counts(name, 1.0, 8000, seed=2)
    assert chi_square_p(lossless, P) > 1e-3
    assert chi_square_p(lossless, Q) < 1e-6
