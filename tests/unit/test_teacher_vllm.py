"""The vLLM engine's pure mappings, tested without vLLM (it is not installable on a CPU machine)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from specray.config import TeacherSpec, VllmSpec
from specray.errors import ModelError
from specray.seeds import request_seed
from specray.teacher.engines import make_engine
from specray.teacher.generation import GenerationRequest
from specray.teacher.vllm_engine import VllmEngine, llm_kwargs, require_vllm, to_result, to_sampling_kwargs
from tests.conftest import REPO

SMOKE = REPO / "sweeps" / "smoke.yaml"


def request(tau: float = 0.7, seed: int = 3, max_new_tokens: int = 48) -> GenerationRequest:
    return GenerationRequest(
        "p-1", "### Instruction:\nAdd 2 and 3.\n\n### Response:\n", tau, seed, max_new_tokens
    )


def test_sampling_kwargs_are_plain_temperature_sampling_with_a_per_request_seed() -> None:
    kwargs = to_sampling_kwargs(request(tau=0.7, seed=3, max_new_tokens=48))
    assert kwargs == {
        "n": 1,
        "temperature": 0.7,
        "top_p": 1.0,  # no nucleus truncation: KD data must come from p_τ itself
        "top_k": 0,  # vLLM's documented "disabled" value
        "min_p": 0.0,
        "seed": request_seed(3, "p-1", 0.7),
        "max_tokens": 48,
    }


def test_tau_zero_maps_to_vllm_greedy_and_seeds_differ_per_prompt_and_tau() -> None:
    assert to_sampling_kwargs(request(tau=0.0))["temperature"] == 0.0
    other_prompt = GenerationRequest("p-2", "x", 0.7, 3, 48)
    seeds = {
        to_sampling_kwargs(r)["seed"]
        for r in (request(0.7), request(1.0), other_prompt, request(0.7, seed=4))
    }
    assert len(seeds) == 4
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)


def test_llm_kwargs_from_the_spec() -> None:
    spec = VllmSpec(tensor_parallel_size=1, dtype="bfloat16", gpu_memory_utilization=0.8)
    assert llm_kwargs("meta-llama/Llama-2-13b-chat-hf", spec, seed=5) == {
        "model": "meta-llama/Llama-2-13b-chat-hf",
        "tensor_parallel_size": 1,
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.8,
        "seed": 5,
        "trust_remote_code": False,
    }


def test_llm_kwargs_tensor_parallel_max_len_and_dtype_fallback() -> None:
    spec = VllmSpec(tensor_parallel_size=2, max_model_len=4096)
    kwargs = llm_kwargs("/models/teacher", spec, seed=0, trust_remote_code=True, model_dtype="float16")
    assert kwargs["max_model_len"] == 4096
    assert kwargs["distributed_executor_backend"] == "ray"
    assert kwargs["dtype"] == "float16"  # teacher.vllm.dtype auto -> the model's dtype
    assert kwargs["trust_remote_code"] is True


def completion(finish_reason: str) -> SimpleNamespace:
    """The fields of a vLLM RequestOutput that specray reads."""
    return SimpleNamespace(
        prompt_token_ids=[1, 5, 9],
        outputs=[SimpleNamespace(text="5", token_ids=(42, 2), finish_reason=finish_reason)],
    )


def test_to_result_maps_a_request_output() -> None:
    result = to_result(request(tau=0.0), completion("stop"))
    assert result.prompt_token_ids == [1, 5, 9]
    assert result.response_token_ids == [42, 2]
    assert (result.response_text, result.finish_reason, result.tau, result.seed) == ("5", "stop", 0.0, 3)
    with pytest.raises(RuntimeError, match="'abort'"):
        to_result(request(), completion("abort"))


def test_missing_vllm_is_a_clear_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    with pytest.raises(ModelError, match=r"pip install 'specray\[vllm\]'"):
        VllmEngine("meta-llama/Llama-2-13b-chat-hf", VllmSpec())
    spec = TeacherSpec(engine="vllm", num_gpus=1, temperatures=[0.0])
    with pytest.raises(ModelError, match="teacher.engine=transformers"):
        make_engine(spec, "meta-llama/Llama-2-13b-chat-hf")


def test_the_driver_side_check_names_the_extra_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match=r"not installed; install it with pip install 'specray\[vllm\]'"):
        require_vllm()


@pytest.mark.parametrize("tau", [2.5, 5.0, 0.005])
def test_the_vllm_engine_refuses_temperatures_vllm_would_reject_or_change(tau: float) -> None:
    with pytest.raises(ValueError, match=r"temperatures \[.*\] cannot be sampled by the vllm engine"):
        TeacherSpec(engine="vllm", num_gpus=1, temperatures=[0.0, tau, 1.0])
    # the transformers engine samples any τ of the grid
    assert tau in TeacherSpec(engine="transformers", temperatures=[0.0, tau]).temperatures


def test_the_vllm_engine_keeps_greedy_and_the_edges_of_vllms_range() -> None:
    spec = TeacherSpec(engine="vllm", num_gpus=1, temperatures=[0.0, 0.01, 1.0, 2.0])
    assert spec.temperatures == [0.0, 0.01, 1.0, 2.0]


def test_a_spec_with_a_vllm_teacher_above_two_fails_naming_the_field() -> None:
    from specray.config import load_spec
    from specray.errors import SpecError

    vllm = ["teacher.engine=vllm", "teacher.num_gpus=1"]
    with pytest.raises(SpecError, match=r"teacher.*temperatures \[3\.0\].*vLLM takes 0 \(greedy\)"):
        load_spec(SMOKE, [*vllm, "teacher.temperatures=[0.0,3.0]"])
    assert load_spec(SMOKE, vllm).teacher.temperatures == [0.0, 1.0]


def test_max_model_len_below_prompt_plus_response_is_refused() -> None:
    from specray.config import load_spec
    from specray.errors import SpecError

    # smoke: data.max_prompt_tokens 256 (default) + teacher.max_new_tokens 24
    vllm = ["teacher.engine=vllm", "teacher.num_gpus=1"]
    with pytest.raises(SpecError, match=r"max_model_len 279 is below .* = 280"):
        load_spec(SMOKE, [*vllm, "teacher.vllm.max_model_len=279"])
    assert load_spec(SMOKE, [*vllm, "teacher.vllm.max_model_len=280"]).teacher.vllm.max_model_len == 280


def test_a_response_cut_at_the_context_limit_is_not_taken_for_max_new_tokens() -> None:
    completion = SimpleNamespace(text="ab", token_ids=[5, 6], finish_reason="length")
    output = SimpleNamespace(prompt_token_ids=[1, 2], outputs=[completion])
    with pytest.raises(RuntimeError, match="context limit after 2 of 48 tokens"):
        to_result(request(max_new_tokens=48), output)
    assert to_result(request(max_new_tokens=2), output).finish_reason == "length"


@pytest.mark.parametrize(
    ("capability", "rocm", "supported"),
    [
        ((8, 0), False, True),
        ((9, 0), False, True),
        ((10, 0), False, True),
        ((7, 5), False, False),
        (None, True, True),
        (None, False, False),
    ],
)
def test_batch_invariance_where_vllm_ships_its_kernels(
    capability: tuple[int, int] | None, rocm: bool, supported: bool
) -> None:
    from specray.teacher.vllm_engine import batch_invariant_supported

    assert batch_invariant_supported(capability, rocm) is supported


def test_no_batch_invariance_is_set_without_a_supported_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from specray.teacher.vllm_engine import enable_batch_invariance

    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert enable_batch_invariance(VllmSpec()) is False
    assert enable_batch_invariance(VllmSpec(batch_invariant=False)) is False
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda: (9, 0))
    assert enable_batch_invariance(VllmSpec()) is True
    import os

    assert os.environ["VLLM_BATCH_INVARIANT"] == "1"
