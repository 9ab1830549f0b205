"""Has a draft finished learning? The slope of the probe's acceptance over the last stretch of training.

The acceptance probe (`probe.py`) scores the draft at every report; its mean over the probe's τ_dec is one
number per curve point. A least-squares line through the points of the last `WINDOW` of the steps gives
the slope, expressed per 100 optimizer steps (a unit that does not depend on the run's length). A draft is
*flat* when |slope| < FLAT_SLOPE: another 100 steps at the end's rate would move its acceptance by less
than two points — comparisons between drafts are then between trained drafts, not between how far each got.

The probe is deterministic (analytic estimator, fixed target continuations), so the points scatter only
with the weights themselves; the slope needs at least MIN_POINTS points in the window (report often
enough: `distill.report_every` ≤ steps / 12 gives 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specray.distill.curves import CurvePoint

WINDOW = 0.25  # the last quarter of the steps
# |Δ acceptance| per 100 steps below which a curve counts as flat: about the probe's noise floor on the
# tiny zoo (an offline draft on its plateau, 16 probe prompts, showed -0.017 over its last 75 steps)
FLAT_SLOPE = 0.02
MIN_POINTS = 3  # a line through two points says nothing about how straight the curve is
PER_STEPS = 100


@dataclass(frozen=True)
class Convergence:
    """The last window's trend of the mean probe acceptance."""

    slope: float  # least-squares slope, acceptance per 100 steps
    first_step: int  # the window: curve points with first_step <= step <= last_step
    last_step: int
    points: int
    flat: bool  # |slope| < threshold

    def describe(self) -> str:
        verdict = "flat" if self.flat else "still moving"
        window = f"steps {self.first_step}–{self.last_step}"
        return f"{self.slope:+.4f} per {PER_STEPS} steps over {window} ({verdict})"


def probe_due(step: int, steps: int, report_every: int) -> bool:
    """Whether the train loop's report at `step` (of `steps`) runs the acceptance probe.

    The test above reads only the curve's last WINDOW, so every report there probes. Before it the curve
    only has to show its shape (Figure 6), which changes fastest at the start: step 0 and the reports at
    report_every × 2^k (10, 20, 40, 80, ... steps) — also the rungs of Tune's ASHA at its default grace
    period (one report) and reduction factor (2). A run of 400 steps reporting every 10 probes 17 times
    instead of 41; its window holds the same 11 points."""
    if step == 0 or step >= steps - WINDOW * steps:  # the window as `convergence` cuts it
        return True
    reports, rest = divmod(step, report_every)
    return rest == 0 and reports & (reports - 1) == 0  # a power of two


def mean_acceptance(point: CurvePoint) -> float | None:
    """The curve point's acceptance averaged over the probe's τ_dec; None without probe values."""
    values = [a for a in point.acceptance.values() if np.isfinite(a)]
    return float(np.mean(values)) if values else None


def slope_per_100(steps: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of values vs steps, per 100 steps.

    steps, values: [n], n >= 2, the steps not all equal -> the slope."""
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    centred = x - x.mean()
    return float(PER_STEPS * (centred @ (y - y.mean())) / (centred @ centred))


def convergence(
    curves: Sequence[CurvePoint], window: float = WINDOW, threshold: float = FLAT_SLOPE
) -> Convergence | None:
    """The slope over the points in the last `window` of the steps; None with fewer than MIN_POINTS."""
    points = [(p.step, a) for p in curves if (a := mean_acceptance(p)) is not None]
    if not points:
        return None
    last = max(step for step, _ in points)
    first = last - window * last
    inside = [(step, a) for step, a in points if step >= first]
    if len(inside) < MIN_POINTS:
        return None
    steps, values = zip(*inside, strict=True)
    slope = slope_per_100(steps, values)
    return Convergence(slope, int(min(steps)), int(last), len(inside), abs(slope) < threshold)


def convergence_metrics(curves: Sequence[CurvePoint]) -> dict[str, float]:
    """What MLflow records on the draft's run: the slope and the 0/1 verdict (nothing without a window)."""
    found = convergence(curves)
    if found is None:
        return {}
    return {"acceptance_slope_per_100_steps": found.slope, "acceptance_flat": float(found.flat)}
