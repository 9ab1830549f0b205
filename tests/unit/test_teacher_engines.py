"""The transformers engine and its batched sampler: padding, KV cache, seeds, stop reasons."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specray.config import TeacherSpec
from specray.data.synthetic import synthetic_corpus
from specray.data.templates import format_prompt
from specray.sampling import SHARED_PREFIX_MIN, left_pad, sample_batch
from specray.seeds import request_seed
from specray.teacher.engines import TransformersEngine, make_engine
from specray.teacher.generation import GenerationRequest

MAX_NEW = 10


@pytest.fixture(scope="module")
def engine(micro_zoo) -> TransformersEngine:
    return TransformersEngine(str(micro_zoo.target), batch_size=3)


@pytest.fixture(scope="module")
def prompts() -> list[tuple[str, str]]:
    """(id, prompt) pairs of clearly different token lengths, so batches need padding."""
    examples = synthetic_corpus(6, seed=11)
    pairs = [(e.id, format_prompt(e.instruction, e.input)) for e in examples]
    pairs.append(("short", "Hi"))
    return pairs


def make_requests(
    prompts, tau: float, seed: int = 0, max_new_tokens: int = MAX_NEW
) -> list[GenerationRequest]:
    return [GenerationRequest(pid, text, tau, seed, max_new_tokens) for pid, text in prompts]


def tokens(results) -> list[list[int]]:
    return [r.response_token_ids for r in results]


def reference_greedy(model, prompt_ids: list[int], steps: int) -> list[int]:
    """Greedy decoding the slow, obviously-correct way: no padding, no cache, full forward every step."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]


def test_greedy_matches_an_unpadded_uncached_reference(engine, prompts) -> None:
    batched = engine.generate(make_requests(prompts, tau=0.0))
    assert len({len(r.prompt_token_ids) for r in batched}) > 3  # the batch really was padded
    eos = engine.eos_token_ids
    for result in batched:
        expected = reference_greedy(engine.model, result.prompt_token_ids, MAX_NEW)
        if eos & set(expected):  # the engine stops at (and keeps) the first EOS
            expected = expected[: min(expected.index(e) for e in eos if e in expected) + 1]
        assert result.response_token_ids == expected


def test_a_prompt_alone_equals_the_same_prompt_left_padded_in_a_batch(engine, prompts) -> None:
    requests = make_requests(prompts, tau=0.0)
    shortest = min(requests, key=lambda r: len(r.prompt))
    in_batch = next(r for r in engine.generate(requests) if r.prompt_id == shortest.prompt_id)
    alone = engine.generate([shortest])[0]
    assert alone.response_token_ids == in_batch.response_token_ids
    assert alone.prompt_token_ids == in_batch.prompt_token_ids


def test_greedy_is_deterministic(engine, prompts) -> None:
    assert tokens(engine.generate(make_requests(prompts, 0.0))) == tokens(
        engine.generate(make_requests(prompts, 0.0))
    )
    # the seed plays no part in greedy decoding
    assert tokens(engine.generate(make_requests(prompts, 0.0, seed=5))) == tokens(
        engine.generate(make_requests(prompts, 0.0))
    )


def test_sampling_depends_on_the_seed_only(engine, prompts) -> None:
    first = tokens(engine.generate(make_requests(prompts, tau=1.0, seed=1)))
    assert first == tokens(engine.generate(make_requests(prompts, tau=1.0, seed=1)))
    assert first != tokens(engine.generate(make_requests(prompts, tau=1.0, seed=2)))


def test_batch_composition_does_not_change_a_request(engine, prompts) -> None:
    requests = make_requests(prompts, tau=1.0, seed=3)
    together = {r.prompt_id: r.response_token_ids for r in engine.generate(requests)}
    alone = {r.prompt_id: engine.generate([r])[0].response_token_ids for r in requests}
    mixed = requests[::-1] + make_requests(prompts[:2], tau=0.5, seed=9)  # other order, other τ beside
    reordered = {r.prompt_id: r.response_token_ids for r in engine.generate(mixed) if r.tau == 1.0}
    assert together == alone == reordered


def test_temperatures_draw_independent_streams(engine, prompts) -> None:
    seeds = {request_seed(0, pid, tau) for pid, _ in prompts for tau in (0.5, 1.0)}
    assert len(seeds) == 2 * len(prompts)
    assert request_seed(7, "synthetic-0-1", 0.5) == request_seed(7, "synthetic-0-1", 0.5)
    assert 0 <= request_seed(7, "synthetic-0-1", 0.5) < 2**63


def test_finish_reasons_stop_keeps_eos_and_length_caps(engine, prompts) -> None:
    prompt_ids = engine.tokenizer([p for _, p in prompts[:2]])["input_ids"]
    greedy = sample_batch(engine.model, prompt_ids, [0.0, 0.0], [torch.Generator()] * 2, 4, set(), 0)
    assert [s.finish_reason for s in greedy] == ["length", "length"]
    assert [len(s.token_ids) for s in greedy] == [4, 4]
    # declare row 0's second greedy token an EOS id: row 0 stops there (EOS kept), row 1 runs to its limit
    stop_id = greedy[0].token_ids[1]
    stopped = sample_batch(
        engine.model, prompt_ids, [0.0, 0.0], [torch.Generator()] * 2, [4, 3], {stop_id}, 0
    )
    assert stopped[0].finish_reason == "stop"
    assert stopped[0].token_ids[-1] == stop_id
    assert stopped[0].token_ids == greedy[0].token_ids[: greedy[0].token_ids.index(stop_id) + 1]
    if stop_id not in greedy[1].token_ids[:3]:
        assert stopped[1].finish_reason == "length" and stopped[1].token_ids == greedy[1].token_ids[:3]


def test_engine_reports_stop_with_the_real_eos(engine, prompts) -> None:
    results = engine.generate(make_requests(prompts, tau=1.0, max_new_tokens=40))
    for result in results:
        ended_on_eos = result.response_token_ids[-1] in engine.eos_token_ids
        assert result.finish_reason == ("stop" if ended_on_eos else "length")
        assert result.finish_reason == "stop" or len(result.response_token_ids) == 40
        assert result.response_text == engine.tokenizer.decode(
            result.response_token_ids, skip_special_tokens=True
        )


@pytest.mark.parametrize("tau", [0.0, 1.0])
def test_kept_logits_equal_an_unpadded_uncached_pass(engine, prompts, tau) -> None:
    """Shared-prefix prefill, left padding, the KV cache and rows leaving the batch as they finish change
    no row's logits: each equals a plain forward pass over that row's prompt + response alone."""
    texts = [text for _, text in prompts if text.startswith("Below")]
    prompt_ids = engine.tokenizer(texts)["input_ids"]
    shared = next(i for i in range(min(map(len, prompt_ids))) if len({p[i] for p in prompt_ids}) > 1)
    assert shared >= SHARED_PREFIX_MIN  # the template is run once and its cache shared
    prompt_ids.append(prompt_ids[0][: shared + 1])  # a prompt that is the prefix plus one token
    generators = [torch.Generator().manual_seed(i) for i in range(len(prompt_ids))]
    common = engine.tokenizer(" the")["input_ids"][
        -1
    ]  # a frequent token as "EOS": rows end at different steps
    samples = sample_batch(
        engine.model, prompt_ids, [tau] * len(prompt_ids), generators, 8, {common}, 0, keep_logits=True
    )
    assert len({len(s.token_ids) for s in samples}) > 1
    for prompt, sample in zip(prompt_ids, samples, strict=True):
        with torch.no_grad():
            full = engine.model(input_ids=torch.tensor([prompt + sample.token_ids])).logits[0]
        expected = full[len(prompt) - 1 : len(prompt) - 1 + len(sample.token_ids)]
        assert sample.logits.shape == expected.shape
        assert torch.allclose(sample.logits, expected, atol=1e-4)


def test_left_pad_puts_every_prompt_against_the_right_edge() -> None:
    input_ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    assert input_ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_copies_of_a_prompt_sample_as_the_prompt_listed_that_often(engine, prompts) -> None:
    """`copies` runs each prompt once and shares its cache: the same tokens and logits as listing it."""
    prompt_ids = engine.tokenizer([text for _, text in prompts])["input_ids"]
    taus = [0.0, 0.7, 1.5] * len(prompt_ids)

    def generators() -> list[torch.Generator]:
        return [torch.Generator().manual_seed(row) for row in range(len(taus))]

    listed = [p for p in prompt_ids for _ in range(3)]
    expected = sample_batch(engine.model, listed, taus, generators(), MAX_NEW, set(), 0, keep_logits=True)
    copied = sample_batch(engine.model, prompt_ids, taus, generators(), MAX_NEW, set(), 0, True, copies=3)
    assert [s.token_ids for s in copied] == [s.token_ids for s in expected]
    assert len({tuple(s.token_ids) for s in copied[:3]}) > 1  # the copies draw at their own τ
    for got, want in zip(copied, expected, strict=True):
        assert torch.allclose(got.logits, want.logits, atol=1e-4)


def test_sample_batch_checks_lengths(engine) -> None:
    with pytest.raises(ValueError, match="same length"):
        sample_batch(engine.model, [[1, 2]], [0.0, 1.0], [torch.Generator()], 3, set(), 0)


def test_unknown_engine_lists_the_valid_ones(micro_zoo) -> None:
    spec = TeacherSpec.model_construct(**(TeacherSpec(temperatures=[0.0]).model_dump() | {"engine": "tgi"}))
    with pytest.raises(ValueError, match="unknown teacher engine 'tgi'; valid: transformers, vllm"):
        make_engine(spec, str(micro_zoo.target))


def test_engines_and_shards_import_no_ray_or_vllm() -> None:
    # distillation reuses sample_batch and reads shards in plain processes; only teacher/pool touches Ray
    script = (
        "import sys, specray.sampling, specray.teacher.engines, specray.teacher.vllm_engine\n"
        "import specray.data.shards\n"
        "print(','.join(m for m in ('ray', 'vllm', 'mlflow') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""
