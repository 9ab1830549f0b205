"""The cost ratio c = latency of one draft step / one target step, measured once with its 95% interval.

Every distilled draft has the student's architecture, so c is a property of (target, draft architecture,
device) and is measured once per sweep, on the un-distilled draft, where the cells run; per-draft timings on
a busy machine would only add noise to `speedup_model` (differences of a few percent between τ_kd are the
effects under study). Steps of the two models are interleaved, so a burst of load hits both sides alike,
and measured in rounds until the bootstrap 95% interval of median(draft) / median(target) is within
`rel_precision` of c (or a step or time budget runs out; the interval says how far it got).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from scipy.stats import bootstrap
from transformers import PreTrainedModel

from specray.specdec.decoder import crop_cache, forward_cached, prefill_cache
from specray.specdec.records import CostRatio

ROUND = 20  # step pairs per round
WARMUP = 3


def _ratio_of_medians(draft: np.ndarray, target: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(draft, axis=axis) / np.median(target, axis=axis)


def ratio_interval(
    draft_seconds: np.ndarray, target_seconds: np.ndarray, seed: int = 0
) -> tuple[float, float]:
    """c and the half-width of its 95% percentile-bootstrap interval over paired steps."""
    value = float(_ratio_of_medians(draft_seconds, target_seconds))
    result = bootstrap(
        (draft_seconds, target_seconds),
        _ratio_of_medians,
        paired=True,
        vectorized=True,
        n_resamples=2000,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return value, float(max(value - low, high - value))


@torch.inference_mode()
def _timed_pairs(target: PreTrainedModel, draft: PreTrainedModel, prompt: list[int], pairs: int):
    """`pairs` (draft, target) step times: one token after the cached prompt, caches cropped back."""
    device = next(target.parameters()).device
    caches = {model: prefill_cache(model, prompt, device) for model in (draft, target)}
    lengths = {model: cache.get_seq_length() for model, cache in caches.items()}
    times: dict[PreTrainedModel, list[float]] = {draft: [], target: []}
    for _ in range(pairs):
        for model, cache in caches.items():
            crop_cache(cache, lengths[model])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.perf_counter()
            forward_cached(model, [prompt[-1]], cache, device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # time the kernels, not their launch
            times[model].append(time.perf_counter() - started)
    return times[draft], times[target]


def measure_cost_ratio(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prompt: list[int],
    rel_precision: float = 0.02,
    max_pairs: int = 2000,
    max_seconds: float = 120.0,
) -> CostRatio:
    """c with a 95% interval of ±`rel_precision`·c, or as close as the budgets allow."""
    _timed_pairs(target, draft, prompt, WARMUP)  # allocator growth and kernel selection
    draft_times: list[float] = []
    target_times: list[float] = []
    started = time.monotonic()
    while True:
        d, t = _timed_pairs(target, draft, prompt, ROUND)
        draft_times += d
        target_times += t
        value, half = ratio_interval(np.array(draft_times), np.array(target_times))
        enough = len(draft_times) >= 2 * ROUND and half <= rel_precision * value
        if enough or len(draft_times) >= max_pairs or time.monotonic() - started > max_seconds:
            device = str(next(target.parameters()).device.type)
            return CostRatio(value, half, len(draft_times), "measured", device)
