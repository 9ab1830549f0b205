"""Our decoder against transformers' assisted generation, like for like, checked before anything is timed.

A comparison is one `Comparison` (prompts, seeds, τ, γ, length, EOS) handed to both sides. transformers 5.x
has three traps that silently make its side do something else (read in transformers 5.23,
`generation/candidate_generator.py` and `generation/utils.py`):

1. `num_assistant_tokens`, `num_assistant_tokens_schedule` and `assistant_confidence_threshold` are read from
   the *assistant's* `generation_config` (`AssistedCandidateGenerator.__init__` deep-copies it); passed to
   `generate()` they change nothing, and the draft proposes its default 20 tokens per step (capped by the
   length limit), stopping early where its confidence falls under 0.4.
2. The target's prepared logits processors, its `TemperatureLogitsWarper` included, are handed to the
   assistant's own `generate()`; its `_get_logits_processor` merges them in and then appends the warpers its
   (copied) generation config asks for, so with `temperature=τ` the draft samples at τ². Here the config keeps
   `temperature=1.0` and the warper is passed once, as a custom processor: each side then holds exactly one.
3. The assistant's `generate()` refills every `None` of the config it is given from the draft's own
   `generation_config` and then the global defaults: `top_k=None` becomes 50 on the draft side only, and an
   `eos_token_id=None` meant to decode to the length limit becomes the draft's EOS. `top_k=0, top_p=1.0` are
   passed explicitly and the draft's `eos_token_id` is set like the target's.

`verify_comparison` runs every prompt once through both decoders, instrumented, and raises
`MisconfiguredComparison` unless: every verification step drafted γ tokens (fewer only at the length limit or
when the draft proposed EOS), the logits processors on each side are exactly the temperature warper at τ
(none at τ ∈ {0, 1}), the draft's scores equal its logits / τ, and every decode has the requested length.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from transformers import LogitsProcessorList, PreTrainedModel, TemperatureLogitsWarper

from specray.specdec.decoder import Decoded, DecodeStats, speculative_decode

if TYPE_CHECKING:
    from specray.models.loading import CausalLM

Processors = tuple[tuple[str, float | None], ...]  # (class name, temperature) per logits processor


class MisconfiguredComparison(RuntimeError):
    """The two sides of a comparison would not do the same work; nothing was timed."""


@dataclass(frozen=True)
class Comparison:
    """Everything both decoders are given; one object, so the two sides cannot drift apart."""

    tau: float
    gamma: int
    max_new_tokens: int
    eos_token_id: int | None  # None: both decode exactly max_new_tokens
    prompts: tuple[tuple[int, ...], ...]
    seeds: tuple[int, ...]
    pad_token_id: int

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.seeds):
            raise ValueError(f"{len(self.prompts)} prompts but {len(self.seeds)} seeds")


@dataclass(frozen=True)
class AssistedStep:
    """One verification step of HF assisted generation, as the instrumented candidate generator saw it."""

    context: int  # prompt + emitted tokens before the step
    drafted: int
    accepted: int  # HF's n_matches after its EOS / length cut
    last_drafted: int | None


@dataclass(frozen=True)
class AssistedTrace:
    """What one `generate(assistant_model=...)` call did."""

    tokens: tuple[int, ...]
    prompt_length: int
    steps: tuple[AssistedStep, ...]
    candidate_generator: str
    target_processors: Processors
    draft_processors: tuple[Processors, ...]  # one entry per call of the draft's generate()
    first_candidates: tuple[Tensor, Tensor] | None  # ids [1, context + drafted], scores [1, drafted, vocab]

    @property
    def stats(self) -> DecodeStats:
        """Counted like our decoder: tested = accepted + 1 unless every drafted token was accepted."""
        return DecodeStats(
            drafted=sum(s.drafted for s in self.steps),
            tested=sum(min(s.accepted + 1, s.drafted) for s in self.steps),
            accepted=sum(s.accepted for s in self.steps),
            target_calls=len(self.steps),
            emitted=len(self.tokens),
        )


def configure_assistant(draft: PreTrainedModel, comparison: Comparison) -> None:
    """Settings HF reads from the draft's own generation_config (traps 1 and 3)."""
    config = draft.generation_config
    config.num_assistant_tokens = comparison.gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0  # no early stop of drafting: γ tokens every step
    config.eos_token_id = comparison.eos_token_id


def assisted_kwargs(comparison: Comparison) -> dict[str, Any]:
    """`generate()` arguments that make HF sample the target and the draft at τ exactly once (trap 2)."""
    kwargs: dict[str, Any] = dict(
        max_new_tokens=comparison.max_new_tokens,
        eos_token_id=comparison.eos_token_id,
        pad_token_id=comparison.pad_token_id,
        do_sample=comparison.tau > 0,
    )
    if comparison.tau > 0:
        kwargs |= dict(temperature=1.0, top_k=0, top_p=1.0)
        if comparison.tau != 1.0:
            kwargs["logits_processor"] = LogitsProcessorList([TemperatureLogitsWarper(comparison.tau)])
    return kwargs


def expected_processors(tau: float) -> Processors:
    """Only the temperature warper at τ; at τ = 0 (greedy) and τ = 1 no processor at all."""
    return () if tau in (0.0, 1.0) else (("TemperatureLogitsWarper", tau),)


def _describe(processors) -> Processors:
    return tuple((type(p).__name__, getattr(p, "temperature", None)) for p in processors)


class _Recorder:
    """Collects what the wrapped transformers internals saw during one generate() call."""

    def __init__(self) -> None:
        self.steps: list[AssistedStep] = []
        self.pending: tuple[int, int, int | None] | None = None
        self.generator = ""
        self.target: list[Processors] = []
        self.draft: list[Processors] = []
        self.first: tuple[Tensor, Tensor] | None = None

    def wrap_processors(self, model: PreTrainedModel, sink: list[Processors]) -> None:
        patched: Any = model  # generate's internals are no part of the model's typed interface
        original = patched._get_logits_processor

        def recorded(*args, **kwargs):
            processors = original(*args, **kwargs)
            sink.append(_describe(processors))
            return processors

        patched._get_logits_processor = recorded

    def wrap_candidate_generator(self, target: PreTrainedModel) -> None:
        patched: Any = target  # as in wrap_processors
        original = patched._get_candidate_generator

        def recorded(*args, **kwargs):
            generator = original(*args, **kwargs)
            self.generator = type(generator).__name__
            self._wrap_steps(generator)
            return generator

        patched._get_candidate_generator = recorded

    def _wrap_steps(self, generator) -> None:
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def candidates(input_ids, *args, **kwargs):
            ids, scores = get_candidates(input_ids, *args, **kwargs)
            drafted = ids.shape[1] - input_ids.shape[1]
            self.pending = (input_ids.shape[1], drafted, int(ids[0, -1]) if drafted else None)
            if self.first is None and scores is not None:
                self.first = (ids.detach().cpu(), scores.detach().float().cpu())
            return ids, scores

        def strategy(input_ids, scores, num_matches):
            assert self.pending is not None, "HF updates its strategy only after drafting candidates"
            context, drafted, last = self.pending
            self.steps.append(AssistedStep(context, drafted, int(num_matches), last))
            return update(input_ids, scores, num_matches)

        generator.get_candidates, generator.update_candidate_strategy = candidates, strategy


@contextmanager
def _instrumented(target: PreTrainedModel, draft: PreTrainedModel) -> Iterator[_Recorder]:
    """Wrap, on these two instances only, the internals whose inputs and outputs the checks need."""
    recorder = _Recorder()
    recorder.wrap_processors(target, recorder.target)
    recorder.wrap_processors(draft, recorder.draft)
    recorder.wrap_candidate_generator(target)
    try:
        yield recorder
    finally:  # back to the class's methods
        del target._get_logits_processor, target._get_candidate_generator, draft._get_logits_processor


def run_assisted(
    target: CausalLM, draft: PreTrainedModel, prompt: list[int], seed: int, kwargs: dict[str, Any]
) -> tuple[list[int], float]:
    """One `generate(assistant_model=draft)` call; returns the new tokens and its wall time."""
    torch.manual_seed(seed)  # HF samples from the global generator (and seeds CUDA's with it)
    input_ids = torch.tensor([prompt], device=target.device)
    started = time.perf_counter()
    out = target.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft, **kwargs
    )
    tokens = out[0, len(prompt) :].tolist()  # .tolist() waits for the device
    return tokens, time.perf_counter() - started


def trace_assisted(
    target: CausalLM, draft: PreTrainedModel, prompt: list[int], seed: int, kwargs: dict[str, Any]
) -> AssistedTrace:
    """`run_assisted` with the candidate generator and both processor lists recorded."""
    with _instrumented(target, draft) as rec:
        tokens, _ = run_assisted(target, draft, prompt, seed, kwargs)
    return AssistedTrace(
        tokens=tuple(tokens),
        prompt_length=len(prompt),
        steps=tuple(rec.steps),
        candidate_generator=rec.generator,
        target_processors=rec.target[0] if rec.target else (),
        draft_processors=tuple(rec.draft),
        first_candidates=rec.first,
    )


def run_ours(
    target: CausalLM, draft: PreTrainedModel, prompt: list[int], seed: int, comparison: Comparison
) -> Decoded:
    """Our decoder on the same prompt, seed and settings; its generator lives on the models' device."""
    generator = torch.Generator(device=target.device).manual_seed(seed)
    c = comparison
    return speculative_decode(
        target, draft, prompt, c.tau, c.gamma, c.max_new_tokens, c.eos_token_id, generator
    )


def _length_problem(tokens: tuple[int, ...] | list[int], comparison: Comparison) -> str | None:
    n, eos = len(tokens), comparison.eos_token_id
    if n == comparison.max_new_tokens or (n < comparison.max_new_tokens and n and tokens[-1] == eos):
        return None
    return f"emitted {n} tokens, expected {comparison.max_new_tokens} (or fewer ending at EOS {eos})"


def _step_problems(trace: AssistedTrace, comparison: Comparison) -> list[str]:
    limit = trace.prompt_length + comparison.max_new_tokens
    problems = []
    for i, step in enumerate(trace.steps):
        allowed = max(0, min(comparison.gamma, limit - step.context - 1))  # HF's and our rule at the limit
        at_eos = step.last_drafted is not None and step.last_drafted == comparison.eos_token_id
        if step.drafted != allowed and not (at_eos and step.drafted < allowed):
            problems.append(
                f"verification step {i} drafted {step.drafted} tokens, expected γ={comparison.gamma}"
                f" ({allowed} allowed by the length limit, fewer only after a drafted EOS)"
            )
    return problems[:3]


def check_assisted(trace: AssistedTrace, comparison: Comparison) -> list[str]:
    """Every way this HF run differs from the comparison; empty when it is like for like."""
    problems = _step_problems(trace, comparison)
    if trace.candidate_generator != "AssistedCandidateGenerator":
        problems.append(f"candidate generator {trace.candidate_generator!r}, not AssistedCandidateGenerator")
    expected = expected_processors(comparison.tau)
    if trace.target_processors != expected:
        problems.append(f"target logits processors {trace.target_processors}, expected {expected}")
    for processors in sorted(set(trace.draft_processors) - {expected}):
        problems.append(f"draft logits processors {processors}, expected {expected}")
    if length := _length_problem(trace.tokens, comparison):
        problems.append(f"HF {length}")
    return problems


@torch.no_grad()
def check_draft_scores(draft: PreTrainedModel, trace: AssistedTrace, tau: float) -> list[str]:
    """The draft scores HF verified its first drafted tokens with are the logits / τ (at τ=0 the logits)."""
    if trace.first_candidates is None:
        return []
    ids, scores = trace.first_candidates
    drafted = scores.shape[1]
    logits = (
        draft(input_ids=ids.to(draft.device)).logits[0, -drafted - 1 : -1].float().cpu()
    )  # [drafted, vocab]
    expected = logits / tau if tau > 0 else logits
    error = float((scores[0] - expected).abs().max())
    # an uncached pass vs HF's cached steps: fp32 agrees to ~1e-6, bf16 to its 8 mantissa bits; the traps
    # are far larger (τ² at τ = 0.6 scales the scores by 1/0.6, top-k puts -inf in them)
    tolerance = 1e-3 if draft.dtype == torch.float32 else 3e-2
    if not error <= tolerance * max(1.0, float(expected.abs().max())):
        return [f"draft scores differ from its logits / τ by up to {error:.3g} (τ={tau})"]
    return []


def check_ours(decoded: Decoded, comparison: Comparison) -> list[str]:
    stats, problems = decoded.stats, []
    if stats.drafted > comparison.gamma * stats.target_calls:
        problems.append(
            f"ours drafted {stats.drafted} tokens in {stats.target_calls} steps at γ={comparison.gamma}"
        )
    if length := _length_problem(decoded.tokens, comparison):
        problems.append(f"ours {length}")
    return problems


def verify_comparison(
    target: CausalLM,
    draft: PreTrainedModel,
    comparison: Comparison,
    kwargs: dict[str, Any] | None = None,
) -> tuple[list[AssistedTrace], list[Decoded]]:
    """Run every prompt once through both sides (untimed; doubles as warm-up) and check they match.

    `kwargs` are the `generate()` arguments (default `assisted_kwargs(comparison)`; the draft must have been
    through `configure_assistant`). Raises MisconfiguredComparison with every problem found.
    """
    kwargs = assisted_kwargs(comparison) if kwargs is None else kwargs
    traces, ours, problems = [], [], []
    for i, (prompt, seed) in enumerate(zip(comparison.prompts, comparison.seeds, strict=True)):
        trace = trace_assisted(target, draft, list(prompt), seed, kwargs)
        decoded = run_ours(target, draft, list(prompt), seed, comparison)
        found = check_assisted(trace, comparison) + check_ours(decoded, comparison)
        if i == 0:  # one forward pass of the draft settles it; every prompt would only cost time
            found += check_draft_scores(draft, trace, comparison.tau)
        problems += [f"prompt {i}: {p}" for p in found]
        traces.append(trace)
        ours.append(decoded)
    if problems:
        raise MisconfiguredComparison(
            f"not timed: HF assisted generation is not configured like our decoder (τ={comparison.tau}, "
            f"γ={comparison.gamma}):\n  " + "\n  ".join(problems[:12])
        )
    return traces, ours
