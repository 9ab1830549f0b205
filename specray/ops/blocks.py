"""Expected verification-step counts from per-position acceptance β: the metrics servers report.

Servers count per verification step (vLLM's `SpecDecodingStats`, HF assisted generation's `n_matches`):
drafted tokens, accepted tokens, and per draft position k whether at least k + 1 were accepted. From these:
    mean_acceptance_length = 1 + accepted / steps          (vLLM: 1 + num_accepted_tokens / num_drafts)
    draft_acceptance       = accepted / drafted           (vLLM's "draft acceptance rate", HF's counting)
    acceptance at position k = steps with ≥ k+1 accepted / steps   (vLLM's per-position acceptance rate)

`expected_block_counts` gives their expectations for one sampled continuation y of length ℓ, under the
model of `simulated_block_efficiency` (the draft token at position t is accepted with probability β_t,
independently given the prefix), following the decoders' own rules (specdec/decoder.py, and transformers'
assisted generation configured like it):
  - a step starting after t emitted tokens drafts d_t = min(γ, M − t − 1) tokens (M = max_new_tokens: the
    step's last token always comes from the target);
  - it accepts k < e tokens then rejects one with probability Π_{i<k} β_{t+i} · (1 − β_{t+k}), emitting
    k + 1 tokens, or accepts all e = min(d_t, ℓ − t) positions that exist, with probability Π_{i<e} β_{t+i};
  - when the whole chain up to y's EOS at ℓ − 1 is accepted (only when y ended by EOS, ℓ < M, and the step
    reached it, d_t ≥ ℓ − t), the draft stopped at its EOS: that step drafted e = ℓ − t tokens, accepted
    them all, and decoding ends (HF's `n_matches` counts this EOS as the step's own token, one fewer
    accepted: `eos_steps` is the expected number of such steps);
  - a step rejected at position k drafted k + 1 tokens when the rejected proposal was the EOS (the draft
    stops there; probability r_k = (q_k − min(p_k, q_k))(EOS) / (1 − β_k), `draft_stop_after_rejection`),
    and otherwise e tokens: the proposals after a rejection come from a prefix the output does not hold, so
    the draft is taken to propose its EOS where the output has it (or to draft all d_t if it has none) —
    the one approximation here; it only matters in steps that reach the output's end.
A forward pass over start positions carries the probability that a step starts at t.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class BlockCounts(NamedTuple):
    """Expected counts per continuation, each [batch] (float64); `accepted_at` [batch, γ]."""

    steps: Tensor  # verification steps (target forward passes)
    drafted: Tensor
    accepted: Tensor  # accepted draft tokens, the EOS of a fully accepted final chain included
    eos_steps: Tensor  # steps whose whole chain, EOS included, was accepted (at most 1)
    accepted_at: Tensor  # [batch, γ]: steps that accepted at least k + 1 tokens


def expected_block_counts(
    beta: Tensor,
    lengths: Tensor,
    gamma: int,
    max_new_tokens: int | None = None,
    eos_stop: Tensor | None = None,
) -> BlockCounts:
    """Expected step counts of speculative decoding along continuations with per-position acceptance β.

    beta: [batch, T] acceptance probability of a draft token at each response position (any value past a
    row's length); lengths: [batch] response lengths ℓ (a row with ℓ < max_new_tokens ended by EOS);
    max_new_tokens: M, the decoders' length limit (None: no limit, every row ended by EOS); eos_stop:
    [batch, T] r_t, the probability that a rejected proposal at t was the EOS (None: 0).
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1 (draft tokens per block), got {gamma!r}")
    batch, seq = beta.shape
    limit = max_new_tokens if max_new_tokens is not None else seq + gamma + 2
    lengths = lengths.to(device=beta.device, dtype=torch.long)
    beta = torch.nn.functional.pad(beta.double().clamp(0.0, 1.0), (0, gamma + 1), value=1.0)
    stop = (
        torch.zeros_like(beta)
        if eos_stop is None
        else torch.nn.functional.pad(eos_stop.double(), (0, gamma + 1))
    )
    start = beta.new_zeros(batch, seq + gamma + 2)  # P(a step starts after t emitted tokens)
    start[:, 0] = 1.0
    totals = [beta.new_zeros(batch) for _ in range(4)]  # steps, drafted, accepted, eos_steps
    accepted_at = beta.new_zeros(batch, gamma)
    for t in range(seq):
        here = torch.where(lengths > t, start[:, t], 0.0)  # [batch]
        if bool(here.any()):
            d = max(0, min(gamma, limit - t - 1))
            window = (beta[:, t : t + gamma], stop[:, t : t + gamma])
            counts, reject, bonus = _step(window, lengths - t, d, lengths < limit)
            for total, count in zip(totals, counts[:4], strict=True):
                total += here * count
            accepted_at += here[:, None] * counts[4]
            start[:, t + 1 : t + gamma + 1] += here[:, None] * reject
            start[:, t + d + 1] += here * bonus
    steps, drafted, accepted, eos_steps = totals
    return BlockCounts(steps, drafted, accepted, eos_steps, accepted_at)


def _step(
    windows: tuple[Tensor, Tensor], left: Tensor, d: int, by_eos: Tensor
) -> tuple[tuple[Tensor, ...], Tensor, Tensor]:
    """One step's outcomes for every row: windows ([batch, γ] β, [batch, γ] r) of the next γ positions, left
    [batch] the positions still to emit, d the tokens to draft, by_eos [batch] whether the row ends at an
    EOS. -> ((1, drafted, accepted, eos_step, accepted ≥ k+1 [batch, γ]), P(k accepted then a rejection)
    [batch, γ], P(all d accepted and the target's bonus token follows) [batch])."""
    window, stop = windows
    batch, gamma = window.shape
    e = torch.clamp(left, min=0, max=d)  # [batch]: positions of the chain that exist (0 for ended rows)
    k = torch.arange(gamma + 1, device=window.device)
    reach = torch.cat([window.new_ones(batch, 1), window.cumprod(dim=-1)], dim=-1)  # [batch, γ+1]: P(≥ k)
    reach = torch.where(k[None, :] <= e[:, None], reach, 0.0)
    full = reach.gather(1, e[:, None]).squeeze(1)  # P(the whole chain of e accepted)
    reject = torch.where(k[None, :gamma] < e[:, None], reach[:, :gamma] - reach[:, 1:], 0.0)
    at_eos = by_eos & (e == left)  # a whole accepted chain here ends at the EOS: the draft stopped there
    drafted_if_rejected = stop * (k[None, :gamma] + 1) + (1 - stop) * e[:, None]  # [batch, γ]
    drafted = (reject * drafted_if_rejected).sum(dim=-1) + full * e
    eos_step = torch.where(at_eos, full, 0.0)
    counts = (torch.ones_like(full), drafted, reach[:, 1:].sum(dim=-1), eos_step, reach[:, 1:])
    return counts, reject, full - eos_step


def sampled_token_acceptance(p: Tensor, q: Tensor, tokens: Tensor) -> Tensor:
    """a_t = min(1, q(y_t) / p(y_t)): the probability that the output token y_t at a drafted position was an
    accepted draft token, given y_t (speculative sampling emits v as an accepted draft with probability
    min(p, q)(v) and as a correction with (p − min(p, q))(v)). Given the output sequence y the accept events
    are independent with these probabilities, so the counts of `expected_block_counts` along a_t are exact
    for that y, and their mean over y ~ p is the decoders' expectation; along β = E_{y_t ~ p}[a_t] they are
    not (a product of means is not the mean of a product), and overstate acceptance at τ > 0.

    p, q: [..., vocab] warped target and draft probabilities; tokens: [...] the sampled ids -> [...] fp32.
    """
    index = tokens[..., None].to(p.device)
    p_y, q_y = p.float().gather(-1, index).squeeze(-1), q.float().gather(-1, index).squeeze(-1)
    return torch.clamp(q_y / p_y.clamp_min(torch.finfo(torch.float32).tiny), max=1.0)


def draft_stop_after_rejection(p: Tensor, q: Tensor, beta: Tensor, eos_id: int) -> Tensor:
    """r_t = P(the draft's proposal was the EOS | it was rejected) = (q − min(p, q))(EOS) / (1 − β_t): a
    rejected proposal is distributed as q's mass that p does not cover. p, q: [..., vocab]; beta: [...]
    -> [...] fp32 (0 where β = 1, no rejection)."""
    excess = (q[..., eos_id].float() - p[..., eos_id].float()).clamp(min=0.0)
    missing = 1.0 - beta.float()
    return torch.where(missing > 1e-6, (excess / missing.clamp(min=1e-6)).clamp(max=1.0), 0.0)
