"""The convergence measure: least-squares slope of the probe's mean acceptance over the last window."""

from __future__ import annotations

import pytest

from specray.distill.convergence import (
    FLAT_SLOPE,
    convergence,
    convergence_metrics,
    mean_acceptance,
    slope_per_100,
)
from specray.distill.curves import CurvePoint


def _point(step: int, *acceptances: float) -> CurvePoint:
    """A curve point with the probe's acceptance at τ_dec 0, 1, ... (step 0 has no loss, as in the loop)."""
    acceptance = {float(i): a for i, a in enumerate(acceptances)}
    return CurvePoint(step, loss=1.0 if step else None, acceptance=acceptance)


def test_slope_golden_values() -> None:
    # y = 0.3 + 0.002 x: 0.2 per 100 steps, whatever the spacing
    assert slope_per_100([0, 50, 100], [0.3, 0.4, 0.5]) == pytest.approx(0.2)
    # least squares through (150, .50), (175, .53), (200, .52): sum dx·dy / sum dx² = 0.5 / 1250 per step
    assert slope_per_100([150, 175, 200], [0.50, 0.53, 0.52]) == pytest.approx(0.04)
    assert slope_per_100([1, 2, 3, 4], [0.7, 0.7, 0.7, 0.7]) == 0.0


def test_mean_acceptance_averages_the_probe_keys_only() -> None:
    assert mean_acceptance(_point(10, 0.2, 0.4)) == pytest.approx(0.3)
    assert mean_acceptance(CurvePoint(10, loss=1.0)) is None


def test_window_is_the_last_quarter_of_the_steps() -> None:
    # rising steeply early, then flat from step 150 on: the window (steps >= 150) sees only the plateau
    curves = [_point(s, min(s, 150) / 300) for s in range(0, 201, 10)]
    found = convergence(curves)
    assert found is not None
    assert (found.first_step, found.last_step, found.points) == (150, 200, 6)
    assert found.slope == pytest.approx(0.0, abs=1e-12)
    assert found.flat


def test_a_rising_curve_is_not_flat() -> None:
    # +0.05 per 100 steps at the end (means over two τ_dec that rise together): above the threshold
    curves = [_point(s, 0.4 + 0.0005 * s, 0.2 + 0.0005 * s) for s in range(0, 101, 5)]
    found = convergence(curves)
    assert found is not None and found.slope == pytest.approx(0.05)
    assert not found.flat
    assert convergence_metrics(curves) == {
        "acceptance_slope_per_100_steps": pytest.approx(0.05),
        "acceptance_flat": 0.0,
    }


def test_threshold_is_per_100_steps_either_sign() -> None:
    def line(per_100: float) -> list[dict]:
        return [_point(s, 0.5 + per_100 * s / 100) for s in range(0, 201, 10)]

    assert not convergence(line(1.1 * FLAT_SLOPE)).flat
    assert not convergence(line(-1.1 * FLAT_SLOPE)).flat  # falling acceptance is not converged either
    assert convergence(line(0.9 * FLAT_SLOPE)).flat


def test_too_few_points_in_the_window_gives_no_verdict() -> None:
    curves = [_point(s, 0.5) for s in (0, 25, 50, 75, 100)]  # report_every = 25: two points in [75, 100]
    assert convergence(curves) is None
    assert convergence_metrics(curves) == {}
    assert convergence([]) is None
