"""One point of a model garden's quality–latency plot: a target decoding alone, or with a draft, at batch 1.

A point decodes the garden's test prompts (`eval.repeats` times each, seeded per prompt and repeat as the
empirical cells are) with the empirical decoder (`specdec/decoder.py`) and keeps, per prompt, the wall time
of its decodes, the tokens they emitted and the task quality of their texts (`specray/quality.py`). Both
latency and quality are then figures of the same decodes: a lossless speculative point's quality is that
of its own samples (distributed as its target's), a lossy point's (ε < 1) is what leniency cost.

It lives in specdec, beside the decoder it measures with and the eval pool that runs it
(`specdec.workers`), so the eval pool and the report read a point without importing the garden's driver
(`specray.garden`), which sits above both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specray.data.examples import Example
from specray.metrics import QUALITY
from specray.quality import EXACT_MATCH, ROUGE_L, metric_kind, score_example
from specray.seeds import decode_seed
from specray.specdec.decoder import autoregressive_decode, speculative_decode
from specray.specdec.records import EvalSettings

MEASURE_FORMAT = 1  # bump when what a point measures changes, so cached points are measured again


@dataclass(frozen=True)
class GardenPoint:
    """What one point decodes: `target` alone (`draft` None) or with `draft` at block size γ, at τ, with
    lenience (`function`, ε) where ε < 1. `curve` and `model` name it in the plot
    (`garden.run.garden_points`)."""

    curve: str
    model: str
    target: str
    draft: str | None
    tau: float
    gamma: int = 0
    function: str | None = None
    epsilon: float = 1.0

    @property
    def label(self) -> str:
        parts = [self.curve, self.model, f"tau_dec_{self.tau:g}"]
        if self.draft is not None:
            parts.append(f"gamma_{self.gamma}")
        if self.epsilon < 1.0:
            parts.append(f"{self.function}_eps_{self.epsilon:g}")
        return "/".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PointResult:
    """Per prompt: wall seconds and emitted tokens summed over its repeats, the quality of its decodes
    (their mean, nan where the prompt has no value of `metric`), and for a speculative point the tokens
    each verification step emitted (summed: `steps` target calls gave `tokens`)."""

    point: GardenPoint
    metric: str
    seconds: list[float]
    tokens: list[int]
    quality: list[float]
    steps: list[int] = field(default_factory=list)
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "point": self.point.to_json(),
            "metric": self.metric,
            "seconds": self.seconds,
            "tokens": self.tokens,
            QUALITY: self.quality,
            "steps": self.steps,
            "key": self.key,
            "format": MEASURE_FORMAT,
        }

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> PointResult:
        fields = {k: v for k, v in payload.items() if k not in ("point", "format")}
        return cls(point=GardenPoint(**payload["point"]), **fields)


def headline(examples: Sequence[Example]) -> str:
    """The metric a garden's quality axis shows: exact match where any prompt has one right answer, else
    ROUGE-L (as `quality.headline_metric` picks a test set's)."""
    return EXACT_MATCH if any(metric_kind(e) == EXACT_MATCH for e in examples) else ROUGE_L


def measure_point(
    point: GardenPoint,
    target: Any,
    draft: Any | None,
    prompts: Sequence[list[int]],
    examples: Sequence[Example],
    decode_text: Callable[[list[int]], str],
    settings: EvalSettings,
    eos_token_id: int | None,
) -> PointResult:
    """Decode every prompt `settings.repeats` times as `point` says (after a short warm-up decode), timing
    each."""
    metric, max_new_tokens, repeats = headline(examples), settings.max_new_tokens, settings.repeats

    def decode(prompt: list[int], generator: torch.Generator | None, limit: int) -> Any:
        if draft is None:
            return autoregressive_decode(target, prompt, point.tau, limit, eos_token_id, generator)
        return speculative_decode(
            target,
            draft,
            prompt,
            point.tau,
            point.gamma,
            limit,
            eos_token_id,
            generator,
            lenience=point.function if point.epsilon < 1.0 else None,
            epsilon=point.epsilon,
        )

    with torch.inference_mode():
        decode(prompts[0], None, min(8, max_new_tokens))  # first calls pay for allocator growth
        seconds, tokens, quality, steps = [], [], [], []
        for i, (prompt, example) in enumerate(zip(prompts, examples, strict=True)):
            spent, emitted, calls, scores = 0.0, 0, 0, []
            for r in range(repeats):
                generator = torch.Generator(device=target.device).manual_seed(
                    decode_seed(settings.seed, i, r)
                )
                started = time.perf_counter()
                decoded = decode(prompt, generator, max_new_tokens)
                spent += time.perf_counter() - started
                emitted += len(decoded.tokens)
                calls += decoded.stats.target_calls
                scores.append(score_example(example, decode_text(decoded.tokens)).get(metric, float("nan")))
            seconds.append(spent)
            tokens.append(emitted)
            steps.append(calls)
            quality.append(sum(scores) / len(scores))
    return PointResult(point, metric, seconds, tokens, quality, steps)
