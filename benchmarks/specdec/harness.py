"""Timing for benchmarks/specdec/decoder.py and gpu.py: our decoder and HF assisted generation side by side.

Nothing is timed before `specray.specdec.hf_compare.verify_comparison` has checked that both sides do the
same work (see that module for the transformers traps it guards against). Then each round times every
prompt through both decoders back to back, alternating which goes first, and after each prompt two rounds
of the forward passes the cost-model limit is computed from (`StepTimes.limit_seconds_per_token`), so that
decodes and step times see the same load. Every time is read on two clocks: wall time, and this process's
CPU time, which other processes on a shared machine disturb much less (with one torch thread). Imports no
ray, mlflow or pydantic, so it runs on a bare GPU machine with torch and transformers.
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import statistics
import sys
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

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Timing:
    """One round under one clock (wall time, or this process's CPU time); milliseconds per emitted token."""

    ours_ms: float
    hf_ms: float
    limit_ms: float  # the forward passes alone, with our decodes' counts
    hf_limit_ms: float  # the same, with HF's counts
    steps: StepTimes


@dataclass(frozen=True)
class Round:
    ours: DecodeStats  # pooled over the prompts
    hf: DecodeStats
    wall: Timing
    cpu: Timing


@dataclass(frozen=True)
class Result:
    comparison: Comparison
    rounds: tuple[Round, ...]
    same_tokens: int  # prompts where both sides emitted exactly the same tokens
    load: tuple[float, float]  # 1-minute load average before and after


def _mean(step_times: list[StepTimes]) -> StepTimes:
    fields = vars(step_times[0]).keys()
    return StepTimes(**{f: statistics.fmean(getattr(t, f) for t in step_times) for f in fields})


def time_round(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    comparison: Comparison,
    checked: list[AssistedTrace],
    hf_first: bool,
) -> Round:
    """Each prompt through both decoders, one right after the other, then a few of the forward passes the
    limit is made of: so the decodes and the step times see the same load, under both clocks. HF runs
    uninstrumented; its counts are those of the `checked` traces, whose tokens it must repeat (same seeds)."""
    kwargs, gamma = assisted_kwargs(comparison), comparison.gamma
    seconds = {clock: {"ours": 0.0, "hf": 0.0} for clock in CLOCKS}
    steps: dict[str, list[StepTimes]] = {clock: [] for clock in CLOCKS}
    ours_stats, hf_tokens = DecodeStats(), []
    for prompt, seed in zip(comparison.prompts, comparison.seeds, strict=True):
        for side in ("hf", "ours") if hf_first else ("ours", "hf"):
            started = {clock: read() for clock, read in CLOCKS.items()}
            if side == "ours":
                decoded = run_ours(target, draft, list(prompt), seed, comparison)
                ours_stats = ours_stats + decoded.stats
            else:
                hf_tokens.append(tuple(run_assisted(target, draft, list(prompt), seed, kwargs)[0]))
            for clock, read in CLOCKS.items():
                seconds[clock][side] += read() - started[clock]
        # a cache as long as mid-decode: the prompt and the first half of this decode
        context = list(prompt) + decoded.tokens[: max(gamma + 1, comparison.max_new_tokens // 2)]
        measured = measure_step_times(
            target, draft, context, len(prompt), gamma, 2, 0, tuple(CLOCKS.values())
        )
        for clock, times in zip(CLOCKS, measured, strict=True):
            steps[clock].append(times)
    if hf_tokens != [trace.tokens for trace in checked]:
        raise MisconfiguredComparison("the timed HF decodes differ from the checked ones (same seeds)")
    hf_stats = sum((trace.stats for trace in checked), DecodeStats())
    decodes = len(comparison.prompts)
    timings = {
        clock: _timing(ours_stats, hf_stats, seconds[clock], _mean(steps[clock]), decodes) for clock in CLOCKS
    }
    return Round(ours_stats, hf_stats, **timings)


def _timing(ours: DecodeStats, hf: DecodeStats, seconds: dict[str, float], steps: StepTimes, decodes: int):
    return Timing(
        1000 * seconds["ours"] / ours.emitted,
        1000 * seconds["hf"] / hf.emitted,
        1000 * steps.limit_seconds_per_token(ours, decodes),
        1000 * steps.limit_seconds_per_token(hf, decodes),
        steps,
    )


def compare(target: PreTrainedModel, draft: PreTrainedModel, comparison: Comparison, rounds: int) -> Result:
    """Check the comparison, then time `rounds` rounds of it (the order of the decoders alternates)."""
    load_before = os.getloadavg()[0]
    configure_assistant(draft, comparison)
    traces, ours = verify_comparison(target, draft, comparison)  # raises before anything is timed
    same = sum(trace.tokens == tuple(decoded.tokens) for trace, decoded in zip(traces, ours, strict=True))
    done = tuple(time_round(target, draft, comparison, traces, hf_first=r % 2 == 1) for r in range(rounds))
    return Result(comparison, done, same, (load_before, os.getloadavg()[0]))


def _acceptance(stats: DecodeStats) -> str:
    return (
        f"α {stats.acceptance_rate:.3f} (accepted/tested {stats.accepted}/{stats.tested}), "
        f"accepted/drafted {stats.draft_acceptance:.3f} ({stats.accepted}/{stats.drafted}), "
        f"τ_b {stats.block_efficiency:.2f}"
    )


def _round_line(i: int, clock: str, t: Timing) -> str:
    s = t.steps
    return (
        f"    round {i} {clock:>4}: ours {t.ours_ms:.3f} ms/token, HF {t.hf_ms:.3f}, limit {t.limit_ms:.3f} "
        f"(t_draft {1000 * s.draft_step:.3f} ms, t_target_verify {1000 * s.target_verify:.3f}, t_target "
        f"{1000 * s.target_step:.3f}, prefills {1000 * s.draft_prefill:.2f}+{1000 * s.target_prefill:.2f}, "
        f"c {s.cost_ratio:.3f})"
    )


def report(result: Result) -> None:
    """Per-τ details: the checks that passed, every round under both clocks, acceptance both ways."""
    c, first = result.comparison, result.rounds[0]
    processors = expected_processors(c.tau) or "none"
    print(f"  τ={c.tau}: checked before timing: every verification step drafted γ={c.gamma} (fewer only")
    print(f"    at the length limit or a drafted EOS); logits processors on each side: {processors};")
    print(f"    lengths as asked; same tokens as HF for the same seed: {result.same_tokens}/{len(c.prompts)}")
    for i, r in enumerate(result.rounds, 1):
        print(_round_line(i, "wall", r.wall))
        print(_round_line(i, "cpu", r.cpu))
    print(f"    ours: {_acceptance(first.ours)}")
    print(f"    HF:   {_acceptance(first.hf)}")
    steps = first.wall.steps
    model = 1000 * (c.gamma * steps.draft_step + steps.target_verify) / first.ours.block_efficiency
    print(
        f"    cost model (γ·t_draft + t_target_verify)/τ_b = {model:.3f} ms/token (round 1 wall, prefills "
        f"left out); load average {result.load[0]:.2f} before, {result.load[1]:.2f} after"
    )


def _ratios(rounds: tuple[Round, ...], clock: str) -> str:
    timings = [getattr(r, clock) for r in rounds]
    ours_hf = statistics.median(t.ours_ms / t.hf_ms for t in timings)
    ours_limit = statistics.median(t.ours_ms / t.limit_ms for t in timings)
    hf_limit = statistics.median(t.hf_ms / t.hf_limit_ms for t in timings)
    return f"ours / HF = {ours_hf:.3f}   ours / limit = {ours_limit:.3f}   (HF / its limit = {hf_limit:.3f})"


def summary(results: list[Result]) -> None:
    """The last lines: per τ the medians over rounds of each round's ratios, wall time then CPU time."""
    print("summary, median over rounds of each round's ratio (wall time; then this process's CPU time):")
    for result in results:
        tau = result.comparison.tau
        print(f"τ={tau}: {_ratios(result.rounds, 'wall')}  |  cpu: {_ratios(result.rounds, 'cpu')}")


def profile_sides(target: PreTrainedModel, draft: PreTrainedModel, comparison: Comparison, top: int) -> None:
    """Where each decoder's CPU time goes: the share inside the two models' forward passes (what the limit
    counts), then cProfile's `top` functions by own time. Untimed; run after `compare` (configured, warm)."""
    kwargs = assisted_kwargs(comparison)
    sides = {
        "ours": lambda prompt, seed: run_ours(target, draft, prompt, seed, comparison),
        "HF": lambda prompt, seed: run_assisted(target, draft, prompt, seed, kwargs),
    }
    for side, run in sides.items():
        inside = [0.0]
        with _forward_timer(target, inside), _forward_timer(draft, inside):
            profiler = cProfile.Profile(time.process_time)
            started = time.process_time()
            profiler.enable()
            for prompt, seed in zip(comparison.prompts, comparison.seeds, strict=True):
                run(list(prompt), seed)
            profiler.disable()
            total = time.process_time() - started
        print(
            f"  profile τ={comparison.tau}, {side}: {total:.2f} s CPU under cProfile, "
            f"{100 * inside[0] / total:.0f}% inside the models' forward passes"
        )
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(top)


@contextlib.contextmanager
def _forward_timer(model: PreTrainedModel, total: list[float]):
    """Add the CPU time of every `model.forward` call to total[0] (an instance attribute shadows the
    class's forward, which nn.Module.__call__ looks up on the instance)."""
    forward = model.forward

    def timed(*args, **kwargs):
        started = time.process_time()
        try:
            return forward(*args, **kwargs)
        finally:
            total[0] += time.process_time() - started

    model.forward = timed
    try:
        yield
    finally:
        del model.forward
