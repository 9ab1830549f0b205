"""The vLLM engine for GPU clusters: one `vllm.LLM` per replica, one `SamplingParams` per request.

Checked against vLLM 0.33.0, read from its released wheel; `make test-vllm-api` builds these objects with
that version on a CPU machine (docs/vllm.md). The offline API used: `vllm.LLM(model=, tensor_parallel_size=,
dtype=, gpu_memory_utilization=, seed=, max_model_len=, trust_remote_code=)`, `vllm.SamplingParams(n=,
temperature=, top_p=, top_k=, min_p=, seed=, max_tokens=)` and `LLM.generate(prompts, params_list,
use_tqdm=)` returning `RequestOutput`s with `.prompt_token_ids` and `.outputs[0]` (`.text`, `.token_ids`,
`.finish_reason`). vLLM treats temperature 0 as greedy. vLLM is imported only when an engine is built, so
specray installs and tests without it; the mappings below are pure and tested without vLLM.

What a vLLM shard guarantees. Each request carries its own seed, so vLLM's random draws are per request.
The logits are independent of the rest of the batch only in vLLM's batch-invariant mode, which each
replica turns on (`teacher.vllm.batch_invariant`, default on) where vLLM implements it: CUDA compute
capability 8.x, 9.x or 10.x, and ROCm. Elsewhere, or with it off, a request's logits can differ in the
last bits with the batch it shares, so a batch re-run after a lost replica may give other tokens at τ > 0
than the lost attempt would have. A row is still written from exactly one attempt (the pool reads one
result per batch), so a shard is a valid sample at its τ either way; what is lost is bit-for-bit equality
with a run that lost no replica. The temperatures vLLM would change or reject are refused by the config.

Not run in this repository's CI (no GPU); vLLM samples are not the same draws as the transformers
engine's (different RNG).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from specray.config import VllmSpec
from specray.errors import ModelError
from specray.seeds import request_seed
from specray.teacher.generation import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'specray[vllm]'"
FINISH_REASONS = ("stop", "length")  # vLLM's others: abort, error, repetition (only when asked for)
# CUDA major versions whose batch-invariant kernels vLLM 0.33.0 ships (`model_executor/determinism`)
BATCH_INVARIANT_CUDA_MAJORS = (8, 9, 10)


def to_sampling_kwargs(request: GenerationRequest) -> dict[str, Any]:
    """`vllm.SamplingParams` keyword arguments for one request: plain softmax(logits/τ) sampling.

    top_p/top_k/min_p are set to their "off" values explicitly so no model or server default truncates
    the distribution (KD data must come from p_τ itself); τ = 0 is vLLM's greedy mode.
    """
    return {
        "n": 1,
        "temperature": float(request.tau),
        "top_p": 1.0,
        "top_k": 0,  # vLLM's "disabled" value (-1 is still accepted, 0 is the documented one)
        "min_p": 0.0,
        "seed": request_seed(request.seed, request.prompt_id, request.tau),
        "max_tokens": request.max_new_tokens,
    }


def llm_kwargs(
    model_path: str, spec: VllmSpec, seed: int, trust_remote_code: bool = False, model_dtype: str = "auto"
) -> dict[str, Any]:
    """`vllm.LLM` keyword arguments from the spec's `teacher.vllm` section; `teacher.vllm.dtype: auto`
    falls back to the model's own `dtype` from `models.target`."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "dtype": spec.dtype if spec.dtype != "auto" else model_dtype,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "seed": seed,
        "trust_remote_code": trust_remote_code,
    }
    if spec.max_model_len is not None:
        kwargs["max_model_len"] = spec.max_model_len
    if spec.tensor_parallel_size > 1:
        # Inside a Ray actor, vLLM places its tensor-parallel workers as Ray actors in the placement group
        # the pool reserved for this replica (OpenRLHF's layout).
        kwargs["distributed_executor_backend"] = "ray"
    return kwargs


def to_result(request: GenerationRequest, output: Any) -> GenerationResult:
    """A specray result from one vLLM `RequestOutput`."""
    completion = output.outputs[0]
    if completion.finish_reason not in FINISH_REASONS:
        raise RuntimeError(
            f"vLLM finished prompt {request.prompt_id!r} with reason {completion.finish_reason!r}; "
            f"a shard takes only {' or '.join(FINISH_REASONS)}"
        )
    if completion.finish_reason == "length" and len(completion.token_ids) < request.max_new_tokens:
        # "length" also means the context limit; the config keeps max_model_len above prompt + response
        raise RuntimeError(
            f"vLLM stopped prompt {request.prompt_id!r} at its context limit after "
            f"{len(completion.token_ids)} of {request.max_new_tokens} tokens: "
            "raise teacher.vllm.max_model_len"
        )
    return GenerationResult(
        prompt_id=request.prompt_id,
        tau=request.tau,
        seed=request.seed,
        prompt_token_ids=list(output.prompt_token_ids),
        response_token_ids=list(completion.token_ids),
        response_text=completion.text,
        finish_reason=completion.finish_reason,
    )


def batch_invariant_supported(cuda_capability: tuple[int, int] | None, rocm: bool) -> bool:
    """Whether vLLM 0.33.0 has batch-invariant kernels for this device (None: no CUDA device)."""
    return rocm or (cuda_capability is not None and cuda_capability[0] in BATCH_INVARIANT_CUDA_MAJORS)


def enable_batch_invariance(spec: VllmSpec) -> bool:
    """Set VLLM_BATCH_INVARIANT=1 for this process where vLLM supports it; it must precede `import vllm`
    (vLLM reads it when its kernels load). Returns whether rows are batch-invariant."""
    if not spec.batch_invariant:
        return False
    import torch

    rocm = torch.version.hip is not None
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
    if not batch_invariant_supported(capability, rocm):
        log.warning(
            "vLLM has no batch-invariant kernels for this device (CUDA capability %s): a request's logits "
            "may depend on its batch, so a batch re-run after a lost replica can differ at τ > 0",
            capability,
        )
        return False
    os.environ["VLLM_BATCH_INVARIANT"] = "1"
    return True


def require_vllm() -> None:
    """A ModelError naming the `[vllm]` extra when vLLM is not importable here."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ModelError(
            f"teacher.engine 'vllm' needs vLLM, which is not installed; install it with {INSTALL_HINT} "
            "on a GPU machine, or set teacher.engine=transformers"
        )


class VllmEngine:
    """One `vllm.LLM`; every request carries its own `SamplingParams` (so one call mixes temperatures)."""

    def __init__(
        self,
        model_path: str,
        spec: VllmSpec,
        seed: int = 0,
        trust_remote_code: bool = False,
        model_dtype: str = "auto",
    ) -> None:
        self.batch_invariant = enable_batch_invariance(spec)
        try:
            import vllm
        except ImportError as e:
            raise ModelError(
                f"teacher.engine 'vllm' needs vLLM, which cannot be imported ({e}); install it with "
                f"{INSTALL_HINT} on a GPU machine, or set teacher.engine=transformers"
            ) from None
        self._sampling_params = vllm.SamplingParams
        self.llm = vllm.LLM(**llm_kwargs(model_path, spec, seed, trust_remote_code, model_dtype))

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        params = [self._sampling_params(**to_sampling_kwargs(r)) for r in requests]
        outputs = self.llm.generate([self._prompt(r) for r in requests], params, use_tqdm=False)
        return [to_result(r, o) for r, o in zip(requests, outputs, strict=True)]

    def _prompt(self, request: GenerationRequest) -> str | dict[str, list[int]]:
        """A text prompt, or (a chat text that holds its own BOS) its token ids: vLLM's text prompts always
        get the tokenizer's special tokens, its `TokensPrompt` form takes ids as they are."""
        if request.add_special_tokens:
            return request.prompt
        tokenizer = self.llm.get_tokenizer()
        return {"prompt_token_ids": tokenizer(request.prompt, add_special_tokens=False)["input_ids"]}

    def close(self) -> None:
        del self.llm
