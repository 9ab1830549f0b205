"""A curve point's JSON form is the one curves.json, checkpoints and MLflow's records have always held; its
note and line in the progress display."""

from __future__ import annotations

import json

import pytest

from specray.distill.curves import (
    CurvePoint,
    PromptSums,
    curve_line,
    curve_note,
    curves_from_json,
    curves_to_json,
)

# a curves.json as the loop wrote it before curve points were typed: step 0 without training figures
OLD_CURVES_JSON = """[
 {"step": 0, "acceptance_rate/tau_dec=0.6": 0.41, "per_prompt_tokens/tau_dec=0.6": [3, 5],
  "per_prompt_beta_sum/tau_dec=0.6": [1.2, 2.08], "acceptance_rate/tau_dec=1": 0.35,
  "per_prompt_tokens/tau_dec=1": [4, 4], "per_prompt_beta_sum/tau_dec=1": [1.5, 1.3]},
 {"step": 20, "loss": 1.5, "tokens_per_s": 5210.5, "seconds_per_step": 0.25, "lr": 0.0003,
  "acceptance_rate/tau_dec=0.6": 0.52, "per_prompt_tokens/tau_dec=0.6": [3, 5],
  "per_prompt_beta_sum/tau_dec=0.6": [1.5, 2.66], "acceptance_rate/tau_dec=1": 0.44,
  "per_prompt_tokens/tau_dec=1": [4, 4], "per_prompt_beta_sum/tau_dec=1": [1.8, 1.72]}
]"""


def test_an_old_curves_file_reads_as_typed_points_keyed_by_float_tau() -> None:
    first, second = curves_from_json(json.loads(OLD_CURVES_JSON))
    assert first.step == 0 and first.loss is None and first.lr is None
    assert first.acceptance == {0.6: 0.41, 1.0: 0.35}
    assert first.per_prompt[0.6] == PromptSums((3, 5), (1.2, 2.08))
    assert (second.step, second.loss, second.tokens_per_s, second.seconds_per_step) == (20, 1.5, 5210.5, 0.25)
    assert second.lr == 0.0003 and second.acceptance[1.0] == 0.44


def test_the_json_round_trip_keeps_keys_values_and_their_order() -> None:
    rows = json.loads(OLD_CURVES_JSON)
    points = curves_from_json(rows)
    assert curves_to_json(points) == rows
    assert [list(row) for row in curves_to_json(points)] == [list(row) for row in rows]  # same key order
    assert json.dumps(curves_to_json(points), indent=1) == json.dumps(rows, indent=1)  # same file
    assert curves_from_json(json.loads(json.dumps(curves_to_json(points)))) == points


def test_a_point_without_probe_lists_or_training_figures_round_trips() -> None:
    point = CurvePoint(40, loss=2.0, tokens_per_s=10.0, acceptance={0.0: 0.9, 1.5: float("nan")})
    assert point.to_json() == {
        "step": 40,
        "loss": 2.0,
        "tokens_per_s": 10.0,
        "acceptance_rate/tau_dec=0": 0.9,
        "acceptance_rate/tau_dec=1.5": pytest.approx(float("nan"), nan_ok=True),
    }
    back = CurvePoint.from_json(point.to_json())
    assert back.step == 40 and back.loss == 2.0 and back.per_prompt == {} and back.acceptance[0.0] == 0.9


def test_an_unknown_key_fails_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown key 'accuracy' \(known: step, loss"):
        CurvePoint.from_json({"step": 1, "accuracy": 0.5})


def test_distillation_notes_carry_the_loss_and_the_acceptance() -> None:
    curve = CurvePoint(40, loss=1.23456, tokens_per_s=5210.0, acceptance={0.6: 0.4, 1.0: 0.5})
    assert curve_note("online/tau_kd=0.6", curve, 200, [0.6, 1.0]) == (
        "online/tau_kd=0.6 step 40/200: loss 1.2346, acceptance 0.450 (mean over 2 τ_dec)"
    )
    assert curve_note("x", CurvePoint(0, acceptance={1.0: 0.5}), 8, [1.0]).endswith(
        "step 0/8: acceptance 0.500 (mean over 1 τ_dec)"
    )
    assert curve_line(curve, [0.6, 1.0]) == "  step 40  loss 1.2346  5210 tokens/s  α@0.6 0.400  α@1 0.500"
