"""What each estimator returns for one cell: the analytic estimator's expected counts and the empirical
decoder's measured ones, as frozen records (a `CellRecord`'s metrics, typed by `typed_result`)."""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

R = TypeVar("R")


@dataclass(frozen=True)
class AnalyticResult:
    acceptance_rate: float  # mean β over every response position (token-pooled)
    acceptance_rate_ci95: float  # half-width, sequences as clusters
    acceptance_rate_per_sequence: float  # mean over sequences of each one's mean β (DistillSpec's per input)
    beta_per_position: list[float]  # mean β at response position t (over sequences that reach t)
    block_efficiency: float  # i.i.d. formula (1 − α^{γ+1}) / (1 − α), from α (β-based)
    block_efficiency_simulated: float  # expectation over each sequence's per-position β (β-based)
    # the modelled speedup (`records.StepCosts.speedup`: whole decodes, prefills in) from the exact
    # expected counts below, at the smallest batch size of the costs, and at every batch size
    speedup_model: float
    speedup_model_ci95: float
    speedup_model_by_batch: dict[str, float]  # str(B) -> speedup_model at B
    speedup_model_by_batch_ci95: dict[str, float]
    cost_terms: dict[str, float]  # `records.CostTerms` at the smallest batch size (for resampling prompts)
    tokens: int
    # the same acceptance on exactly the empirical cells' prompts, for a fair agreement check
    empirical_prompts_acceptance_rate: float
    empirical_prompts_acceptance_rate_ci95: float
    # per test prompt, in order (0 for an empty response): what a paired bootstrap over prompts resamples —
    # α = Σ beta_sum / Σ tokens, block efficiency = Σ tokens / Σ target_calls and the speedup
    # (`CostTerms.speedup` of the sums) for any subset of prompts; calls and drafts expected exactly
    per_prompt_tokens: list[int]
    per_prompt_beta_sum: list[float]
    per_prompt_target_calls: list[float]
    per_prompt_drafted: list[float]
    per_prompt_accepted: list[float]  # expected accepted draft tokens (the server metrics of a subset)
    # what servers report, expected under the decoders' rules along the sampled tokens' own acceptance
    # (`specray.ops.blocks`: exact, where block_efficiency_simulated's β is not); intervals: sequences as
    # clusters
    block_efficiency_sampled: float  # expected tokens / verification steps: the E of every speedup
    block_efficiency_sampled_ci95: float
    drafted_per_step: float  # expected draft tokens proposed per verification step (≤ γ)
    tokens_per_decode: float  # mean new tokens of a decode
    mean_acceptance_length: float  # 1 + accepted / verification steps (vLLM's definition)
    mean_acceptance_length_ci95: float
    mean_acceptance_length_hf: float  # in HF's counting (see draft_acceptance_hf)
    draft_acceptance: float  # accepted / drafted (our decoder's counting)
    draft_acceptance_ci95: float
    draft_acceptance_hf: float  # accepted / drafted as HF assisted generation counts (see ops/blocks.py)
    acceptance_per_position: list[float]  # steps accepting ≥ k+1 tokens / steps, k < γ (vLLM's)
    # per test prompt, the target's mean entropy (nats) of p_τ over its response: the report's entropy tiers
    per_prompt_target_entropy: list[float] = field(default_factory=list)


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
    # what the cost model reads (`records.StepCosts.speedup`), and where the time went: seconds per draft
    # step, per verification pass and per target-only step (the decoders' phase clocks, prefills excluded)
    drafted_per_step: float
    tokens_per_decode: float
    draft_step_seconds: float
    verify_seconds: float
    target_step_seconds: float
    batch_size: int = 1
    # the speculative decodes' new tokens, per prompt then repeat (for quality; not a metric)
    outputs: list[list[list[int]]] = field(default_factory=list, repr=False)
    # per test prompt, summed over its repeats (per-category figures, `specdec/categories.py`); the seconds
    # at batch size 1 only (at B > 1 a batch's time is shared by its rows: empty)
    per_prompt_tokens: list[int] = field(default_factory=list)
    per_prompt_target_calls: list[int] = field(default_factory=list)
    per_prompt_accepted: list[int] = field(default_factory=list)
    per_prompt_tested: list[int] = field(default_factory=list)
    per_prompt_drafted: list[int] = field(default_factory=list)
    per_prompt_seconds: list[float] = field(default_factory=list)
    per_prompt_target_only_seconds: list[float] = field(default_factory=list)


def typed_result(cls: type[R], metrics: Mapping[str, Any]) -> R:
    """A cell's metrics as its estimator's result record.

    A field the metrics lack reads as unknown: NaN for a number, empty for a list or a mapping — never a zero
    that a table would show as measured. A saved record of another format is recomputed before it is read
    (`specray.keys.check_format`), so every record read from disk has every field; partial metrics come
    from callers that build a record by hand."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):  # type: ignore[arg-type]
        if f.name in metrics:
            values[f.name] = metrics[f.name]
        elif f.default is not MISSING or f.default_factory is not MISSING:
            continue
        else:
            origin = typing.get_origin(hints[f.name]) or hints[f.name]
            values[f.name] = {list: [], dict: {}}.get(origin, math.nan)
    return cls(**values)
