"""What a generation engine is given and gives back: one request per (prompt, τ), one result each, and
the engine's protocol. Kept apart from the engines so the vLLM engine and the teacher pool share the types
without importing each other.

Reproducibility contract: every request samples with its own `torch.Generator`, seeded from
(run seed, prompt id, τ), and draws from it only while that request is still generating. So a request's
output does not depend on which other requests share its batch, on the batch size, or on which replica
runs it — a retried batch after an actor restart reproduces the same rows, and τ = 0 (greedy) and τ > 0
(same seed) shards are identical across runs. This holds for the transformers engine; the vllm engine keeps
it only in vLLM's batch-invariant mode (`vllm_engine.py`).
τ is part of the seed so that shards at neighbouring τ_kd are independent draws, not the same random stream
re-warped (mixtures of τ_kd shards stay diverse).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specray.sampling import FinishReason


@dataclass(frozen=True)
class GenerationRequest:
    """One response to sample: `prompt` at temperature `tau` (0 = greedy) with at most `max_new_tokens`.
    `add_special_tokens` False: the text already holds them (a chat template's BOS)."""

    prompt_id: str
    prompt: str
    tau: float
    seed: int
    max_new_tokens: int
    add_special_tokens: bool = True


@dataclass(frozen=True)
class GenerationResult:
    """The sampled response. `response_token_ids` ends with the EOS id when `finish_reason` is "stop"
    (a student must learn to stop); `response_text` is decoded without special tokens."""

    prompt_id: str
    tau: float
    seed: int
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_text: str
    finish_reason: FinishReason


class GenerationEngine(Protocol):
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def close(self) -> None: ...
