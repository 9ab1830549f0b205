"""The DistillSpec section's Fig. 3b/3c/5a (`report/distillspec_prompts.py`, `report/distillspec_drafts.py`)
and its last three verdicts: golden values (ρ of a known ranking, the share of a constructed set of prompts
that improve) and verdicts on sweeps whose answer is planted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specray.names import BASELINE
from specray.report import distillspec_drafts as dsd
from specray.report import distillspec_prompts as dsp
from specray.report import paired
from tests.unit.test_verdicts import DIFFICULTY, cell

SOURCES = ("supervised_kd", "gkd")
DIVERGENCES = ("fkl", "tvd")
Bonus = Callable[[str, str, float], "float | np.ndarray"]


def sweep(bonus: Bonus, offline: float | None = None) -> pd.DataFrame:
    """The un-distilled draft and online drafts at τ_kd 1 per (source, divergence) at τ_dec 0 and 1, each
    `bonus(source, divergence, τ_dec)` better in block efficiency per prompt; with `offline`, an offline draft
    at τ_kd 1 that much better."""
    rows = [cell(BASELINE, tau, DIFFICULTY) for tau in (0.0, 1.0)]
    for source in SOURCES:
        for divergence in DIVERGENCES:
            name = f"online/tau_kd=1/{divergence}/{source}"
            for tau in (0.0, 1.0):
                row = cell(
                    name, tau, DIFFICULTY + bonus(source, divergence, tau), paradigm="online", tau_kd=1.0
                )
                rows.append(row | {"divergence": divergence, "data_source": source, "recipe": name})
    if offline is not None:
        info = {"paradigm": "offline", "tau_kd": 1.0}
        rows += [cell("offline/tau_kd=1", tau, DIFFICULTY + offline, **info) for tau in (0.0, 1.0)]
    frame = pd.DataFrame(rows)
    return frame.assign(block_efficiency_sampled=frame.speedup_model)


def claims(frame: pd.DataFrame) -> dict[str, paired.Verdict]:
    found = dsp.verdicts(paired.prompt_cells(frame), dsp.prompt_pairs(frame))
    return {v.claim: v for v in found}


# 48 of 64 prompts gain 0.3, 16 lose 0.1: the share improved is exactly 0.75
MOSTLY = np.where(np.arange(64) < 48, 0.3, -0.1)


def test_share_improved_is_pinned_and_most_examples_improve() -> None:
    frame = sweep(lambda s, d, t: MOSTLY if s == "gkd" else 0.0)
    pairs = dsp.prompt_pairs(frame)
    assert [(p.tau_dec, p.gamma) for p in pairs] == [(0.0, 4), (1.0, 4)]
    assert all(p.draft.endswith("/gkd") and p.share_improved == 0.75 for p in pairs)
    verdict = claims(frame)[dsp.MOST_IMPROVE]
    assert verdict.effect == pytest.approx(0.25)
    assert verdict.verdict == paired.REPRODUCED and 0.1 < verdict.low < 0.25 < verdict.high < 0.4


def test_a_few_large_gains_are_not_most_examples() -> None:
    few = np.where(np.arange(64) < 16, 0.5, -0.01)  # mean gain > 0, but only a quarter of the prompts
    verdict = claims(sweep(lambda s, d, t: few if s == "gkd" else 0.0))[dsp.MOST_IMPROVE]
    assert verdict.effect == pytest.approx(-0.25)
    assert verdict.verdict == paired.NOT_REPRODUCED


def test_a_divergence_ranking_that_flips_with_tau_dec_is_reproduced() -> None:
    flips = claims(sweep(lambda s, d, t: 0.3 if (d == "fkl") == (t == 0.0) else 0.0))
    assert flips[dsp.DIVERGENCE_DEPENDS].verdict == paired.REPRODUCED
    same = claims(sweep(lambda s, d, t: 0.3 if d == "fkl" else 0.0))
    assert same[dsp.DIVERGENCE_DEPENDS].verdict == paired.NOT_REPRODUCED
    assert same[dsp.DIVERGENCE_DEPENDS].effect < 0


def test_white_box_against_the_offline_draft() -> None:
    ahead = claims(sweep(lambda s, d, t: 0.3, offline=0.0))[dsp.WHITE_BOX]
    assert ahead.verdict == paired.REPRODUCED
    behind = claims(sweep(lambda s, d, t: 0.0, offline=0.3))[dsp.WHITE_BOX]
    assert behind.verdict == paired.NOT_REPRODUCED
    assert claims(sweep(lambda s, d, t: 0.3))[dsp.WHITE_BOX].verdict == paired.NOT_TESTABLE


def test_spearman_of_a_known_ranking() -> None:
    analytic = np.arange(1.0, 9.0)
    assert dsd.spearman(analytic, analytic * 2)[0] == pytest.approx(1.0)
    assert dsd.spearman(analytic, -analytic)[0] == pytest.approx(-1.0)
    # two adjacent swaps among 8: Σd² = 4, ρ = 1 − 6·4 / (8·63)
    rho, low, high = dsd.spearman(analytic, np.array([2, 1, 3, 4, 5, 6, 8, 7.0]))
    assert rho == pytest.approx(1 - 24 / 504)
    assert low <= rho <= high and low > 0.5


def estimator_frame() -> pd.DataFrame:
    """Six drafts measured both ways at τ_dec 1, γ 4, the empirical ranking one swap off; and ends."""
    rows = []
    for i, empirical in enumerate([1.1, 1.3, 1.2, 1.4, 1.5, 1.6]):
        draft = BASELINE if i == 0 else f"online/tau_kd=1/fkl/d{i}"
        keys = {"draft": draft, "test_set": "in_domain", "tau_dec": 1.0, "gamma": 4}
        rows.append(keys | {"estimator": "analytic", "block_efficiency_sampled": 1.0 + i / 10})
        rows.append(keys | {"estimator": "empirical", "block_efficiency": empirical})
        rows.append(keys | {"estimator": "ends", "quality_draft": 0.5 - i / 100, "gamma": 0})
    return pd.DataFrame(rows)


def test_estimator_ranking_and_quality_gain_figures_are_written(tmp_path: Path) -> None:
    frame = estimator_frame()
    (ranking,) = dsd.rankings(dsd.estimator_pairs(frame))
    assert (ranking.drafts, ranking.gamma) == (6, 4)
    assert ranking.rho == pytest.approx(1 - 6 * 2 / (6 * 35))
    assert "Spearman's ρ = +0.94" in ranking.line
    (path,) = dsd.estimator_ranking(dsd.estimator_pairs(frame), [ranking], tmp_path)
    assert path.name == "distillspec_estimators.png" and path.stat().st_size > 0
    gains = dsd.gains(frame)
    assert len(gains) == 5 and BASELINE not in set(gains.draft)
    assert gains.quality_gain.to_numpy() == pytest.approx([-0.01, -0.02, -0.03, -0.04, -0.05])
    assert gains.efficiency_gain.to_numpy() == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    (path,) = dsd.quality_vs_efficiency(gains, tmp_path)
    assert path.name == "distillspec_quality_vs_efficiency.png" and path.stat().st_size > 0


def test_per_example_figure_is_written_and_empty_input_draws_nothing(tmp_path: Path) -> None:
    pairs = dsp.prompt_pairs(sweep(lambda s, d, t: MOSTLY if s == "gkd" else 0.0))
    (path,) = dsp.per_example(pairs, tmp_path)
    assert path.name == "distillspec_per_example.png" and path.stat().st_size > 0
    assert dsp.per_example([], tmp_path) == [] and dsd.rankings(dsd.estimator_pairs(pd.DataFrame())) == []
    lines = dsp.figure_lines(estimator_frame(), estimator_frame(), pairs, tmp_path)
    assert any(line.startswith("- in_domain, τ_dec 1, γ 4: Spearman's ρ") for line in lines)


def test_the_report_section_carries_the_figures_rho_and_all_five_verdicts(tmp_path: Path) -> None:
    from specray.report.build import _distillspec_section

    frame = sweep(lambda s, d, t: MOSTLY if s == "gkd" else 0.0)
    lines = "\n".join(_distillspec_section(frame, frame, frame, pd.DataFrame(), tmp_path))
    assert "![distillspec_per_example](distillspec_per_example.png)" in lines
    assert "- no cell was measured both ways" in lines  # analytic cells only: no ρ to state
    for claim in (dsp.WHITE_BOX, dsp.DIVERGENCE_DEPENDS, dsp.MOST_IMPROVE, "GKD is at or near the best"):
        assert claim in lines
