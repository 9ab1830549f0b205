"""Speedup heatmaps show break-even at a glance: a diverging scale centred at 1.0."""

from __future__ import annotations

import matplotlib
import numpy as np

from specray.report.figures import colour_scale


def test_a_speedup_scale_is_centred_at_break_even_and_gives_slowdowns_their_own_hue() -> None:
    scale = colour_scale(np.array([[0.62, 0.99], [1.01, 1.30]]), centred=True)
    assert abs(float(scale.norm(1.0)) - 0.5) < 1e-9
    cmap = matplotlib.colormaps[scale.cmap]
    below, above = cmap(scale.norm(0.99)), cmap(scale.norm(1.01))
    assert below[0] > below[2] and above[2] > above[0]  # red below 1, blue above
    assert scale.text(0.62) == "white" and scale.text(1.0) == "black"


def test_a_scale_all_above_one_still_centres_at_one() -> None:
    scale = colour_scale(np.array([[1.1, 1.4, np.nan]]), centred=True)
    assert abs(float(scale.norm(1.0)) - 0.5) < 1e-9 and abs(float(scale.norm(1.4)) - 1.0) < 1e-9


def test_other_metrics_keep_viridis_over_their_range() -> None:
    scale = colour_scale(np.array([[0.2, 0.8]]), centred=False)
    assert scale.cmap == "viridis" and float(scale.norm(0.2)) == 0.0 and float(scale.norm(0.8)) == 1.0
