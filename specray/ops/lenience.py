"""Lossy speculative sampling with a lenience function (DistillSpec, Zhou et al., 2023, §5 and Algorithm A.1).

Lossless speculative sampling accepts a draft token y with probability min(1, p(y)/q(y)). DistillSpec
relaxes the target side with a lenience function f(p, ε), ε ∈ (0, 1]:

    f_lin(p, ε) = p / ε        f_sq(p, ε) = p / ε²        f_exp(p, ε) = p^ε

and accepts y with probability min(1, f(p(y), ε) / q(y)). On rejection the replacement still comes from
the lossless residual norm(max(0, p − q)), and after a fully accepted block the bonus token from p, exactly
as in Algorithm A.1. Since f(p, ε) ≥ p for p ∈ [0, 1], more tokens are accepted as ε falls and the output
drifts from the target towards the draft; ε = 1 gives f(p, 1) = p, today's lossless rule.

Acceptance per position: P(accept) = Σ_y q(y)·min(1, f(p(y))/q(y)) = Σ_v min(q(v), f(p(v), ε)) = β_ε,
which is 1 − TVD(p, q) at ε = 1 (Leviathan et al., 2023, Cor. 3.6).

τ_dec = 0 (greedy). Both distributions are one-hot there, and f maps a one-hot p to a vector that is 1/ε
(lin), 1/ε² (sq) or 1 (exp) at the target's argmax and 0 elsewhere; with q(y) = 1 the acceptance
min(1, f(p(y))/q(y)) is 1 when y is the target's argmax and 0 otherwise, for every ε. So the rule at
τ_dec = 0 is: lenience changes nothing. Greedy verification has no ratio to relax, a lossy greedy decode is
the lossless greedy decode (token for token, and with the same random draws), and β_ε = β. A lossy cell at
τ_dec = 0 duplicates the lossless one; a relaxation of greedy decoding (e.g. accepting any token in the
target's top k) would be a different algorithm, not DistillSpec's f. No special case in the code: the rule
falls out of the formulas, and a test checks it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from specray.ops.speculative import next_token
from specray.ops.warp import warp

Lenience = Callable[[Tensor, float], Tensor]


def lenience_lin(p: Tensor, epsilon: float) -> Tensor:
    """f_lin(p, ε) = p / ε. p: [...] probabilities -> [...] (may exceed 1; callers cap the ratio)."""
    return p / epsilon


def lenience_sq(p: Tensor, epsilon: float) -> Tensor:
    """f_sq(p, ε) = p / ε². p: [...] -> [...]; the most lenient of the three for small ε."""
    return p / epsilon**2


def lenience_exp(p: Tensor, epsilon: float) -> Tensor:
    """f_exp(p, ε) = p^ε. p: [...] -> [...] in [0, 1]: lifts small probabilities most (0^ε stays 0)."""
    return p.pow(epsilon)


LENIENCES: dict[str, Lenience] = {"lin": lenience_lin, "sq": lenience_sq, "exp": lenience_exp}


def get_lenience(name: str) -> Lenience:
    """The lenience function registered under `name` (lin, sq, exp)."""
    if name not in LENIENCES:
        raise ValueError(f"unknown lenience function {name!r}; valid: {', '.join(LENIENCES)}")
    return LENIENCES[name]


def lenient_target(p: Tensor, lenience: str, epsilon: float) -> Tensor:
    """f(p, ε) for the named lenience function, in at least fp32. p: [...] -> [...].

    ε = 1 returns p itself (cast only), so the lossless rule involves no arithmetic at all and decodes at
    ε = 1 are bit-identical to the lossless decoder's.
    """
    if not 0.0 < epsilon <= 1.0:  # written this way so NaN is rejected too
        raise ValueError(f"lenience epsilon must be in (0, 1] (1 = lossless), got {epsilon!r}")
    fn = get_lenience(lenience)
    p = p.to(torch.promote_types(p.dtype, torch.float32))  # fp64 stays fp64, like verify_block's compare
    return p if epsilon == 1.0 else fn(p, epsilon)


def lenient_acceptance(p_x: Tensor, q_x: Tensor, lenience: str, epsilon: float) -> Tensor:
    """min(1, f(p(y), ε) / q(y)): the probability that draft token y is accepted.

    p_x, q_x: [...] target and draft probabilities of the drafted tokens -> [...] fp32 in [0, 1].
    A token with q(y) = 0 is never drafted; it gets 1 (the limit of the ratio) rather than NaN.
    """
    f_x = lenient_target(p_x.float(), lenience, epsilon)  # [...]
    q_x = q_x.float()
    return torch.where(f_x >= q_x, 1.0, f_x / q_x.clamp(min=torch.finfo(q_x.dtype).tiny))


def lenient_token_acceptance(p: Tensor, q: Tensor, lenience: str, epsilon: float) -> Tensor:
    """β_ε = Σ_v min(q(v), f(p(v), ε)), capped at 1: expected acceptance of one draft token.

    p (target probs), q (draft probs): [..., vocab], already warped -> [...] fp32. At ε = 1 this is
    Σ min(p, q) = 1 − TVD(p, q); it never decreases as ε falls. The cap only absorbs fp round-off
    (Σ_v min(q, ·) ≤ Σ_v q = 1).
    """
    f = lenient_target(p.float(), lenience, epsilon)
    return torch.minimum(q.float(), f).sum(dim=-1).clamp(max=1.0)


def lenient_acceptance_from_logits(
    target_logits: Tensor, draft_logits: Tensor, tau: float, lenience: str, epsilon: float
) -> Tensor:
    """β_ε per position with both models warped at the decoding temperature τ.

    target_logits, draft_logits: [..., vocab] -> [...] fp32. At τ = 0 it equals the lossless β for
    every ε (see the module docstring).
    """
    return lenient_token_acceptance(warp(target_logits, tau), warp(draft_logits, tau), lenience, epsilon)


def verify_block_lenient(
    draft_tokens: Tensor,
    q: Tensor,
    p: Tensor,
    lenience: str,
    epsilon: float,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """One lossy verification step (DistillSpec Algorithm A.1): accept a prefix, pick the next token.

    draft_tokens: [γ] int64; q: [γ, vocab] draft probs; p: [γ + 1, vocab] target probs (same τ).
    Returns (n_accepted in 0..γ, next_token): the caller emits draft_tokens[:n] then next_token.
    Same contract and the same random draws as `specray.ops.speculative.verify_block` (γ uniforms,
    then one sample), so at ε = 1 the result and the generator's state after the call are identical.
    """
    gamma = draft_tokens.shape[0]
    rows = torch.arange(gamma, device=p.device)
    p_x, q_x = p[rows, draft_tokens], q[rows, draft_tokens]  # [γ]
    # drawn on p's device, where `generator` must live too (a CUDA generator for CUDA logits)
    u = torch.rand(gamma, generator=generator, dtype=p.dtype, device=p.device)
    # u < f(p)/q written without the division; q_x > 0 because x was sampled from q
    accepted = u * q_x < lenient_target(p_x, lenience, epsilon)  # [γ]
    rejected = (~accepted).nonzero()
    n = int(rejected[0]) if len(rejected) else gamma
    return n, next_token(p, q, n, generator)
