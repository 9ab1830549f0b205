"""The step costs: the batch-aware cost model's formulas, its measurement, and its JSON record."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specray.ops import speedup_model
from specray.specdec.cost import mean_interval, measure_step_costs
from specray.specdec.records import CostTerms, StepCosts, Timing


def _llama(layers: int, hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).eval()


def _costs(t1: float, verify: float, draft: float, prefill: tuple[float, float] = (0.0, 0.0)) -> StepCosts:
    one = {1: {1: Timing(t1, 0.0), 5: Timing(verify, 0.0)}}
    zero = Timing(0.0, 0.0)
    return StepCosts(
        one,
        {1: Timing(draft, 0.0)},
        "measured",
        prefill_target={1: Timing(prefill[0], 0.0) if prefill[0] else zero},
        prefill_draft={1: Timing(prefill[1], 0.0) if prefill[1] else zero},
    )


@pytest.mark.parametrize("c", [0.0, 0.05, 0.25, 1.0])
@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_with_verification_as_one_step_the_model_is_the_papers_formula(c: float, gamma: int) -> None:
    costs = StepCosts.fixed(c, gammas=[gamma])
    for e in (1.0, 1.7, gamma + 1.0):
        assert costs.speedup(e, gamma) == pytest.approx(speedup_model(e, c, gamma))
        # the same with measured-looking timings where T_t(1, γ+1) = T_t(1, 1), d = γ and no prefill
        timed = StepCosts(
            {1: {1: Timing(2e-3, 0.0), gamma + 1: Timing(2e-3, 0.0)}}, {1: Timing(c * 2e-3, 0.0)}, "measured"
        )
        assert timed.speedup(e, gamma, drafted_per_step=gamma) == pytest.approx(speedup_model(e, c, gamma))


def test_a_costlier_verification_and_the_prefills_lower_the_speedup_as_the_decoders_spend_them() -> None:
    costs = _costs(t1=2.0, verify=3.0, draft=0.5, prefill=(6.0, 1.5))
    # per step: E·T1 / (d·T_d + T1 + (d/γ)(T_v − T1)) with E = 3, d = 4: 6 / (2 + 2 + 1)
    assert costs.speedup(3.0, 4) == pytest.approx(6.0 / 5.0)
    # fewer drafts per step (EOS, the length limit) draft and verify less
    assert costs.speedup(3.0, 4, drafted_per_step=2.0) == pytest.approx(6.0 / (1 + 2 + 0.5))
    # whole decodes of L = 12 tokens: (12·2 + 6) / (4 steps · 5 + 6 + 1.5)
    assert costs.speedup(3.0, 4, tokens_per_decode=12.0) == pytest.approx(30.0 / 27.5)
    terms = costs.terms(4)
    assert terms == CostTerms(2.0, 0.5 + 0.25, 6.0, 1.5)
    assert terms.speedup(24.0, 8.0, 32.0, 2) == pytest.approx(costs.speedup(3.0, 4, tokens_per_decode=12.0))


def test_the_interval_grows_with_each_timing_and_with_e() -> None:
    tight = _costs(2.0, 3.0, 0.5)
    loose = StepCosts({1: {1: Timing(2.0, 0.1), 5: Timing(3.0, 0.1)}}, {1: Timing(0.5, 0.05)}, "measured")
    assert tight.speedup_ci95(3.0, 0.0, 4) == 0.0
    assert 0.0 < tight.speedup_ci95(3.0, 0.1, 4) < loose.speedup_ci95(3.0, 0.1, 4)


def test_mean_interval_is_a_t_interval() -> None:
    timing = mean_interval([1.0, 2.0, 3.0])
    assert timing.seconds == 2.0 and timing.ci95 == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert math.isinf(mean_interval([1.0]).ci95)


def test_measured_costs_cover_every_batch_size_and_gamma() -> None:
    target, draft = _llama(4, 128), _llama(1, 16)
    prompts = [list(range(1, 12)), list(range(3, 20)), list(range(5, 9))]
    costs = measure_step_costs(target, draft, prompts, [1, 3], [2, 3], steps=4, max_rounds=6, max_seconds=600)
    assert costs.source == "measured" and costs.device == "cpu" and costs.covers([2, 3], [1, 3])
    assert costs.batch_sizes == [1, 3] and costs.gammas == [2, 3] and costs.rounds >= 5
    # Which of two models this small is faster depends on the machine's load, so only the arithmetic is
    # checked here; benchmarks/ measures the ratios themselves.
    assert costs.cost_ratio(1) == costs.draft[1].seconds / costs.target[1][1].seconds > 0.0
    assert all(t.seconds > 0 and math.isfinite(t.ci95) for ks in costs.target.values() for t in ks.values())
    assert "interleaved rounds" in costs.describe() and "B = 1, 3" in costs.describe()


def test_the_json_round_trip_keeps_every_timing() -> None:
    costs = _costs(2.0, 3.0, 0.5, prefill=(6.0, 1.5))
    back = StepCosts.from_json(json.loads(json.dumps(costs.to_json())))
    assert back == costs and back.fingerprint() == costs.fingerprint()
    assert StepCosts.fixed(0.1).describe() == (
        "c = 0.1 (fixed by eval.draft_cost_ratio; verification costs one target step)"
    )
    moved = _costs(2.0, 3.1, 0.5, prefill=(6.0, 1.5))
    assert moved.fingerprint() != costs.fingerprint()
