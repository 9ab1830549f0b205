"""Exact speculative decoding at batch size 1, and the target-only baseline with the same stopping rules.

Both models keep a KV cache for the whole decode. After each block the caches are cropped back to the
accepted prefix — never recomputed from scratch — so a block costs γ draft steps and one target pass over
γ + 1 tokens. Invariant between blocks: each cache holds every token except those still `pending` for it
(for the target always just the last emitted token; for the draft also x_γ after a fully accepted block,
since the draft never ran on its own last proposal).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from specray.ops import (
    acceptance_rate_from_counts,
    block_efficiency_from_counts,
    draft_acceptance_from_counts,
    sample,
    verify_block,
    warp,
)


@dataclass
class DecodeStats:
    """Counts of one or many decodes; the metrics of DESIGN.md derive from them."""

    drafted: int = 0  # draft tokens proposed
    tested: int = 0  # draft tokens the target checked (those after a rejection are never tested)
    accepted: int = 0
    target_calls: int = 0  # target forward passes after the prompt
    emitted: int = 0  # new tokens in the output
    seconds: float = 0.0
    # per draft position k: steps that accepted at least k + 1 tokens (vLLM's per-position counts)
    accepted_per_position: list[int] = field(default_factory=list)

    def __add__(self, other: DecodeStats) -> DecodeStats:
        total = DecodeStats(*(a + b for a, b in zip(self.astuple(), other.astuple(), strict=True)))
        mine, theirs = self.accepted_per_position, other.accepted_per_position
        width = max(len(mine), len(theirs))
        total.accepted_per_position = [
            (mine[k] if k < len(mine) else 0) + (theirs[k] if k < len(theirs) else 0) for k in range(width)
        ]
        return total

    def count_step(self, accepted: int) -> None:
        """Add a verification step that accepted `accepted` tokens to the per-position counts."""
        counts = self.accepted_per_position
        counts += [0] * max(0, accepted - len(counts))
        for k in range(accepted):
            counts[k] += 1

    def astuple(self) -> tuple:
        return (self.drafted, self.tested, self.accepted, self.target_calls, self.emitted, self.seconds)

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate_from_counts(self.accepted, self.tested)

    @property
    def draft_acceptance(self) -> float:
        return draft_acceptance_from_counts(self.accepted, self.drafted)

    @property
    def block_efficiency(self) -> float:
        return block_efficiency_from_counts(self.emitted, self.target_calls)


@dataclass
class Decoded:
    tokens: list[int]
    stats: DecodeStats = field(default_factory=DecodeStats)


def _crop(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (crop(-k) removes k tokens in transformers 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def _step(model: PreTrainedModel, tokens: list[int], cache: DynamicCache) -> Tensor:
    """Feed `tokens` after the cached prefix; returns their next-token logits [len(tokens), vocab]."""
    input_ids = torch.tensor([tokens], device=model.device)
    return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits[0]


def _prefill(model: PreTrainedModel, prompt: list[int]) -> DynamicCache:
    """Cache every prompt token but the last, which the first step feeds."""
    cache = DynamicCache()
    if len(prompt) > 1:
        _step(model, prompt[:-1], cache)
    return cache


def _finish(tokens: list[int], new: list[int], eos_token_id: int | None, max_new_tokens: int) -> bool:
    """Append `new` to `tokens`, cutting at EOS or the length limit; True when decoding is over."""
    for token in new:
        tokens.append(token)
        if token == eos_token_id or len(tokens) >= max_new_tokens:
            return True
    return False


@torch.no_grad()
def speculative_decode(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: list[int],
    tau: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    generator: torch.Generator | None = None,
) -> Decoded:
    """Decode one prompt with speculative sampling; the output is distributed as the target's at τ."""
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    started = time.perf_counter()
    target_cache, draft_cache = _prefill(target, prompt), _prefill(draft, prompt)
    out, stats = Decoded([]), DecodeStats()
    target_pending, draft_pending = [prompt[-1]], [prompt[-1]]
    done = False
    while not done:
        # never draft past the limit: the block's last token always comes from the target
        block = min(gamma, max_new_tokens - len(out.tokens) - 1)
        proposals, q_rows = [], []
        for _ in range(block):
            q = warp(_step(draft, draft_pending, draft_cache)[-1], tau)  # [vocab]
            draft_pending = [int(sample(q, generator))]
            proposals.append(draft_pending[0])
            q_rows.append(q)
            if draft_pending[0] == eos_token_id:  # nothing after EOS is worth proposing or counting
                break
        block = len(proposals)
        p = warp(_step(target, target_pending + proposals, target_cache), tau)  # [block + 1, vocab]
        if block:
            n, next_token = verify_block(torch.tensor(proposals), torch.stack(q_rows), p, generator)
        else:
            n, next_token = 0, int(sample(p[0], generator))
        stats.drafted += block
        stats.tested += min(n + 1, block)
        stats.accepted += n
        stats.target_calls += 1
        stats.count_step(n)
        # keep cache entries for the prompt, the accepted proposals and the token before them
        kept = len(prompt) + len(out.tokens) + n
        _crop(target_cache, kept)
        _crop(draft_cache, kept)
        if n < block:
            draft_pending = [next_token]
        else:  # the draft never ran on its last proposal (or, with no proposals, on what was pending)
            draft_pending = (proposals[-1:] if block else draft_pending) + [next_token]
        target_pending = [next_token]
        done = _finish(out.tokens, proposals[:n] + [next_token], eos_token_id, max_new_tokens)
    stats.emitted = len(out.tokens)
    stats.seconds = time.perf_counter() - started
    out.stats = stats
    return out


@torch.no_grad()
def autoregressive_decode(
    target: PreTrainedModel,
    prompt: list[int],
    tau: float,
    max_new_tokens: int,
    eos_token_id: int | None,
    generator: torch.Generator | None = None,
) -> Decoded:
    """Target-only decoding with the same KV cache handling and stopping rules: the speedup baseline."""
    started = time.perf_counter()
    cache = _prefill(target, prompt)
    out, pending = Decoded([]), [prompt[-1]]
    done = False
    while not done:
        token = int(sample(warp(_step(target, pending, cache)[-1], tau), generator))
        pending = [token]
        out.stats.target_calls += 1
        done = _finish(out.tokens, [token], eos_token_id, max_new_tokens)
    out.stats.emitted = len(out.tokens)
    out.stats.seconds = time.perf_counter() - started
    return out


@torch.no_grad()
def measure_cost_ratio(
    target: PreTrainedModel, draft: PreTrainedModel, prompt: list[int], steps: int = 30
) -> float:
    """c = latency of one draft step / one target step (one token after a cached prompt).

    Steps of the two models are interleaved and each side's median is used, so a burst of load on the
    machine hits both sides alike and a single slow step does not skew the ratio.
    """
    caches = {model: _prefill(model, prompt) for model in (draft, target)}
    lengths = {model: cache.get_seq_length() for model, cache in caches.items()}
    times: dict[PreTrainedModel, list[float]] = {draft: [], target: []}
    for i in range(steps + 2):
        for model, cache in caches.items():
            _crop(cache, lengths[model])
            started = time.perf_counter()
            _step(model, [prompt[-1]], cache)
            if i >= 2:  # the first steps are warm-up
                times[model].append(time.perf_counter() - started)
    return statistics.median(times[draft]) / statistics.median(times[target])
