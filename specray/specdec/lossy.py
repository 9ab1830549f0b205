"""The analytic lossy acceptance, along the lossy decoder's own output.

Lossless speculative decoding's output follows the target, so the analytic estimator scores one set of
target samples against every draft (`analytic.py`). A lossy decode (DistillSpec Algorithm A.1, ε < 1) does
not: its output drifts towards the draft, so the prefixes the decoder verifies at position t > 0 are not
target samples, and β_ε scored along target continuations is exact only at the first position (on the
tiny zoo it overstated the acceptance by about two points over 16 tokens, outside the empirical 95%
interval).

So a lossy point samples its own continuations: the decoder's output process, token by token, with both
models' KV caches in lockstep. At each position of a block, x ~ q, accepted with probability
min(1, f(p(x), ε) / q(x)); on rejection the token comes from norm(max(0, p − q)); after γ accepted tokens
the bonus token comes from p. The draft's γ proposals are drawn one at a time, each from q given the
accepted prefix, which is how the decoder draws them too, and proposals after a rejection are discarded
by the decoder, so this has exactly the decoder's output distribution (per γ) without its rollbacks. At
every emitted position the exact conditional acceptance β_ε = Σ_v min(q(v), f(p(v), ε)) is recorded
(Rao-Blackwellised: no accept coin enters β, only the path), and EOS stop probabilities for the
server-side counts, as `analytic.py` records them along target continuations.

Cost: one two-model sampling pass per (draft, lenience point, γ), where the lossless β shares one target
pass across drafts; memory is O(batch) models' caches plus [n, T] floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specray.ops import draft_stop_after_rejection, lenient_target, lenient_token_acceptance, sample, warp
from specray.sampling import decode_lockstep
from specray.seeds import prompt_seed
from specray.specdec.analytic import Betas

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel


@dataclass
class _LossyRow:
    """One sequence of the batch: the decoder's state (tokens accepted in the current block)."""

    generator: torch.Generator
    limit: int
    tokens: list[int] = field(default_factory=list)
    beta: list[float] = field(default_factory=list)
    stop: list[float] = field(default_factory=list)
    in_block: int = 0
    done: bool = False


def _emit(row: _LossyRow, p: torch.Tensor, q: torch.Tensor, lenience: str, epsilon: float, gamma: int) -> int:
    """The decoder's next output token given p, q [vocab] at this prefix (Algorithm A.1, one position)."""
    if row.in_block == gamma:  # the bonus token after a fully accepted block
        row.in_block = 0
        return int(sample(p, row.generator))
    x = int(sample(q, row.generator))
    u = torch.rand((), generator=row.generator, dtype=p.dtype, device=p.device)
    if u * q[x] < lenient_target(p[x], lenience, epsilon):
        row.in_block += 1
        return x
    row.in_block = 0
    residual = (p - q).clamp(min=0.0)
    return int(sample(residual if residual.sum() > 0 else p, row.generator))


@torch.no_grad()
def lossy_betas(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    lenience: str,
    epsilon: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    seed: int,
    pad_token_id: int = 0,
    batch_size: int = 16,
) -> Betas:
    """β_ε [n, T] along lossy-decoder samples of every prompt (in order), and P(a rejected proposal was
    EOS) where there is an EOS id. The i-th prompt draws from its own generator seeded by (seed, i), so
    the result does not depend on the batch size."""
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"lossy continuations need ε in (0, 1), got {epsilon!r}; ε = 1 is lossless")
    if gamma < 1:
        raise ValueError(f"gamma must be ≥ 1, got {gamma}")
    device = target.device
    rows: list[_LossyRow] = [None] * len(prompts)  # type: ignore[list-item]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = [
            _LossyRow(torch.Generator(device=device).manual_seed(prompt_seed(seed, i)), max_new_tokens)
            for i in chunk
        ]
        _sample_batch(
            target,
            draft,
            [prompts[i] for i in chunk],
            batch,
            tau,
            lenience,
            epsilon,
            gamma,
            eos_token_id,
            pad_token_id,
        )
        for i, row in zip(chunk, batch, strict=True):
            rows[i] = row
    width = max((len(r.tokens) for r in rows), default=0)
    beta, stop = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row.tokens)
        beta[i, :n], stop[i, :n], mask[i, :n] = torch.tensor(row.beta), torch.tensor(row.stop), True
    return Betas(beta, mask, None, stop if eos_token_id is not None else None)


def _sample_batch(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    rows: list[_LossyRow],
    tau: float,
    lenience: str,
    epsilon: float,
    gamma: int,
    eos_token_id: int | None,
    pad_token_id: int,
) -> None:
    """Decode one batch in place: both models step on the same emitted token (`decode_lockstep`)."""
    eos = {eos_token_id} if eos_token_id is not None else set()

    def choose(logits: list[torch.Tensor], running: list[int]) -> list[int]:
        p, q = warp(logits[0], tau), warp(logits[1], tau)  # [running, vocab]
        accept = lenient_token_acceptance(p, q, lenience, epsilon)  # [running]
        stop = (
            draft_stop_after_rejection(lenient_target(p, lenience, epsilon), q, accept, eos_token_id)
            if eos_token_id is not None
            else torch.zeros_like(accept)
        )
        next_ids = []
        for j, index in enumerate(running):
            row = rows[index]
            token = _emit(row, p[j], q[j], lenience, epsilon, gamma)
            row.tokens.append(token)
            row.beta.append(float(accept[j]))
            row.stop.append(float(stop[j]))
            row.done = token in eos or len(row.tokens) >= row.limit
            next_ids.append(token)
        return next_ids

    decode_lockstep([target, draft], prompts, pad_token_id, choose, lambda index: rows[index].done)
