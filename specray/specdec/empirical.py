"""The empirical estimator: real speculative decoding against target-only decoding, timed.

Each prompt is decoded R times (the paper uses R = 5) with speculative decoding at batch size 1, and the
target-only baseline decodes the same prompt with the same seed to the same length, so both do the same
amount of work; `speedup` is the ratio of their total wall times, measured after a warm-up. With a
lenience function and ε < 1 the speculative side decodes lossily (DistillSpec Algorithm A.1); its outputs
are kept (`outputs`) so their task quality can be scored (`specray/quality.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specray.seeds import decode_seed
from specray.specdec.analytic import ratio_ci95
from specray.specdec.decoder import DecodeStats, autoregressive_decode, speculative_decode


@dataclass(frozen=True)
class EmpiricalResult:
    acceptance_rate: float
    acceptance_rate_ci95: float  # half-width, each decode a cluster
    draft_acceptance: float
    block_efficiency: float
    speedup: float  # target-only wall time / speculative wall time
    speculative_seconds: float
    target_only_seconds: float
    decodes: int
    tokens: int
    # what servers report (vLLM's definitions), from the decoder's counts; intervals: each decode a cluster
    mean_acceptance_length: float  # 1 + accepted / verification steps
    mean_acceptance_length_ci95: float
    draft_acceptance_ci95: float
    acceptance_per_position: list[float]  # steps accepting ≥ k+1 tokens / steps, k < γ
    speedup_ci95: float
    # the speculative decodes' new tokens, per prompt then repeat (for quality; not a metric)
    outputs: list[list[list[int]]] = field(default_factory=list, repr=False)


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
) -> EmpiricalResult:
    """Decode every prompt `repeats` times both ways; counts are pooled, times summed."""
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
    outputs: list[list[list[int]]] = [[] for _ in prompts]
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
            total = total + stats
            per_decode.append((stats.accepted, stats.tested))
            per_decode_extra.append(
                (stats.drafted, baseline.stats.seconds, stats.seconds, stats.target_calls)
            )
    counts = torch.tensor(per_decode, dtype=torch.float64)
    # [decodes, 4]: drafted, target-only seconds, speculative seconds, verification steps
    extra = torch.tensor(per_decode_extra, dtype=torch.float64)
    return EmpiricalResult(
        acceptance_rate=total.acceptance_rate,
        acceptance_rate_ci95=ratio_ci95(counts[:, 0], counts[:, 1]),
        draft_acceptance=total.draft_acceptance,
        block_efficiency=total.block_efficiency,
        speedup=baseline_seconds / total.seconds,
        speculative_seconds=total.seconds,
        target_only_seconds=baseline_seconds,
        decodes=len(per_decode),
        tokens=total.emitted,
        mean_acceptance_length=1.0 + total.accepted / total.target_calls,
        mean_acceptance_length_ci95=ratio_ci95(counts[:, 0], extra[:, 3]),
        draft_acceptance_ci95=ratio_ci95(counts[:, 0], extra[:, 0]),
        acceptance_per_position=_per_position(total, gamma),
        speedup_ci95=ratio_ci95(extra[:, 1], extra[:, 2]),
        outputs=outputs,
    )


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
