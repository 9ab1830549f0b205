"""Speculative decoding formulas (Leviathan et al., 2023): acceptance, block efficiency, speedup.

Names as in the metric keys and the reports: `acceptance_rate` α, `draft_acceptance`, `block_efficiency`
τ_b, cost ratio `c`.
"""

from __future__ import annotations

import math
from typing import overload

import torch
from torch import Tensor

from specray.ops.warp import warp


def _check_gamma(gamma: int) -> None:
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1 (draft tokens per block), got {gamma!r}")


def token_acceptance(p: Tensor, q: Tensor) -> Tensor:
    """β = Σ_v min(p, q): probability that a draft token from q is accepted by target p (Cor. 3.6).

    p (target probs), q (draft probs): [..., vocab], already warped -> [...] fp32. Equals 1 − TVD(p, q).
    """
    return torch.minimum(p.float(), q.float()).sum(dim=-1)


def acceptance_from_logits(target_logits: Tensor, draft_logits: Tensor, tau: float) -> Tensor:
    """β per position with both models warped at the decoding temperature τ.

    target_logits, draft_logits: [..., vocab] -> [...] fp32. At τ = 0 both are one-hot, so β is 1 exactly
    when the argmaxes agree and 0 otherwise.
    """
    return token_acceptance(warp(target_logits, tau), warp(draft_logits, tau))


@overload
def expected_block_efficiency(alpha: float, gamma: int) -> float: ...
@overload
def expected_block_efficiency(alpha: Tensor, gamma: int) -> Tensor: ...
def expected_block_efficiency(alpha: float | Tensor, gamma: int) -> float | Tensor:
    """E[tokens per target call] for i.i.d. acceptance α: (1 − α^{γ+1}) / (1 − α) = Σ_{k=0}^{γ} α^k.

    alpha: float or tensor of any shape, in [0, 1]; returns the same kind (tensor keeps alpha's shape).
    At α = 1 the value is γ + 1; within 1e-6 of 1 a second-order series replaces the 0/0 closed form.
    """
    _check_gamma(gamma)
    a = torch.as_tensor(alpha, dtype=torch.float64)
    if ((a < 0) | (a > 1) | a.isnan()).any():
        raise ValueError(f"alpha must be in [0, 1], got {alpha!r}")
    n = gamma + 1
    eps = 1.0 - a
    near_one = eps.abs() < 1e-6
    closed = (1.0 - a**n) / torch.where(near_one, 1.0, eps)
    # Σ_{k<n} (1 − ε)^k = n − ε·C(n, 2) + ε²·C(n, 3) − …; the next term is below 1e-12·C(n, 4)
    series = n - eps * math.comb(n, 2) + eps**2 * math.comb(n, 3)
    out = torch.where(near_one, series, closed)
    if not isinstance(alpha, Tensor):
        return float(out)
    return out.to(alpha.dtype) if alpha.is_floating_point() else out


def expected_target_calls(beta_per_position: Tensor, gamma: int, lengths: Tensor | None = None) -> Tensor:
    """Exact expected target calls to decode each sequence when position t's draft token is accepted
    with probability β_t (speculative decoding with γ draft tokens per block).

    beta_per_position: [batch, T]; lengths: [batch] valid lengths (None = all T). Unlike
    `expected_block_efficiency`, the β's are not i.i.d.: a block starting at position t drafts positions
    t … t+γ−1; it accepts the first k and rejects the next with probability Π_{i<k} β_{t+i} · (1 − β_{t+k})
    (k < γ), emitting k + 1 tokens (the +1 is the target's correction); with all γ accepted it emits γ + 1
    (the target's bonus token). With E[s] the expected target calls to finish from start position s
    (E[s] = 0 for s ≥ length), the dynamic program
        E[t] = 1 + Σ_{k<γ} P(k)·E[t+k+1] + P(γ)·E[t+γ+1]
    is solved backwards from the end. Returns E[0] per sequence, [batch] float64 (0 for an empty one).
    """
    _check_gamma(gamma)
    batch, seq = beta_per_position.shape
    if lengths is None:
        lengths = torch.full((batch,), seq, dtype=torch.long)
    lengths = lengths.to(device=beta_per_position.device, dtype=torch.long)
    positions = torch.arange(seq, device=beta_per_position.device)
    valid = positions[None, :] < lengths[:, None]  # [batch, T]
    # padding may hold NaN; its β is never used for a reachable outcome, but NaN * 0 would still leak
    beta = torch.where(valid, beta_per_position.double().clamp(0.0, 1.0), 1.0)
    beta = torch.nn.functional.pad(beta, (0, gamma), value=1.0)  # [batch, T + γ]
    calls = torch.zeros(batch, seq + gamma + 1, dtype=torch.float64, device=beta.device)  # E[s]
    ones = torch.ones(batch, 1, dtype=torch.float64, device=beta.device)
    for t in range(seq - 1, -1, -1):
        window = beta[:, t : t + gamma]  # [batch, γ]
        prefix = torch.cat([ones, window.cumprod(dim=-1)], dim=-1)  # Π_{i<k} β_{t+i}, k = 0..γ
        reject = torch.cat([1.0 - window, ones], dim=-1)  # (1 − β_{t+k}); k = γ means "all accepted"
        expected = 1.0 + (prefix * reject * calls[:, t + 1 : t + gamma + 2]).sum(dim=-1)
        calls[:, t] = torch.where(valid[:, t], expected, 0.0)
    return calls[:, 0]


def simulated_block_efficiency(beta_per_position: Tensor, gamma: int, lengths: Tensor | None = None) -> float:
    """Exact expected tokens per target call when position t's draft token is accepted with prob β_t:
    Σ lengths / Σ E[0] over the batch (see `expected_target_calls`; nan if no tokens)."""
    if lengths is None:
        lengths = torch.full((beta_per_position.shape[0],), beta_per_position.shape[1], dtype=torch.long)
    total_calls = float(expected_target_calls(beta_per_position, gamma, lengths).sum())
    return float(lengths.sum()) / total_calls if total_calls > 0 else math.nan


@overload
def speedup_model(block_efficiency: float, c: float, gamma: int) -> float: ...
@overload
def speedup_model(block_efficiency: Tensor, c: float, gamma: int) -> Tensor: ...
def speedup_model(block_efficiency: float | Tensor, c: float, gamma: int) -> float | Tensor:
    """Modelled wall-time speedup τ_b / (c·γ + 1), with c = draft step latency / target step latency."""
    _check_gamma(gamma)
    if not c >= 0.0:
        raise ValueError(f"c (draft/target latency ratio) must be >= 0, got {c!r}")
    return block_efficiency / (c * gamma + 1.0)


def acceptance_rate_from_counts(accepted: int, tested: int) -> float:
    """α = accepted / tested draft tokens; drafts after a rejection are discarded untested. nan if 0."""
    return accepted / tested if tested else math.nan


def draft_acceptance_from_counts(accepted: int, drafted: int) -> float:
    """accepted / all drafted tokens (HF assisted generation's and the paper's counting). nan if 0."""
    return accepted / drafted if drafted else math.nan


def block_efficiency_from_counts(emitted: int, target_calls: int) -> float:
    """τ_b = emitted tokens / target forward passes (at most γ + 1). nan if 0."""
    return emitted / target_calls if target_calls else math.nan
