"""What a decoding step costs, per batch size: T_t(B, k) for the target and T_d(B) for the draft.

Every distilled draft has the student's architecture, so the costs are a property of (target, draft
architecture, dtype, device, threads) and are measured once per sweep, on the un-distilled draft, where the
cells run. They are timed as the decoders spend them: each round decodes `steps` steps of B rows with the
decoder the cells use (batch 1: `decoder.py`; B > 1: `batched.py`) and reads the decoders' own phase clocks
(`DecodeStats.draft_seconds`, `target_seconds`), so a step's time includes its sampling or verification,
not only the forward pass. In a round every (B, γ) speculative decode is followed by a target-only decode of
the same rows, so a burst of machine load hits both sides alike; rounds go on until every time's 95%
interval is within `rel_precision` (or a time budget runs out; the intervals say how far it got).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from scipy.special import stdtrit as student_t_quantile  # scipy.stats.t.ppf, without importing scipy.stats

from specray.specdec.batched import batched_autoregressive_decode, batched_speculative_decode
from specray.specdec.decoder import DecodeStats, autoregressive_decode, speculative_decode
from specray.specdec.records import StepCosts, Timing

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel

STEPS = 16  # verification steps per timed decode: long enough that the clocks' own cost is nothing
MIN_ROUNDS = 5


def mean_interval(samples: Sequence[float]) -> Timing:
    """The mean of per-round times and the half-width of its 95% t-interval (rounds are independent).

    Means, not medians: a decode's wall time includes what other processes take from it, and so does a
    mean of its steps."""
    mean = statistics.fmean(samples)
    if len(samples) < 2:
        return Timing(mean, math.inf)
    quantile = float(student_t_quantile(len(samples) - 1, 0.975))
    half = quantile * statistics.stdev(samples) / math.sqrt(len(samples))
    return Timing(mean, half)


def _decode_pair(
    target: PreTrainedModel, draft: PreTrainedModel, prompts: list[list[int]], gamma: int, steps: int
) -> tuple[DecodeStats, DecodeStats]:
    """`steps` speculative steps and `steps` target-only steps on the same rows (τ = 1, no EOS)."""
    limit = steps * (gamma + 1) + 1  # never reached: every decode runs exactly `steps` steps
    device = target.device
    generators = [torch.Generator(device=device).manual_seed(i) for i in range(len(prompts))]
    if len(prompts) == 1:
        spec = speculative_decode(
            target, draft, prompts[0], 1.0, gamma, limit, None, generators[0], max_steps=steps
        )
        alone = autoregressive_decode(target, prompts[0], 1.0, limit, None, generators[0], max_steps=steps)
        return spec.stats, alone.stats
    spec_rows = batched_speculative_decode(target, draft, prompts, 1.0, gamma, limit, None, generators, steps)
    alone_rows = batched_autoregressive_decode(target, prompts, 1.0, limit, None, generators, steps)
    return spec_rows[0].stats, alone_rows[0].stats  # phase times are the batch's, in every row


def measure_step_costs(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: Sequence[list[int]],
    batch_sizes: Sequence[int] = (1,),
    gammas: Sequence[int] = (4,),
    steps: int = STEPS,
    rel_precision: float = 0.02,
    max_rounds: int = 200,
    max_seconds: float = 120.0,
) -> StepCosts:
    """T_t(B, 1), T_t(B, γ + 1) and T_d(B) at every B and γ, each with a 95% interval of ±`rel_precision`
    or as close as the budgets allow. Row r of a batch decodes `prompts[r % len(prompts)]`."""
    rows = {b: [list(prompts[r % len(prompts)]) for r in range(b)] for b in batch_sizes}
    for b in batch_sizes:  # warm-up: allocator growth and kernel selection at every shape
        _decode_pair(target, draft, rows[b], max(gammas), 2)
    target_times: dict[int, dict[int, list[float]]] = {b: {} for b in batch_sizes}
    draft_times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    # a decode's time outside its steps is its prefill (and setup): the target's alone, both models' when
    # speculating, so the draft's is the difference of the pair
    prefill_target: dict[int, list[float]] = {b: [] for b in batch_sizes}
    prefill_draft: dict[int, list[float]] = {b: [] for b in batch_sizes}
    started, rounds = time.monotonic(), 0
    while True:
        rounds += 1
        for b in batch_sizes:
            for gamma in gammas:
                spec, alone = _decode_pair(target, draft, rows[b], gamma, steps)
                draft_times[b].append(spec.draft_seconds / max(spec.draft_forwards, 1))
                target_times[b].setdefault(gamma + 1, []).append(spec.target_seconds / spec.target_calls)
                target_times[b].setdefault(1, []).append(alone.target_seconds / alone.target_calls)
                outside = alone.seconds - alone.target_seconds
                prefill_target[b].append(outside)
                prefill_draft[b].append(spec.seconds - spec.draft_seconds - spec.target_seconds - outside)
        costs = StepCosts(
            {b: {k: mean_interval(v) for k, v in sorted(ks.items())} for b, ks in target_times.items()},
            {b: mean_interval(v) for b, v in draft_times.items()},
            "measured",
            prefill_target={b: mean_interval(v) for b, v in prefill_target.items()},
            prefill_draft={b: mean_interval(v) for b, v in prefill_draft.items()},
            context_length=round(statistics.fmean(len(p) for p in prompts)),
            steps=steps,
            rounds=rounds,
            device=str(target.device.type),
        )
        # the prefills are a few percent of a decode: their precision is not waited for
        timings = [*costs.draft.values(), *(t for ks in costs.target.values() for t in ks.values())]
        precise = rounds >= MIN_ROUNDS and all(t.relative <= rel_precision for t in timings)
        if precise or rounds >= max_rounds or time.monotonic() - started > max_seconds:
            return costs
