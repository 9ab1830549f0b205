"""The comparison harness refuses to time HF assisted generation that is not configured like our decoder."""

from __future__ import annotations

import pytest
import torch

from specray.models.loading import load_model, load_tokenizer
from specray.specdec.hf_compare import (
    Comparison,
    MisconfiguredComparison,
    assisted_kwargs,
    configure_assistant,
    expected_processors,
    verify_comparison,
)

GAMMA = 4


@pytest.fixture(scope="module")
def models(micro_zoo):
    tokenizer = load_tokenizer(str(micro_zoo.target))
    prompts = [tuple(tokenizer(text)["input_ids"]) for text in ("The cat sat on", "Write a short poem")]
    return load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft)), prompts, tokenizer


def comparison(models, tau: float, eos: int | None = None) -> Comparison:
    target, draft, prompts, tokenizer = models
    return Comparison(tau, GAMMA, 12, eos, tuple(prompts), (3, 4), tokenizer.pad_token_id)


@pytest.mark.parametrize("tau", [0.0, 0.6, 1.0])
def test_a_like_for_like_comparison_passes(models, tau: float) -> None:
    target, draft, _, _ = models
    setting = comparison(models, tau)
    configure_assistant(draft, setting)
    traces, ours = verify_comparison(target, draft, setting)
    for trace, decoded in zip(traces, ours, strict=True):
        assert len(trace.tokens) == len(decoded.tokens) == 12
        assert trace.target_processors == expected_processors(tau)
        # 12 tokens at γ = 4: every step drafts 4 until fewer than 5 tokens remain
        assert all(
            step.drafted == GAMMA for step in trace.steps if step.context + GAMMA < trace.prompt_length + 12
        )


def test_num_assistant_tokens_passed_only_to_generate_is_caught(models) -> None:
    """The old benchmark's call: HF ignores these two arguments and drafts its default 20 tokens."""
    target, draft, _, _ = models
    setting = comparison(models, 1.0)
    configure_assistant(draft, setting)
    draft.generation_config.num_assistant_tokens = None  # as in a freshly loaded draft
    draft.generation_config.num_assistant_tokens_schedule = None
    kwargs = assisted_kwargs(setting) | dict(
        num_assistant_tokens=GAMMA, num_assistant_tokens_schedule="constant"
    )
    with pytest.raises(MisconfiguredComparison, match=r"drafted \d+ tokens, expected γ=4"):
        verify_comparison(target, draft, setting, kwargs)


def test_temperature_in_generate_config_is_caught(models) -> None:
    """temperature=τ reaches the draft twice (the target's warper and its own): it samples at τ²."""
    target, draft, _, _ = models
    setting = comparison(models, 0.6)
    configure_assistant(draft, setting)
    kwargs = assisted_kwargs(setting)
    kwargs.pop("logits_processor")
    kwargs["temperature"] = 0.6
    with pytest.raises(MisconfiguredComparison) as raised:
        verify_comparison(target, draft, setting, kwargs)
    message = str(raised.value)
    assert "('TemperatureLogitsWarper', 0.6), ('TemperatureLogitsWarper', 0.6)" in message
    assert "draft scores differ from its logits / τ" in message
    assert "target logits processors" not in message  # the target itself is right


def test_top_k_none_is_caught(models) -> None:
    """top_k=None is refilled with the default 50 in the draft's generate() only."""
    target, draft, _, _ = models
    setting = comparison(models, 1.0)
    configure_assistant(draft, setting)
    kwargs = assisted_kwargs(setting) | dict(top_k=None)
    with pytest.raises(MisconfiguredComparison, match="draft logits processors.*TopKLogitsWarper"):
        verify_comparison(target, draft, setting, kwargs)


def test_settings_must_pair_prompts_with_seeds() -> None:
    with pytest.raises(ValueError, match="2 prompts but 1 seeds"):
        Comparison(1.0, 4, 8, None, ((1, 2), (3, 4)), (0,), 0)


def test_the_instrumentation_is_removed_after_a_run(models) -> None:
    target, draft, _, _ = models
    setting = comparison(models, 1.0)
    configure_assistant(draft, setting)
    verify_comparison(target, draft, setting)
    assert "_get_logits_processor" not in vars(target) and "_get_logits_processor" not in vars(draft)
    assert "_get_candidate_generator" not in vars(target)
    assert torch.is_tensor(target.lm_head.weight)
