"""Timing for benchmarks/specdec.py and gpu.py: our decoder and HF assisted generation side by side.

Nothing is timed before `specray.specdec.hf_compare.verify_comparison` has checked that both sides do the
same work (see that module for the transformers traps it guards against). Then each round times every
prompt through both decoders back to back, alternating which goes first, and measures the forward-pass
times the cost-model limit is computed from (`StepTimes.limit_seconds_per_token`). Imports no ray, mlflow or
pydantic, so it runs on a bare GPU machine with torch and transformers.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from transformers import PreTrainedModel

from specray.specdec.decoder import DecodeStats, StepTimes, measure_step_times
from specray.specdec.hf_compare import (
    AssistedTrace,
    Comparison,
    MisconfiguredComparison,
    assisted_kwargs,
    configure_assistant,
    expected_processors,
    run_assisted,
    run_ours,
    verify_comparison,
)


@dataclass(frozen=True)
class Timed:
    """One side's decodes of every prompt of a comparison in one round."""

    seconds: float
    stats: DecodeStats  # pooled over the prompts

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.seconds / self.stats.emitted


@dataclass(frozen=True)
class Round:
    ours: Timed
    hf: Timed
    steps: StepTimes
    limit_ms_per_token: float  # for our decodes' counts
    hf_limit_ms_per_token: float  # the same forward passes, HF's counts


@dataclass(frozen=True)
class Result:
    comparison: Comparison
    rounds: tuple[Round, ...]
    same_tokens: int  # prompts where both sides emitted exactly the same tokens
    load: tuple[float, float]  # 1-minute load average before and after


def time_side_by_side(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    comparison: Comparison,
    checked: list[AssistedTrace],
    hf_first: bool,
) -> tuple[Timed, Timed]:
    """Each prompt through both decoders, one right after the other. HF runs uninstrumented; its counts are
    those of the `checked` traces, whose tokens it must repeat (same seeds)."""
    kwargs = assisted_kwargs(comparison)
    seconds = {"ours": 0.0, "hf": 0.0}
    ours_stats, hf_tokens = DecodeStats(), []
    for prompt, seed in zip(comparison.prompts, comparison.seeds, strict=True):
        for side in ("hf", "ours") if hf_first else ("ours", "hf"):
            started = time.perf_counter()
            if side == "ours":
                ours_stats = ours_stats + run_ours(target, draft, list(prompt), seed, comparison).stats
            else:
                hf_tokens.append(tuple(run_assisted(target, draft, list(prompt), seed, kwargs)[0]))
            seconds[side] += time.perf_counter() - started
    if hf_tokens != [trace.tokens for trace in checked]:
        raise MisconfiguredComparison("the timed HF decodes differ from the checked ones (same seeds)")
    hf_stats = sum((trace.stats for trace in checked), DecodeStats())
    return Timed(seconds["ours"], ours_stats), Timed(seconds["hf"], hf_stats)


def compare(target: PreTrainedModel, draft: PreTrainedModel, comparison: Comparison, rounds: int) -> Result:
    """Check the comparison, then time `rounds` rounds of it with the step times measured in each."""
    load_before = os.getloadavg()[0]
    configure_assistant(draft, comparison)
    traces, ours = verify_comparison(target, draft, comparison)  # raises before anything is timed
    same = sum(trace.tokens == tuple(decoded.tokens) for trace, decoded in zip(traces, ours, strict=True))
    # a context as long as mid-decode: a prompt followed by half of one of its decodes
    prompt = list(comparison.prompts[0])
    context = prompt + list(ours[0].tokens[: max(comparison.gamma + 1, comparison.max_new_tokens // 2)])
    done = []
    for r in range(rounds):
        ours_timed, hf_timed = time_side_by_side(target, draft, comparison, traces, hf_first=r % 2 == 1)
        steps = measure_step_times(target, draft, context, len(prompt), comparison.gamma)
        decodes = len(comparison.prompts)
        done.append(
            Round(
                ours_timed,
                hf_timed,
                steps,
                1000 * steps.limit_seconds_per_token(ours_timed.stats, decodes),
                1000 * steps.limit_seconds_per_token(hf_timed.stats, decodes),
            )
        )
    return Result(comparison, tuple(done), same, (load_before, os.getloadavg()[0]))


def _acceptance(stats: DecodeStats) -> str:
    return (
        f"α {stats.acceptance_rate:.3f} (accepted/tested {stats.accepted}/{stats.tested}), "
        f"accepted/drafted {stats.draft_acceptance:.3f} ({stats.accepted}/{stats.drafted}), "
        f"τ_b {stats.block_efficiency:.2f}"
    )


def report(result: Result) -> None:
    """Per-τ details: the checks that passed, every round, acceptance both ways, the cost model."""
    c, first = result.comparison, result.rounds[0]
    processors = expected_processors(c.tau) or "none"
    print(
        f"  τ={c.tau}: checked before timing: every verification step drafted γ={c.gamma} (fewer only at the"
    )
    print(
        f"    length limit or a drafted EOS); logits processors on each side: {processors}; lengths as asked;"
    )
    print(f"    same tokens as HF for the same seed: {result.same_tokens}/{len(c.prompts)} prompts")
    for i, r in enumerate(result.rounds, 1):
        s = r.steps
        print(
            f"    round {i}: ours {r.ours.ms_per_token:.3f} ms/token, HF {r.hf.ms_per_token:.3f}, limit "
            f"{r.limit_ms_per_token:.3f} (t_draft {1000 * s.draft_step:.3f} ms, t_target_verify "
            f"{1000 * s.target_verify:.3f}, t_target {1000 * s.target_step:.3f}, prefills "
            f"{1000 * s.draft_prefill:.2f}+{1000 * s.target_prefill:.2f}, c {s.cost_ratio:.3f})"
        )
    print(f"    ours: {_acceptance(first.ours.stats)}")
    print(f"    HF:   {_acceptance(first.hf.stats)}")
    tau_b = first.ours.stats.block_efficiency
    model = 1000 * (c.gamma * first.steps.draft_step + first.steps.target_verify) / tau_b
    print(
        f"    cost model (γ·t_draft + t_target_verify)/τ_b = {model:.3f} ms/token (round 1, prefills left"
        f" out); load average {result.load[0]:.2f} before, {result.load[1]:.2f} after"
    )


def summary(results: list[Result]) -> None:
    """The last lines: medians over rounds of the ratios, per τ."""
    print("summary (median over rounds of each round's ratio):")
    for result in results:
        rounds = result.rounds
        ours_hf = statistics.median(r.ours.ms_per_token / r.hf.ms_per_token for r in rounds)
        ours_limit = statistics.median(r.ours.ms_per_token / r.limit_ms_per_token for r in rounds)
        hf_limit = statistics.median(r.hf.ms_per_token / r.hf_limit_ms_per_token for r in rounds)
        print(
            f"τ={result.comparison.tau}: ours / HF = {ours_hf:.3f}   ours / limit = {ours_limit:.3f}"
            f"   (HF / its limit = {hf_limit:.3f})"
        )
