"""Divergences between a teacher distribution P and a student distribution Q, given logits.

Every divergence has the same shape contract (torchtune style):

    student_logits, teacher_logits: [batch, seq, vocab] (any leading dims)
    mask: [batch, seq] bool or 0/1, True = the token counts (None = all count)
    temperature: τ > 0 divides both logits before the softmax
    averaging: "token" = mean over the counted positions (0.0 when none count); "sequence" = mean within
        each sequence (the last dim of the mask), then over the sequences that have a counted position
        (DistillSpec's Eq. 2: every sequence weighs the same, whatever its length)
    chunk_size: 0 = all positions at once; n > 0 = n positions at a time, each chunk under activation
        checkpointing, so the fp32 intermediates ([n, vocab] each) exist for one chunk at a time, in the
        forward and in the backward pass (the way torchtune chunks its KD losses; same values up to fp
        round-off)
    -> scalar

Math is done on log-probabilities in at least fp32 (bf16/fp16 are upcast; fp64 stays fp64, which tests
use to check asymptotics that fp32 rounding would hide). Vocab entries with -inf logits (masked or padded
vocab) have p = 0 and contribute 0 (0·log 0 = 0) with finite gradients.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

Averaging = Literal["token", "sequence"]
AVERAGINGS: tuple[Averaging, ...] = ("token", "sequence")


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


def averaging_units(mask: Tensor, averaging: Averaging = "token") -> Tensor:
    """What an average over the counted positions of `mask` [..., seq] divides by: the counted positions
    (token), or the sequences (last dim) with at least one counted position (sequence)."""
    if averaging not in AVERAGINGS:
        raise ValueError(f"unknown averaging {averaging!r}; valid: {', '.join(AVERAGINGS)}")
    mask = mask.to(dtype=torch.bool)
    return mask.sum() if averaging == "token" else (mask.sum(dim=-1) > 0).sum()


def masked_sum(
    per_token: Tensor, mask: Tensor | None, averaging: Averaging = "token"
) -> tuple[Tensor, Tensor]:
    """(sum, units) with sum / units = the average of `per_token` [..., seq] over the counted positions.

    token: sum over counted positions. sequence: sum over sequences of each one's mean over its counted
    positions. `units` is `averaging_units`. As a sum, the loss of several micro-batches (or ranks) can be
    added up and divided once by the global units: the global average.
    """
    if mask is None:
        mask = torch.ones_like(per_token, dtype=torch.bool)
    mask = mask.to(device=per_token.device, dtype=torch.bool)
    units = averaging_units(mask, averaging)
    # where, not multiply: padding positions may hold inf/NaN and NaN * 0 is NaN
    counted = torch.where(mask, per_token, 0.0)
    if averaging == "token":
        return counted.sum(), units
    lengths = mask.sum(dim=-1)  # [...]: counted positions per sequence
    return (counted.sum(dim=-1) / lengths.clamp(min=1)).sum(), units


def masked_average(per_token: Tensor, mask: Tensor | None, averaging: Averaging = "token") -> Tensor:
    """Average of per_token [..., seq] over the counted positions; 0.0 (with a grad path) if none count."""
    total, units = masked_sum(per_token, mask, averaging)
    return total / units.clamp(min=1)


def chunked_rows(function: Callable[..., Tensor], tensors: Sequence[Tensor], chunk_size: int) -> Tensor:
    """`function(*tensors)` computed on `chunk_size` rows (dim 0) at a time and concatenated; 0 = at once.

    With grad enabled each chunk runs under (non-reentrant) activation checkpointing: its forward keeps
    only its inputs, and the backward recomputes the chunk's intermediates when it reaches it. That is the
    memory win: without it autograd would keep every chunk's fp32 [chunk, vocab] tensors until backward.
    `function` must be deterministic (it runs twice); it may use parameters from its closure (an LM head).
    """
    if chunk_size < 0:
        raise ValueError(f"chunk_size must be >= 0, got {chunk_size!r}")
    rows = tensors[0].shape[0]
    if chunk_size == 0 or rows <= chunk_size:
        return function(*tensors)
    outputs = []
    for start in range(0, rows, chunk_size):
        chunk = [t[start : start + chunk_size] for t in tensors]
        if torch.is_grad_enabled():
            outputs.append(checkpoint(function, *chunk, use_reentrant=False))
        else:
            outputs.append(function(*chunk))
    return torch.cat(outputs)


def _divergence(
    per_token: Callable[..., Tensor],
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None,
    averaging: Averaging,
    chunk_size: int,
    **options: float,
) -> Tensor:
    """`per_token` over every position (chunked along the flattened positions), then averaged."""
    vocab = student_logits.shape[-1]
    rows = (student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab))  # [positions, vocab]
    values = chunked_rows(functools.partial(per_token, **options), rows, chunk_size)
    return masked_average(values.view(student_logits.shape[:-1]), mask, averaging)


def fkl_per_token(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(P‖Q) at each position: [..., vocab] -> [...]."""
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    return _kl_per_token(log_p, log_q)


def rkl_per_token(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """KL(Q‖P) at each position: [..., vocab] -> [...]."""
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    return _kl_per_token(log_q, log_p)


def jsd_per_token(
    student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0, beta: float = 0.5
) -> Tensor:
    """JSD(β) = β·KL(P‖M) + (1−β)·KL(Q‖M), M = β·P + (1−β)·Q, at each position: [..., vocab] -> [...]."""
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
    return beta * _kl_per_token(log_p, log_m) + (1.0 - beta) * _kl_per_token(log_q, log_m)


def tvd_per_token(student_logits: Tensor, teacher_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """½ Σ_v |p − q| at each position: [..., vocab] -> [...]."""
    log_p, log_q = _log_probs(student_logits, teacher_logits, temperature)
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(dim=-1)


def forward_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    *,
    averaging: Averaging = "token",
    chunk_size: int = 0,
) -> Tensor:
    """FKL = KL(P‖Q) = Σ_v p (log p − log q): mean-seeking, the DistillSpec/torchtune "forward KL".

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    options = {"temperature": temperature}
    return _divergence(fkl_per_token, student_logits, teacher_logits, mask, averaging, chunk_size, **options)


def reverse_kl(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    *,
    averaging: Averaging = "token",
    chunk_size: int = 0,
) -> Tensor:
    """RKL = KL(Q‖P) = Σ_v q (log q − log p): mode-seeking.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    options = {"temperature": temperature}
    return _divergence(rkl_per_token, student_logits, teacher_logits, mask, averaging, chunk_size, **options)


def jsd(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    beta: float = 0.5,
    *,
    averaging: Averaging = "token",
    chunk_size: int = 0,
) -> Tensor:
    """Generalized JSD(β) of GKD / DistillSpec, β ∈ (0, 1) exclusive.

    M = β·P + (1−β)·Q;  JSD(β) = β·KL(P‖M) + (1−β)·KL(Q‖M).
    Endpoints: JSD(β) = β·KL(P‖Q) + O(β²), so JSD(β)/β → FKL as β → 0 and, symmetrically,
    JSD(β)/(1−β) → RKL as β → 1. JSD(0.5) ≤ log 2.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    if not 0.0 < beta < 1.0:  # before any chunk runs
        raise ValueError(f"beta must be in (0, 1) exclusive, got {beta!r}")
    options = {"temperature": temperature, "beta": beta}
    return _divergence(jsd_per_token, student_logits, teacher_logits, mask, averaging, chunk_size, **options)


def total_variation(
    student_logits: Tensor,
    teacher_logits: Tensor,
    mask: Tensor | None = None,
    temperature: float = 1.0,
    *,
    averaging: Averaging = "token",
    chunk_size: int = 0,
) -> Tensor:
    """TVD = ½ Σ_v |p − q| ∈ [0, 1]; 1 − TVD is the speculative acceptance probability β.

    student_logits, teacher_logits: [batch, seq, vocab]; mask: [batch, seq] -> scalar.
    """
    options = {"temperature": temperature}
    return _divergence(tvd_per_token, student_logits, teacher_logits, mask, averaging, chunk_size, **options)


PER_TOKEN: dict[str, Callable[..., Tensor]] = {
    "fkl": fkl_per_token,
    "rkl": rkl_per_token,
    "jsd": jsd_per_token,
    "tvd": tvd_per_token,
}


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


def get_per_token_divergence(name: str) -> Callable[..., Tensor]:
    """The per-position form [..., vocab] -> [...] of the divergence `name` (no mask, no averaging)."""
    get_divergence(name)  # the one error message for an unknown name
    return PER_TOKEN[name]
