"""Speculative decoding of B prompts together, and the batched target-only baseline: what a server does.

Each row drafts up to γ tokens, all rows are verified in one batched target pass, and each row accepts or
rejects on its own and advances by its own count. The batch-1 decoder (`decoder.py`) crops its caches back
to the accepted prefix; a batch cannot, because its rows keep different amounts. So the caches here only
grow, and every cache slot carries a validity bit in the attention mask:
- a rejected proposal's slot is masked out rather than removed;
- a row with less to feed than another in the same forward pass feeds a masked padding slot (left of its
  real tokens, so each row's last slot is always real and holds its next-token logits);
- positions are explicit per row (the count of valid slots before a token), so RoPE sees each row's own
  sequence whatever the masked slots around it.
A row's tokens therefore see exactly the keys of its own accepted sequence, as in the batch-1 decoder, and
each row's verification draws from its own generator: the output of every row is distributed as the
target's at τ (lossless per row). Finished rows leave the batch (their cache rows are dropped).

Invariant between blocks, per row and model: the cache holds every valid token but the `pending` ones (the
target's: the last emitted token; the draft's: also the last proposal after a fully accepted block).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from specray.ops import sample, verify_block, verify_greedy, warp
from specray.specdec.decoder import Decoded, StepClock, finish, pick

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import DynamicCache, PreTrainedModel

PAD_ID = 0  # what a masked slot feeds; its value never matters


def _dynamic_cache() -> DynamicCache:
    from transformers import DynamicCache

    return DynamicCache()


@dataclass
class _Cache:
    """One model's KV cache over the live rows and the validity of each of its slots [rows, slots]."""

    model: PreTrainedModel
    cache: DynamicCache = field(default_factory=_dynamic_cache)
    valid: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.long))

    def feed(self, rows: Sequence[list[int]]) -> Tensor:
        """Feed each row's tokens after its cached slots (left-padded to one width); returns the logits of
        every fed slot [rows, width, vocab] (a row's own tokens are its last `len(tokens)` slots)."""
        device = self.model.device
        width = max(1, *(len(tokens) for tokens in rows))  # a row with nothing to feed feeds a masked slot
        fed = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in rows], device=device)
        ids = torch.tensor([[PAD_ID] * (width - len(t)) + t for t in rows], device=device)
        if self.valid.numel() == 0:
            self.valid = torch.zeros(len(rows), 0, dtype=torch.long, device=device)
        mask = torch.cat([self.valid, fed], dim=1)  # [rows, slots + width]
        before = self.valid.sum(dim=1, keepdim=True)  # valid tokens each row has cached
        positions = (before + fed.cumsum(dim=1) - 1).clamp_min(0)  # masked slots: any position
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.valid = mask
        return out.logits

    def drop_slots(self, row: int, count: int) -> None:
        """Mask out the last `count` valid slots of a row: the proposals its verification rejected."""
        if count > 0:
            slots = self.valid[row].nonzero()[:, 0][-count:]
            self.valid[row, slots] = 0

    def keep_rows(self, rows: Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.valid = self.valid[rows]


@dataclass
class _Row:
    index: int  # the prompt's position in the caller's list
    generator: torch.Generator | None
    out: Decoded = field(default_factory=lambda: Decoded([]))
    target_pending: list[int] = field(default_factory=list)
    draft_pending: list[int] = field(default_factory=list)
    proposals: list[int] = field(default_factory=list)
    q_rows: list[Tensor | None] = field(default_factory=list)
    drafting: bool = True


def _prefill(model: PreTrainedModel, prompts: Sequence[list[int]]) -> _Cache:
    """A cache of every prompt token but the last (which the first step feeds), left-padded per row."""
    cache = _Cache(model)
    if any(len(prompt) > 1 for prompt in prompts):
        cache.feed([prompt[:-1] for prompt in prompts])
    return cache


@torch.inference_mode()
def batched_speculative_decode(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: Sequence[list[int]],
    tau: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    generators: Sequence[torch.Generator | None] | None = None,
    max_steps: int | None = None,
) -> list[Decoded]:
    """Decode every prompt with speculative sampling, B rows at a time; row r samples from `generators[r]`
    (its output is then the target's distribution at τ, whatever the other rows). Counts per row; the
    phase times (`DecodeStats.draft_seconds`, `target_seconds`) are the batch's, in every row's stats.
    `max_steps` stops after that many verification steps (the cost model times steps this way)."""
    if gamma < 1 or not tau >= 0.0 or any(len(p) == 0 for p in prompts):
        raise ValueError(f"need gamma >= 1, tau >= 0 and non-empty prompts (gamma={gamma}, tau={tau})")
    started = time.perf_counter()
    gens = list(generators) if generators is not None else [None] * len(prompts)
    rows = [_Row(i, gens[i], target_pending=[p[-1]], draft_pending=[p[-1]]) for i, p in enumerate(prompts)]
    target_cache, draft_cache = _prefill(target, prompts), _prefill(draft, prompts)
    finished: list[_Row] = []
    clock, phases, steps = StepClock(), _Phases(), 0
    while rows and steps != max_steps:
        steps += 1
        clock.start()
        phases.draft_forwards += _draft_block(draft_cache, rows, tau, gamma, max_new_tokens, eos_token_id)
        phases.draft_seconds += clock.lap()
        logits = target_cache.feed([r.target_pending + r.proposals for r in rows])  # [rows, width, vocab]
        done = [
            _verify_row(r, i, logits, target_cache, draft_cache, tau, eos_token_id, max_new_tokens)
            for i, r in enumerate(rows)
        ]
        phases.target_seconds += clock.lap()
        if steps == max_steps:
            done = [True] * len(rows)
        if any(done):
            live = torch.tensor([i for i, d in enumerate(done) if not d], device=logits.device)
            finished += [r for r, d in zip(rows, done, strict=True) if d]
            rows = [r for r, d in zip(rows, done, strict=True) if not d]
            if rows:
                target_cache.keep_rows(live)
                draft_cache.keep_rows(live)
    return _close(finished, started, phases)


@dataclass
class _Phases:
    """Where a batched decode's time went (the batch's, not a row's share)."""

    draft_seconds: float = 0.0
    draft_forwards: int = 0
    target_seconds: float = 0.0


def _close(finished: list[_Row], started: float, phases: _Phases) -> list[Decoded]:
    """The rows' outputs in the caller's order, each with the batch's wall time and phase times."""
    seconds = time.perf_counter() - started
    for row in finished:
        stats = row.out.stats
        stats.emitted, stats.seconds = len(row.out.tokens), seconds
        stats.draft_seconds, stats.draft_forwards = phases.draft_seconds, phases.draft_forwards
        stats.target_seconds = phases.target_seconds
    return [row.out for row in sorted(finished, key=lambda r: r.index)]


def _draft_block(
    cache: _Cache, rows: list[_Row], tau: float, gamma: int, max_new_tokens: int, eos: int | None
) -> int:
    """Up to γ draft steps for every row (fewer near its length limit or after it proposes EOS); a row that
    has stopped drafting feeds a masked slot while the others go on. Returns the draft's forward passes."""
    for row in rows:
        row.proposals, row.q_rows = [], []
        row.drafting = max_new_tokens - len(row.out.tokens) - 1 > 0
    forwards = 0
    for _ in range(gamma):
        if not any(row.drafting for row in rows):
            break
        forwards += 1
        feeds = [row.draft_pending if row.drafting else [] for row in rows]  # [] feeds a masked slot
        logits = cache.feed(feeds)[:, -1]  # [rows, vocab]
        for i, row in enumerate(rows):
            if not feeds[i]:
                continue
            token, q = pick(logits[i], tau, row.generator)
            row.proposals.append(token)
            row.q_rows.append(q)
            row.draft_pending = [token]
            limit = max_new_tokens - len(row.out.tokens) - 1  # the block's last token is the target's
            row.drafting = token != eos and len(row.proposals) < limit
    return forwards


def _verify_row(
    row: _Row,
    i: int,
    logits: Tensor,
    target: _Cache,
    draft: _Cache,
    tau: float,
    eos: int | None,
    max_new_tokens: int,
) -> bool:
    """Accept a prefix of row i's proposals and pick its next token; mask the rejected proposals' slots in
    both caches and set what each model feeds next. True when the row is finished."""
    block = len(row.proposals)
    row_logits = logits[i, -(block + 1) :]  # [block + 1, vocab]
    if tau == 0.0:
        n, next_token = verify_greedy(row.proposals, row_logits)
    elif block == 0:
        n, next_token = 0, int(sample(warp(row_logits[0], tau), row.generator))
    else:
        p = warp(row_logits, tau)
        tokens = torch.tensor(row.proposals, device=p.device)
        n, next_token = verify_block(tokens, torch.stack(row.q_rows), p, row.generator)  # type: ignore[arg-type]
    stats = row.out.stats
    stats.drafted += block
    stats.tested += min(n + 1, block)
    stats.accepted += n
    stats.target_calls += 1
    stats.count_step(n)
    target.drop_slots(i, block - n)  # the target cached every proposal
    draft.drop_slots(i, max(block - 1 - n, 0))  # the draft cached all but its last proposal
    if n < block or block == 0:
        row.draft_pending = [next_token] if n < block else row.draft_pending + [next_token]
    else:  # every proposal accepted: the draft never ran on its last one
        row.draft_pending = [row.proposals[-1], next_token]
    row.target_pending = [next_token]
    return finish(row.out.tokens, row.proposals[:n] + [next_token], eos, max_new_tokens)


@torch.inference_mode()
def batched_autoregressive_decode(
    target: PreTrainedModel,
    prompts: Sequence[list[int]],
    tau: float,
    max_new_tokens: int | Sequence[int],
    eos_token_id: int | None,
    generators: Sequence[torch.Generator | None] | None = None,
    max_steps: int | None = None,
) -> list[Decoded]:
    """Target-only decoding of B prompts together, with the same caches and stopping rules: the baseline
    a batched speculative decode is timed against (`max_new_tokens` per row: the lengths it decoded)."""
    limits = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    started = time.perf_counter()
    gens = list(generators) if generators is not None else [None] * len(prompts)
    rows = [_Row(i, gens[i], target_pending=[p[-1]]) for i, p in enumerate(prompts)]
    cache, finished = _prefill(target, prompts), []
    clock, phases, steps = StepClock(), _Phases(), 0
    while rows and steps != max_steps:
        steps += 1
        clock.start()
        logits = cache.feed([r.target_pending for r in rows])[:, -1]  # [rows, vocab]
        done = []
        for i, row in enumerate(rows):
            token, _ = pick(logits[i], tau, row.generator)
            row.target_pending = [token]
            row.out.stats.target_calls += 1
            done.append(finish(row.out.tokens, [token], eos_token_id, limits[row.index]))
        phases.target_seconds += clock.lap()
        if steps == max_steps:
            done = [True] * len(rows)
        if any(done):
            finished += [r for r, d in zip(rows, done, strict=True) if d]
            rows = [r for r, d in zip(rows, done, strict=True) if not d]
            if rows:
                cache.keep_rows(torch.tensor([i for i, d in enumerate(done) if not d], device=logits.device))
    return _close(finished, started, phases)
