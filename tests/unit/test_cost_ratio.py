"""The cost ratio c: one value with a bootstrap 95% interval, measured until the interval is tight."""

from __future__ import annotations

import json

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specray.specdec.cost import measure_cost_ratio, ratio_interval
from specray.specdec.records import CostRatio


def _llama(layers: int, hidden: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def test_interval_covers_the_true_ratio_and_shrinks_with_more_steps() -> None:
    rng = np.random.default_rng(0)
    target = rng.lognormal(np.log(2e-3), 0.2, 400)
    draft = target * 0.25 * rng.lognormal(0.0, 0.05, 400)  # paired: load moves both sides
    value, half = ratio_interval(draft, target)
    assert abs(value - 0.25) <= half
    _, half_few = ratio_interval(draft[:40], target[:40])
    assert half < half_few


def test_a_smaller_draft_costs_less_and_the_measurement_reports_its_precision() -> None:
    target, draft = _llama(6, 128), _llama(1, 16)
    measured = measure_cost_ratio(target, draft, list(range(1, 12)), rel_precision=0.5, max_pairs=200)
    assert measured.source == "measured" and measured.device == "cpu"
    assert 0.0 < measured.value < 1.0
    assert measured.steps >= 40 and measured.ci95 > 0.0
    assert "±" in measured.describe() and f"{measured.steps} interleaved" in measured.describe()


def test_the_json_round_trip_reads_a_file_written_before_the_record_had_methods() -> None:
    old = {"value": 0.25, "ci95": 0.005, "steps": 80, "source": "measured", "device": "cpu", "key": "abc"}
    cost = CostRatio.from_json(json.loads(json.dumps(old)))
    assert cost == CostRatio(0.25, 0.005, 80, "measured", "cpu", "abc") and cost.to_json() == old
    fixed = CostRatio.from_json({"value": 0.1, "ci95": 0.0, "steps": 0, "source": "fixed"})  # no device, key
    assert fixed.describe() == "c = 0.1 (fixed by eval.draft_cost_ratio)"
