"""The convergence measure: least-squares slope of the probe's mean acceptance over the last window."""

from __future__ import annotations

import pytest

from specray.distill.convergence import (
    FLAT_SLOPE,
    convergence,
    convergence_metrics,
    mean_acceptance,
    probe_due,
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


def test_the_probe_runs_at_every_report_of_the_window_and_at_doubling_steps_before() -> None:
    probed = [step for step in range(0, 401, 10) if probe_due(step, 400, 10)]
    assert probed == [0, 10, 20, 40, 80, 160, *range(300, 401, 10)]
    assert probe_due(397, 397, 10)  # the last step, reported whatever report_every
    online = [step for step in range(0, 601, 10) if probe_due(step, 600, 10)]
    assert online == [0, 10, 20, 40, 80, 160, 320, *range(450, 601, 10)]


@pytest.mark.parametrize(("steps", "every"), [(400, 10), (600, 10), (100, 7), (40, 1), (8, 1)])
def test_the_thinned_curve_gives_the_verdict_of_the_full_one(steps: int, every: int) -> None:
    """What `probe_due` leaves out lies outside the convergence window: the slope is the same."""
    reports = sorted({*range(0, steps + 1, every), steps})
    full = [_point(step, 0.4 + 0.3 * (1 - 0.99**step), 0.5) for step in reports]
    thinned = [p if probe_due(p.step, steps, every) else CurvePoint(p.step, loss=1.0) for p in full]
    assert convergence(thinned) == convergence(full) is not None
