"""A teacher engine batch on CUDA: `TransformersEngine` on the device a replica's resources give it, requests
of mixed τ in one batch, each drawing from its own CUDA generator."""

from __future__ import annotations

from specray.devices import Resources
from specray.teacher.engines import TransformersEngine
from specray.teacher.generation import GenerationRequest


def test_a_teacher_engine_batch_on_cuda(pair_dirs) -> None:
    device = Resources(1.0, 1.0).torch_device()  # a replica with teacher.num_gpus: 1
    engine = TransformersEngine(str(pair_dirs.target), "float32", batch_size=4, device=str(device))
    assert next(engine.model.parameters()).device.type == "cuda"
    prompts = [" ".join(f"w{100 + 37 * i + j}" for j in range(3 + i % 5)) for i in range(6)]
    requests = [
        GenerationRequest(f"p{i}", prompt, tau, seed=7, max_new_tokens=20)
        for i, prompt in enumerate(prompts)
        for tau in (0.0, 0.7, 1.0)
    ]
    results = engine.generate(requests)
    assert [(r.prompt_id, r.tau) for r in results] == [(q.prompt_id, q.tau) for q in requests]
    for result in results:
        assert 1 <= len(result.response_token_ids) <= 20
        assert result.finish_reason == ("stop" if len(result.response_token_ids) < 20 else "length")
        assert result.prompt_token_ids[0] == 1  # <s>, then the prompt's words
    # greedy rows do not depend on their batch: the same request alone gives the same tokens
    alone = engine.generate([requests[0]])[0]
    assert alone.response_token_ids == results[0].response_token_ids
    again = engine.generate(requests)  # per-request CUDA generators: the same seeds, the same rows
    assert [r.response_token_ids for r in again] == [r.response_token_ids for r in results]
