"""Divergences between a teacher distribution P and a student distribution Q, given logits.

Every function has the same shape contract (torchtune style):

    student_logits, teacher_logits: [batch, seq, vocab] (any leading dims)
    mask: [batch, seq] bool or 0/1, True = the token counts (None = all count)
    temperature: τ > 0 divides both logits before the softmax
    -> scalar: sum over vocab, then mean over the masked positions (0.0 when no position counts)

Math is done on log-probabilities in at least fp32 (bf16/fp16 are upcast; fp64 stays fp64, which tests
use to check asymptotics that fp32 rounding would hide). Vocab entries with -inf logits (masked or padded
vocab) have p = 0 and contribute 0 (0·log 0 = 0) with finite gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def _log_probs(student_logits: Tensor, teacher_logits: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """Returns (log p teacher, log q student), each [..., vocab] in at least fp32."""
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    dtype = torch.promote_types(
        torch.promote_types(teacher_logits.dtype, student_logits.dtype), torch.float32
    )
    log_p = torch.log_softmax(teacher_logits.to(dtype) / temperature, dim=-1)
    log_q = torch.log_softmax(student_logits.to(dtype) / temperature, dim=-1)
    return log_p, log_q


def _kl_per_token(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(P‖Q) summed over vocab: [..., vocab] -> [...]. Terms with p == 0 are exactly 0.

    Both logs are replaced by 0 where p == 0 *before* subtracting, so a -inf on both sides never makes a
    NaN (-inf - -inf) whose gradient would poison the whole row through log_softmax.
    """
    p = log_p.exp()
    has_mass = p > 0
    log_p = torch.where(has_mass, log_p, 0.0)
    log_q = torch.where(has_mass, log_q, 0.0)
    return (p * (log_p - log_q)).sum(dim=-1)


def _masked_mean(per_token: Tensor, mask: Tensor | None) -> Tensor:
    """Mean of per_token [...] over positions where mask [...] is true; 0.0 (with a grad path) if none."""
    if mask is None:
        mask = torch.ones_like(per_token, dtype=torch.bool)
    mask = mask.to(device=per_token.device, dtype=torch.bool)
    # where, not multiply: padding positions may hold inf/NaN and NaN * 0 is NaN
    total = torch.where(mask, per_token, 0.0).sum()
    return total / mask.sum().clamp(min=1)


def forward_kl(
    student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, temperature: float = 1.0
) -> Tensor:
    """FKL = KL(P‖Q) = Σ_v p (log p − log q): mean-seeking, the DistillSpec/torchtune "forward KL".

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    return _masked_mean(_kl_per_token(log_p, log_q), mask)


def reverse_kl(
    student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, temperature: float = 1.0
) -> Tensor:
    """RKL = KL(Q‖P) = Σ_v q (log q − log p): mode-seeking.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    return _masked_mean(_kl_per_token(log_q, log_p), mask)


def jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
) -> Tensor:
    """Generalized JSD(β) of GKD / DistillSpec, β ∈ (0, 1) exclusive.

    M = β·P + (1−β)·Q;  JSD(β) = β·KL(P‖M) + (1−β)·KL(Q‖M).
    Endpoints: JSD(β) = β·KL(P‖Q) + O(β²), so JSD(β)/β → FKL as β → 0 and, symmetrically,
    JSD(β)/(1−β) → RKL as β → 1. JSD(0.5) ≤ log 2.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1) exclusive, got {beta!r}")
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    # log M by logsumexp: stable where p or q underflow. Entries where both are -inf (p = q = 0) get a
    # finite stand-in, because logsumexp's backward at (-inf, -inf) is NaN even when its grad is 0.
    both_zero = torch.isneginf(log_p) & torch.isneginf(log_q)
    from_p = torch.where(both_zero, 0.0, math.log(beta) + log_p)
    from_q = torch.where(both_zero, 0.0, math.log1p(-beta) + log_q)
    log_m = torch.logsumexp(torch.stack([from_p, from_q]), dim=0)
    log_m = torch.where(both_zero, -math.inf, log_m)  # [..., vocab]
    per_token = beta * _kl_per_token(log_p, log_m) + (1.0 - beta) * _kl_per_token(log_q, log_m)
    return _masked_mean(per_token, mask)


def total_variation(
    student_logits: Tensor, teacher_logits: Tensor, mask: Tensor | None = None, temperature: float = 1.0
) -> Tensor:
    """TVD = ½ Σ_v |p − q| ∈ [0, 1]; 1 − TVD is the speculative acceptance probability β.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    per_token = 0.5 * (log_p.exp() - log_q.exp()).abs().sum(dim=-1)
    return _masked_mean(per_token, mask)


DIVERGENCES: dict[str, Callable[..., Tensor]] = {
    "fkl": forward_kl,
    "rkl": reverse_kl,
    "jsd": jsd,
    "tvd": total_variation,
}


def get_divergence(name: str) -> Callable[..., Tensor]:
    """The divergence registered under `name` (fkl, rkl, jsd, tvd)."""
    if name not in DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}; valid: {', '.join(sorted(DIVERGENCES))}")
    return DIVERGENCES[name]
