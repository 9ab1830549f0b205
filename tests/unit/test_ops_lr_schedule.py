"""The learning-rate schedule shared by the distillation loop and the zoo's pre-training."""

from __future__ import annotations

import math

import pytest

from specray.ops.lr_schedule import MIN_LR_RATIO, warmup_cosine


def test_warm_up_then_cosine_to_the_floor() -> None:
    assert [warmup_cosine(s, 3, 10) for s in range(3)] == [0.25, 0.5, 0.75]  # peak at the first decay step
    assert warmup_cosine(3, 3, 10) == 1.0
    assert warmup_cosine(10, 3, 10) == pytest.approx(MIN_LR_RATIO) == warmup_cosine(50, 3, 10)
    middle = MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert warmup_cosine(5, 3, 7) == middle
    assert warmup_cosine(0, 0, 4) == 1.0  # no warm-up


def test_the_zoo_ramp_reaches_the_peak_at_the_last_warm_up_step() -> None:
    assert [warmup_cosine(s, 4, 80, ramp_steps=4) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
