"""Generation engines behind one small protocol (`generation.py`).

An engine turns `GenerationRequest`s into `GenerationResult`s. Two engines exist: `transformers` (any HF
causal LM, CPU or GPU, decoding with `specray.sampling`) and `vllm` (GPU clusters, `vllm_engine.py`).
`make_engine` picks one by the spec's name. Each request samples from its own seeded generator
(`seeds.request_seed`), so a result does not depend on its batch (for the vllm engine, only in vLLM's
batch-invariant mode).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from specray.sampling import Sample, eos_token_ids, sample_batch
from specray.seeds import request_seed
from specray.teacher.generation import GenerationEngine, GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from specray.config import TeacherSpec  # types only: the engines run where pydantic may be absent


class TransformersEngine:
    """Any HF causal LM, loaded once; batches of `batch_size` requests of similar prompt length."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        trust_remote_code: bool = False,
        batch_size: int = 32,
        device: str = "cpu",
    ) -> None:
        from specray.models.loading import load_model, load_tokenizer

        self.tokenizer = load_tokenizer(model_path, trust_remote_code)
        self.model = load_model(model_path, dtype, trust_remote_code, device)
        self.batch_size = batch_size
        self.eos_token_ids = eos_token_ids(self.model, self.tokenizer)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        import torch

        prompt_ids = [
            self.tokenizer(r.prompt, add_special_tokens=r.add_special_tokens)["input_ids"] for r in requests
        ]
        # Similar lengths share a batch (less padding); safe because results do not depend on batching.
        order = sorted(range(len(requests)), key=lambda i: len(prompt_ids[i]))
        device = next(self.model.parameters()).device
        results: dict[int, GenerationResult] = {}
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = [requests[i] for i in rows]
            generators = [
                torch.Generator(device=device).manual_seed(request_seed(r.seed, r.prompt_id, r.tau))
                for r in batch
            ]
            samples = sample_batch(
                self.model,
                [prompt_ids[i] for i in rows],
                [r.tau for r in batch],
                generators,
                [r.max_new_tokens for r in batch],
                self.eos_token_ids,
                self.tokenizer.pad_token_id,
            )
            for i, request, sample in zip(rows, batch, samples, strict=True):
                results[i] = self._result(request, prompt_ids[i], sample)
        return [results[i] for i in range(len(requests))]

    def _result(self, request: GenerationRequest, prompt_ids: list[int], sample: Sample) -> GenerationResult:
        from specray.models.loading import decode_text

        return GenerationResult(
            prompt_id=request.prompt_id,
            tau=request.tau,
            seed=request.seed,
            prompt_token_ids=list(prompt_ids),
            response_token_ids=sample.token_ids,
            response_text=decode_text(self.tokenizer, sample.token_ids),
            finish_reason=sample.finish_reason,
        )

    def close(self) -> None:
        del self.model


def _transformers(
    spec: TeacherSpec, model_path: str, dtype: str, trust_remote_code: bool, device: str
) -> GenerationEngine:
    return TransformersEngine(model_path, dtype, trust_remote_code, spec.batch_size, device)


def _vllm(
    spec: TeacherSpec, model_path: str, dtype: str, trust_remote_code: bool, device: str
) -> GenerationEngine:
    from specray.teacher.vllm_engine import VllmEngine

    # vLLM places its own workers on the GPUs Ray gave the replica (or its placement group): no device
    return VllmEngine(model_path, spec.vllm, spec.seed, trust_remote_code, model_dtype=dtype)


EngineFactory = Callable[["TeacherSpec", str, str, bool, str], GenerationEngine]
ENGINES: dict[str, EngineFactory] = {"transformers": _transformers, "vllm": _vllm}


def make_engine(
    spec: TeacherSpec,
    model_path: str,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    device: str = "cpu",
) -> GenerationEngine:
    """The engine `spec.engine` names, hosting the model at `model_path` (an HF name or local dir) on
    `device` (the replica's, `devices.Resources.device`)."""
    if spec.engine not in ENGINES:
        raise ValueError(f"unknown teacher engine {spec.engine!r}; valid: {', '.join(sorted(ENGINES))}")
    return ENGINES[spec.engine](spec, model_path, dtype, trust_remote_code, device)
