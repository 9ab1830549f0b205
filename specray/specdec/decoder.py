"""Exact speculative decoding at batch size 1, and the target-only baseline with the same stopping rules.

Everything runs under `torch.inference_mode()` rather than `no_grad()`: it skips autograd's bookkeeping
(version counters, view tracking), which is per-op overhead a small model's step notices, and runs the same
kernels, so the numbers are the same. `c` and the step times are measured the same way.

Both models keep a KV cache for the whole decode. After each block the caches are cropped back to the
accepted prefix — never recomputed from scratch — so a block costs γ draft steps and one target pass over
γ + 1 tokens. Invariant between blocks: each cache holds every token except those still `pending` for it
(for the target always just the last emitted token; for the draft also x_γ after a fully accepted block,
since the draft never ran on its own last proposal).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor

from specray.ops import (
    acceptance_rate_from_counts,
    block_efficiency_from_counts,
    draft_acceptance_from_counts,
    sample,
    verify_block,
    verify_greedy,
    warp,
)
from specray.ops.lenience import verify_block_lenient

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import DynamicCache, PreTrainedModel


@dataclass
class DecodeStats:
    """Counts of one or many decodes; the acceptance and speed metrics derive from them."""

    drafted: int = 0  # draft tokens proposed
    tested: int = 0  # draft tokens the target checked (those after a rejection are never tested)
    accepted: int = 0
    target_calls: int = 0  # target forward passes after the prompt
    emitted: int = 0  # new tokens in the output
    seconds: float = 0.0
    # where the time of the steps went (prefills excluded): the draft's forward passes and picks, and the
    # target's passes with their verification (or, decoding alone, its picks); the cost model's terms
    draft_seconds: float = 0.0
    draft_forwards: int = 0
    target_seconds: float = 0.0
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
        return (
            self.drafted,
            self.tested,
            self.accepted,
            self.target_calls,
            self.emitted,
            self.seconds,
            self.draft_seconds,
            self.draft_forwards,
            self.target_seconds,
        )

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
    # new tokens each verification step (or, decoding alone, each step) added to `tokens`: the accepted
    # proposals and the target's own token, cut where the output stops (Spec-Bench's accept_lengths)
    step_tokens: list[int] = field(default_factory=list)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop cached positions beyond `length` (crop(-k) removes k tokens in transformers 4.x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def forward_cached(
    model: PreTrainedModel, tokens: list[int], cache: DynamicCache, device: torch.device
) -> Tensor:
    """Feed `tokens` after the cached prefix; returns their next-token logits [len(tokens), vocab].

    `device` is passed in: `model.device` walks the parameters on every call, an overhead per step."""
    input_ids = torch.tensor([tokens], device=device)
    return model(input_ids=input_ids, past_key_values=cache, use_cache=True).logits[0]


def prefill_cache(model: PreTrainedModel, prompt: list[int], device: torch.device) -> DynamicCache:
    """Cache every prompt token but the last, which the first step feeds."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if len(prompt) > 1:
        forward_cached(model, prompt[:-1], cache, device)
    return cache


def pick(logits: Tensor, tau: float, generator: torch.Generator | None) -> tuple[int, Tensor | None]:
    """One token from next-token logits [vocab], and the probabilities it was drawn from.

    At τ = 0 the argmax, with no probabilities: sampling the one-hot warp would return the same token
    whatever the generator, so greedy decodes skip the softmax, the one-hot and the random draw."""
    if tau == 0.0:
        return int(logits.argmax()), None
    probs = warp(logits, tau)  # [vocab]
    return int(sample(probs, generator)), probs


def _verify(
    proposals: list[int],
    q_rows: list[Tensor | None],
    target_logits: Tensor,
    tau: float,
    generator: torch.Generator | None,
    lenience: str | None = None,
    epsilon: float = 1.0,
) -> tuple[int, int]:
    """(accepted proposals, next token) from the target's logits for the block [len(proposals) + 1, vocab].

    ε < 1: DistillSpec's lossy rule (`ops.lenience`); ε = 1 takes the lossless code path itself, so a
    lossless decode is the decode it always was. At τ = 0 lenience changes nothing (see ops.lenience)."""
    if tau == 0.0:
        return verify_greedy(proposals, target_logits)
    p = warp(target_logits, tau)  # [block + 1, vocab]
    if not proposals:
        return 0, int(sample(p[0], generator))
    draft_tokens = torch.tensor(proposals, device=p.device)
    q = torch.stack(cast(list[Tensor], q_rows))  # τ > 0: `pick` kept every proposal's probabilities
    if epsilon == 1.0:
        return verify_block(draft_tokens, q, p, generator)
    assert lenience is not None, "a lossy decode (ε < 1) needs a lenience function"
    return verify_block_lenient(draft_tokens, q, p, lenience, epsilon, generator)


def finish(tokens: list[int], new: list[int], eos_token_id: int | None, max_new_tokens: int) -> bool:
    """Append `new` to `tokens`, cutting at EOS or the length limit; True when decoding is over."""
    for token in new:
        tokens.append(token)
        if token == eos_token_id or len(tokens) >= max_new_tokens:
            return True
    return False


class StepClock:
    """Laps of a decode's phases. Reading a token id already waits for the device, so on CUDA a lap
    ends after its kernels without a synchronize of its own."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def start(self) -> None:
        self.last = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        return seconds


def _check_settings(gamma: int, tau: float) -> None:
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    if not tau >= 0.0:  # NaN too
        raise ValueError(f"tau must be >= 0, got {tau!r}")


@torch.inference_mode()
def speculative_decode(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: list[int],
    tau: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    generator: torch.Generator | None = None,
    lenience: str | None = None,
    epsilon: float = 1.0,
    max_steps: int | None = None,
) -> Decoded:
    """Decode one prompt with speculative sampling; the output is distributed as the target's at τ when
    ε = 1 (lossless), and drifts towards the draft's as ε falls (`lenience`: lin, sq or exp; ε < 1).
    `max_steps` stops after that many verification steps (the cost model times steps this way).

    Both models and `generator` must be on one device."""
    _check_settings(gamma, tau)
    if not 0.0 < epsilon <= 1.0 or (epsilon < 1.0 and lenience is None):
        raise ValueError(f"epsilon must be in (0, 1], a lenience function below 1: {lenience}, {epsilon}")
    started = time.perf_counter()
    device = target.device
    target_cache, draft_cache = prefill_cache(target, prompt, device), prefill_cache(draft, prompt, device)
    out, stats = Decoded([]), DecodeStats()
    target_pending, draft_pending = [prompt[-1]], [prompt[-1]]
    done = False
    clock = StepClock()
    while not done and stats.target_calls != max_steps:
        # never draft past the limit: the block's last token always comes from the target
        block = min(gamma, max_new_tokens - len(out.tokens) - 1)
        proposals, q_rows = [], []
        clock.start()
        for _ in range(block):
            token, q = pick(forward_cached(draft, draft_pending, draft_cache, device)[-1], tau, generator)
            draft_pending = [token]
            proposals.append(token)
            q_rows.append(q)
            if token == eos_token_id:  # nothing after EOS is worth proposing or counting
                break
        stats.draft_seconds += clock.lap()
        block = len(proposals)
        stats.draft_forwards += block
        target_logits = forward_cached(
            target, target_pending + proposals, target_cache, device
        )  # [block + 1, vocab]
        n, next_token = _verify(proposals, q_rows, target_logits, tau, generator, lenience, epsilon)
        stats.target_seconds += clock.lap()
        stats.drafted += block
        stats.tested += min(n + 1, block)
        stats.accepted += n
        stats.target_calls += 1
        stats.count_step(n)
        # keep cache entries for the prompt, the accepted proposals and the token before them
        kept = len(prompt) + len(out.tokens) + n
        crop_cache(target_cache, kept)
        crop_cache(draft_cache, kept)
        if n < block:
            draft_pending = [next_token]
        else:  # the draft never ran on its last proposal (or, with no proposals, on what was pending)
            draft_pending = (proposals[-1:] if block else draft_pending) + [next_token]
        target_pending = [next_token]
        before = len(out.tokens)
        done = finish(out.tokens, proposals[:n] + [next_token], eos_token_id, max_new_tokens)
        out.step_tokens.append(len(out.tokens) - before)
    stats.emitted = len(out.tokens)
    stats.seconds = time.perf_counter() - started
    out.stats = stats
    return out


@torch.inference_mode()
def autoregressive_decode(
    target: PreTrainedModel,
    prompt: list[int],
    tau: float,
    max_new_tokens: int,
    eos_token_id: int | None,
    generator: torch.Generator | None = None,
    max_steps: int | None = None,
) -> Decoded:
    """Target-only decoding with the same KV cache handling and stopping rules: the speedup baseline."""
    _check_settings(1, tau)
    started = time.perf_counter()
    device = target.device
    cache = prefill_cache(target, prompt, device)
    out, pending = Decoded([]), [prompt[-1]]
    done = False
    clock = StepClock()
    while not done and out.stats.target_calls != max_steps:
        clock.start()
        token, _ = pick(forward_cached(target, pending, cache, device)[-1], tau, generator)
        out.stats.target_seconds += clock.lap()
        pending = [token]
        out.stats.target_calls += 1
        done = finish(out.tokens, [token], eos_token_id, max_new_tokens)
        out.step_tokens.append(1)
    out.stats.emitted = len(out.tokens)
    out.stats.seconds = time.perf_counter() - started
    return out


@dataclass(frozen=True)
class StepTimes:
    """Mean seconds of the forward passes a speculative decode is made of (plain HF forwards, KV cache)."""

    draft_step: float  # the draft on 1 token after a cached context
    target_step: float  # the target on 1 token after a cached context
    target_verify: float  # the target on γ + 1 tokens after a cached context
    draft_prefill: float  # the draft on a prompt, empty cache
    target_prefill: float

    @property
    def cost_ratio(self) -> float:
        """The cost ratio c: one draft step / one target step."""
        return self.draft_step / self.target_step

    def limit_seconds_per_token(self, stats: DecodeStats, decodes: int) -> float:
        """The time per token the forward passes alone take: a decoder with no overhead of its own.

            limit = (drafted · t_draft + target_calls · t_target_verify
                     + decodes · (t_draft_prefill + t_target_prefill)) / emitted

        with the counts of the `decodes` being judged (one draft forward per drafted token, one target pass
        per verification step). When every block drafts γ tokens and the prefills are left out this is the
        cost model's (γ · t_draft + t_target_verify) / τ_b, τ_b = emitted / target_calls.
        """
        forward = stats.drafted * self.draft_step + stats.target_calls * self.target_verify
        prefills = decodes * (self.draft_prefill + self.target_prefill)
        return (forward + prefills) / stats.emitted


@torch.inference_mode()
def measure_step_times(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    context: list[int],
    prompt_length: int,
    gamma: int,
    steps: int = 20,
    warmup: int = 2,
    clocks: tuple[Callable[[], float], ...] = (time.perf_counter,),
) -> tuple[StepTimes, ...]:
    """Time the forward passes of a decode `steps` times, in the order a decode runs them; one StepTimes
    per clock in `clocks` (e.g. `time.perf_counter` and `time.process_time`, read around the same passes).

    Each round runs γ draft steps in a row, then the target's verification pass, then what a block does not
    contain: the two prefills and (for c) one target step. The order matters on a CPU: the draft step right
    after a target pass finds the draft's weights evicted from the caches and takes up to twice as long as
    the next ones. The steps run after the first `len(context) - γ - 1` tokens of `context` are cached (a
    cache as long as mid-decode); the prefills run on `context[:prompt_length]`.

    Means over the rounds after `warmup`, not medians: the decodes a limit is compared with are timed as
    totals, which include the time other processes take from them, and a mean includes it alike.
    """
    cached, device = len(context) - gamma - 1, target.device
    caches = {model: prefill_cache(model, context[: cached + 1], device) for model in (draft, target)}
    times: dict[str, list[list[float]]] = {}  # name -> per round, one reading per clock

    def timed(name: str, run: Callable[[], object]) -> None:
        started = [clock() for clock in clocks]
        run()
        times.setdefault(name, []).append([clock() - s for clock, s in zip(clocks, started, strict=True)])

    def step(model: PreTrainedModel, tokens: list[int]) -> Callable[[], object]:
        crop_cache(caches[model], cached)
        return lambda: forward_cached(model, tokens, caches[model], device)

    for _ in range(warmup + steps):
        for position in range(gamma):
            timed(f"draft_{position}", step(draft, context[cached : cached + 1]))
        timed("target_verify", step(target, context[cached:]))
        timed("draft_prefill", lambda: prefill_cache(draft, context[:prompt_length], device))
        timed("target_prefill", lambda: prefill_cache(target, context[:prompt_length], device))
        timed("target_step", step(target, context[cached : cached + 1]))
    return tuple(_mean_step_times(times, gamma, warmup, i) for i in range(len(clocks)))


def _mean_step_times(times: dict[str, list[list[float]]], gamma: int, warmup: int, clock: int) -> StepTimes:
    mean = {
        name: statistics.fmean(reading[clock] for reading in rounds[warmup:])
        for name, rounds in times.items()
    }
    draft_step = statistics.fmean(mean.pop(f"draft_{position}") for position in range(gamma))
    return StepTimes(draft_step=draft_step, **mean)
