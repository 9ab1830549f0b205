"""A distillation's curve points as the progress display shows them."""

from __future__ import annotations

from specray.distill.curves import CurvePoint
from specray.distill.progress import curve_line, curve_note


def test_distillation_notes_carry_the_loss_and_the_acceptance() -> None:
    curve = CurvePoint(40, loss=1.23456, tokens_per_s=5210.0, acceptance={0.6: 0.4, 1.0: 0.5})
    assert curve_note("online/tau_kd=0.6", curve, 200, [0.6, 1.0]) == (
        "online/tau_kd=0.6 step 40/200: loss 1.2346, acceptance 0.450 (mean over 2 τ_dec)"
    )
    assert curve_note("x", CurvePoint(0, acceptance={1.0: 0.5}), 8, [1.0]).endswith(
        "step 0/8: acceptance 0.500 (mean over 1 τ_dec)"
    )
    assert curve_line(curve, [0.6, 1.0]) == "  step 40  loss 1.2346  5210 tokens/s  α@0.6 0.400  α@1 0.500"
