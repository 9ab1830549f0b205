"""The empirical estimator: real speculative decoding against target-only decoding, timed.

Each prompt is decoded R times (the paper uses R = 5) with speculative decoding at batch size 1, and the
target-only baseline decodes the same prompt with the same seed to the same length, so both do the same
amount of work; `speedup` is the ratio of their total wall times, measured after a warm-up. At a batch size
B > 1 the prompts are decoded B at a time by the batched decoders (`batched.py`), each row with its own
seed, and the baseline decodes the same batch with each row cut at the length its speculative decode
reached; the clusters of the intervals are then the batches. With a
lenience function and ε < 1 the speculative side decodes lossily (DistillSpec Algorithm A.1); its outputs
are kept (`outputs`) so their task quality can be scored (`specray/quality.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specray.metrics import (
    PER_PROMPT_ACCEPTED,
    PER_PROMPT_DRAFTED,
    PER_PROMPT_SECONDS,
    PER_PROMPT_TARGET_CALLS,
    PER_PROMPT_TARGET_ONLY_SECONDS,
    PER_PROMPT_TESTED,
    PER_PROMPT_TOKENS,
)
from specray.seeds import decode_seed
from specray.specdec.analytic import ratio_ci95
from specray.specdec.batched import batched_autoregressive_decode, batched_speculative_decode
from specray.specdec.decoder import DecodeStats, autoregressive_decode, speculative_decode
from specray.specdec.results import EmpiricalResult

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel


@dataclass
class _PromptSums:
    """Per test prompt, its speculative decodes' counts summed over its repeats, and (at batch size 1, where a
    decode's time is its own) the wall seconds of both sides: what per-category figures are computed from."""

    stats: list[DecodeStats]
    seconds: list[float] = field(default_factory=list)
    target_only_seconds: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, prompts: int, timed: bool) -> _PromptSums:
        stats = [DecodeStats() for _ in range(prompts)]
        return cls(stats, [0.0] * prompts, [0.0] * prompts) if timed else cls(stats)

    def add(self, i: int, stats: DecodeStats, target_only_seconds: float | None = None) -> None:
        self.stats[i] = self.stats[i] + stats
        if target_only_seconds is not None:
            self.seconds[i] += stats.seconds
            self.target_only_seconds[i] += target_only_seconds

    def fields(self) -> dict[str, list]:
        return {
            PER_PROMPT_TOKENS: [s.emitted for s in self.stats],
            PER_PROMPT_TARGET_CALLS: [s.target_calls for s in self.stats],
            PER_PROMPT_ACCEPTED: [s.accepted for s in self.stats],
            PER_PROMPT_TESTED: [s.tested for s in self.stats],
            PER_PROMPT_DRAFTED: [s.drafted for s in self.stats],
            PER_PROMPT_SECONDS: list(self.seconds),
            PER_PROMPT_TARGET_ONLY_SECONDS: list(self.target_only_seconds),
        }


def _seed(seed: int, prompt_index: int, repeat: int, device: torch.device) -> torch.Generator:
    # on the models' device: sampling draws from it next to the logits (CUDA logits need a CUDA generator)
    generator = torch.Generator(device=device)
    return generator.manual_seed(decode_seed(seed, prompt_index, repeat))


def run_empirical(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    repeats: int,
    seed: int = 0,
    lenience: str | None = None,
    epsilon: float = 1.0,
    batch_size: int = 1,
) -> EmpiricalResult:
    """Decode every prompt `repeats` times both ways; counts are pooled, times summed."""
    if batch_size > 1:
        if epsilon < 1.0:
            raise ValueError("lossy decoding (ε < 1) runs at batch size 1 only")
        return _run_batched(
            target, draft, prompts, tau, gamma, max_new_tokens, eos_token_id, repeats, seed, batch_size
        )
    # warm-up: first calls pay for allocator growth and kernel selection
    speculative_decode(
        target,
        draft,
        prompts[0],
        tau,
        gamma,
        min(8, max_new_tokens),
        eos_token_id,
        lenience=lenience,
        epsilon=epsilon,
    )
    autoregressive_decode(target, prompts[0], tau, min(8, max_new_tokens), eos_token_id)
    total, baseline_seconds, per_decode = DecodeStats(), 0.0, []
    per_decode_extra: list[tuple[int, float, float, int]] = []
    alone = DecodeStats()
    outputs: list[list[list[int]]] = [[] for _ in prompts]
    sums = _PromptSums.of(len(prompts), timed=True)
    for i, prompt in enumerate(prompts):
        for r in range(repeats):
            generator = _seed(seed, i, r, target.device)
            decoded = speculative_decode(
                target,
                draft,
                prompt,
                tau,
                gamma,
                max_new_tokens,
                eos_token_id,
                generator,
                lenience=lenience,
                epsilon=epsilon,
            )
            stats = decoded.stats
            outputs[i].append(decoded.tokens)
            # same seed and the same number of tokens, with no early stop: equal work for the baseline
            generator = _seed(seed, i, r, target.device)
            baseline = autoregressive_decode(target, prompt, tau, stats.emitted, None, generator)
            baseline_seconds += baseline.stats.seconds
            alone = alone + baseline.stats
            total = total + stats
            sums.add(i, stats, baseline.stats.seconds)
            per_decode.append((stats.accepted, stats.tested))
            per_decode_extra.append(
                (stats.drafted, baseline.stats.seconds, stats.seconds, stats.target_calls)
            )
    steps = (total.target_calls, alone.target_calls)
    return _result(total, alone, per_decode, per_decode_extra, gamma, len(per_decode), outputs, steps, sums)


def _result(
    total: DecodeStats,
    alone: DecodeStats,
    per_cluster: list[tuple[int, int]],
    per_cluster_extra: list[tuple[int, float, float, int]],
    gamma: int,
    decodes: int,
    outputs: list[list[list[int]]],
    steps: tuple[int, int],
    sums: _PromptSums,
    batch_size: int = 1,
) -> EmpiricalResult:
    """Pooled counts and summed times; intervals with each cluster (a decode, or a batch) independent.
    `steps`: the forward passes of the speculative and target-only sides (a batch's step is one pass)."""
    counts = torch.tensor(per_cluster, dtype=torch.float64)  # [clusters, 2]: accepted, tested
    # [clusters, 4]: drafted, target-only seconds, speculative seconds, verification steps
    extra = torch.tensor(per_cluster_extra, dtype=torch.float64)
    return EmpiricalResult(
        acceptance_rate=total.acceptance_rate,
        acceptance_rate_ci95=ratio_ci95(counts[:, 0], counts[:, 1]),
        draft_acceptance=total.draft_acceptance,
        block_efficiency=total.block_efficiency,
        speedup=alone.seconds / total.seconds,
        speculative_seconds=total.seconds,
        target_only_seconds=alone.seconds,
        decodes=decodes,
        tokens=total.emitted,
        mean_acceptance_length=1.0 + total.accepted / total.target_calls,
        mean_acceptance_length_ci95=ratio_ci95(counts[:, 0], extra[:, 3]),
        draft_acceptance_ci95=ratio_ci95(counts[:, 0], extra[:, 0]),
        acceptance_per_position=_per_position(total, gamma),
        speedup_ci95=ratio_ci95(extra[:, 1], extra[:, 2]),
        drafted_per_step=total.drafted / total.target_calls,
        tokens_per_decode=total.emitted / decodes,
        draft_step_seconds=total.draft_seconds / max(total.draft_forwards, 1),
        verify_seconds=total.target_seconds / steps[0],
        target_step_seconds=alone.target_seconds / max(steps[1], 1),
        batch_size=batch_size,
        outputs=outputs,
        **sums.fields(),
    )


def _run_batched(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    gamma: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    repeats: int,
    seed: int,
    batch_size: int,
) -> EmpiricalResult:
    """`run_empirical` at B > 1: the prompts B at a time (the last batch may be smaller), each row with
    the seed its prompt and repeat have at batch size 1. A batch's phase times are counted once."""
    batches = [list(range(i, min(i + batch_size, len(prompts)))) for i in range(0, len(prompts), batch_size)]
    device = target.device
    warm = [prompts[i] for i in batches[0]]
    batched_speculative_decode(target, draft, warm, tau, gamma, min(8, max_new_tokens), eos_token_id)
    batched_autoregressive_decode(target, warm, tau, min(8, max_new_tokens), eos_token_id)
    total, alone, steps = DecodeStats(), DecodeStats(), [0, 0]
    per_batch: list[tuple[int, int]] = []
    per_batch_extra: list[tuple[int, float, float, int]] = []
    outputs: list[list[list[int]]] = [[] for _ in prompts]
    sums = _PromptSums.of(len(prompts), timed=False)  # a batch's time is shared by its rows
    for r in range(repeats):
        for rows in batches:
            chosen = [prompts[i] for i in rows]
            spec = batched_speculative_decode(
                target,
                draft,
                chosen,
                tau,
                gamma,
                max_new_tokens,
                eos_token_id,
                [_seed(seed, i, r, device) for i in rows],
            )
            lengths = [len(decoded.tokens) for decoded in spec]
            base = batched_autoregressive_decode(
                target, chosen, tau, lengths, None, [_seed(seed, i, r, device) for i in rows]
            )
            for i, decoded in zip(rows, spec, strict=True):
                outputs[i].append(decoded.tokens)
                sums.add(i, decoded.stats)
            batch = _batch_stats([d.stats for d in spec])
            baseline = _batch_stats([d.stats for d in base])
            total, alone = total + batch, alone + baseline
            steps[0] += max(d.stats.target_calls for d in spec)
            steps[1] += max(d.stats.target_calls for d in base)
            per_batch.append((batch.accepted, batch.tested))
            per_batch_extra.append((batch.drafted, baseline.seconds, batch.seconds, batch.target_calls))
    decodes = repeats * len(prompts)
    steps_ = (steps[0], steps[1])
    return _result(
        total, alone, per_batch, per_batch_extra, gamma, decodes, outputs, steps_, sums, batch_size
    )


def _batch_stats(rows: list[DecodeStats]) -> DecodeStats:
    """One batch's counts: the rows' summed, its times once (every row carries the batch's)."""
    pooled = sum(rows, DecodeStats())
    first = rows[0]
    pooled.seconds, pooled.draft_seconds, pooled.target_seconds = (
        first.seconds,
        first.draft_seconds,
        first.target_seconds,
    )
    pooled.draft_forwards = first.draft_forwards
    return pooled


def decode_alone(
    model: PreTrainedModel,
    prompts: list[list[int]],
    tau: float,
    max_new_tokens: int,
    eos_token_id: int | None,
    repeats: int,
    seed: int = 0,
) -> list[list[list[int]]]:
    """One model decoding alone (target-only or draft-only) on the empirical cells' prompts, repeats and
    seeds, with the speculative decoder's stopping rules: new tokens per prompt, then repeat."""
    return [
        [
            autoregressive_decode(
                model, prompt, tau, max_new_tokens, eos_token_id, _seed(seed, i, r, model.device)
            ).tokens
            for r in range(repeats)
        ]
        for i, prompt in enumerate(prompts)
    ]


def _per_position(total: DecodeStats, gamma: int) -> list[float]:
    counts = total.accepted_per_position + [0] * (gamma - len(total.accepted_per_position))
    return [count / total.target_calls for count in counts[:gamma]]
