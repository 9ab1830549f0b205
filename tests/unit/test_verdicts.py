"""The verdicts: a paired percentile bootstrap over test prompts, pinned on constructed sweeps whose effect
is known (one reproduced, one not reproduced, one inconclusive), plus the grid checks ("not testable")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specray.bootstrap import bootstrap_interval
from specray.distill.curves import CurvePoint, PromptSums
from specray.draft import Draft
from specray.names import BASELINE
from specray.report import composition, paired, verdicts
from specray.report.figures import curve_frame
from specray.report.paired import INCONCLUSIVE, NOT_REPRODUCED, NOT_TESTABLE, REPRODUCED


def cell(draft: str, tau_dec: float, efficiency: np.ndarray, test_set: str = "in_domain", **info) -> dict:
    """One analytic cell whose prompt p has block efficiency `efficiency[p]` (10 tokens each); with c = 0
    its speedup_model on any prompt set is Σ tokens / Σ target calls."""
    tokens = np.full(len(efficiency), 10.0)
    calls = tokens / efficiency
    return {
        "draft": draft,
        "paradigm": info.get("paradigm", BASELINE),
        "tau_kd": info.get("tau_kd", np.nan),
        "test_set": test_set,
        "tau_dec": tau_dec,
        "estimator": "analytic",
        "gamma": 4,
        "c": 0.0,
        "speedup_model": float(tokens.sum() / calls.sum()),
        "per_prompt_tokens": tokens.tolist(),
        "per_prompt_beta_sum": (tokens * 0.5).tolist(),
        "per_prompt_target_calls": calls.tolist(),
    }


def baseline_sweep(low: np.ndarray, high: np.ndarray) -> pd.DataFrame:
    """The un-distilled draft at τ_dec 0 (block efficiencies `low`) and 1 (`high`)."""
    return pd.DataFrame([cell(BASELINE, 0.0, low), cell(BASELINE, 1.0, high)])


def falls(frame: pd.DataFrame) -> paired.Verdict:
    (verdict,) = verdicts.speedup_falls(paired.prompt_cells(frame))
    return verdict


# Prompts differ a lot in difficulty (block efficiency 1.5 .. 3.5); what each sweep changes is per prompt.
rng = np.random.default_rng(1)
DIFFICULTY = rng.uniform(1.5, 3.5, size=64)


def test_a_clear_drop_with_tau_dec_is_reproduced() -> None:
    verdict = falls(baseline_sweep(DIFFICULTY, DIFFICULTY - 0.3 + rng.normal(0, 0.05, 64)))
    assert verdict.verdict == REPRODUCED
    assert verdict.high < 0 and verdict.effect == pytest.approx(-0.3, abs=0.05)


def test_a_clear_rise_with_tau_dec_is_not_reproduced() -> None:
    verdict = falls(baseline_sweep(DIFFICULTY, DIFFICULTY + 0.3 + rng.normal(0, 0.05, 64)))
    assert verdict.verdict == NOT_REPRODUCED
    assert verdict.low > 0


def test_no_change_beyond_noise_is_inconclusive() -> None:
    noise = np.tile([-0.4, 0.4], 32)  # per-prompt differences with mean 0
    verdict = falls(baseline_sweep(DIFFICULTY, DIFFICULTY + noise))
    assert verdict.verdict == INCONCLUSIVE
    assert verdict.low < 0 < verdict.high


def test_pairing_sees_a_small_consistent_gap_that_unpaired_resampling_would_drown() -> None:
    """+0.05 on every prompt, against prompts spread over 1.5..3.5: resampled jointly the difference is
    exact (interval ≈ [0.05, 0.05]); resampled independently the spread of the prompts (sd ≈ 0.58 / √64 per
    draft) would put 0 inside the interval."""
    verdict = falls(baseline_sweep(DIFFICULTY, DIFFICULTY + 0.05))
    assert verdict.verdict == NOT_REPRODUCED  # speedup rises by 0.05 at the higher τ_dec
    assert verdict.high - verdict.low < 0.02


def test_golden_percentile_interval_on_two_prompts() -> None:
    """Two prompts with values 0 and 1: a resample's mean is 0, 0.5 or 1 (probabilities ¼, ½, ¼), so
    the 2.5% and 97.5% percentiles of 2,000 resamples are exactly 0 and 1; the effect is the full-set 0.5."""
    values = np.array([0.0, 1.0])
    effect, low, high = bootstrap_interval(lambda index: values[index["x"]].mean(-1), {"x": 2})
    assert (effect, low, high) == (0.5, 0.0, 1.0)


def test_golden_interval_matches_the_normal_approximation_on_many_prompts() -> None:
    """The mean of 400 values with sd 1: the percentile interval's half-width is 1.96·s/√n within 10%."""
    values = np.random.default_rng(3).normal(2.0, 1.0, 400)
    effect, low, high = bootstrap_interval(lambda index: values[index["x"]].mean(-1), {"x": 400})
    expected = 1.96 * values.std(ddof=1) / np.sqrt(400)
    assert effect == pytest.approx(values.mean())
    assert (high - low) / 2 == pytest.approx(expected, rel=0.1)
    assert low < effect < high


@pytest.mark.parametrize(
    ("low", "high", "sign", "expected"),
    [
        (0.1, 0.2, +1, REPRODUCED),
        (-0.2, -0.1, +1, NOT_REPRODUCED),
        (-0.2, -0.1, -1, REPRODUCED),
        (-0.1, 0.1, -1, INCONCLUSIVE),
        (0.0, 0.1, +1, INCONCLUSIVE),  # touching 0 is not "entirely on the claimed side"
        (np.nan, np.nan, +1, INCONCLUSIVE),
    ],
)
def test_judge(low: float, high: float, sign: int, expected: str) -> None:
    assert paired.judge(low, high, sign) == expected


def grid_sweep(best_at_diagonal: bool) -> pd.DataFrame:
    """Offline drafts τ_kd 0, 0.5, 1 at τ_dec 0, 0.5, 1; the matched draft is 0.5 better (or worse)."""
    rows = []
    for tau_kd in (0.0, 0.5, 1.0):
        for tau_dec in (0.0, 0.5, 1.0):
            bonus = 0.5 if np.isclose(tau_kd, tau_dec) else 0.0
            bonus = bonus if best_at_diagonal else -bonus
            info = {"paradigm": "offline", "tau_kd": tau_kd}
            rows.append(cell(f"offline/tau_kd={tau_kd:g}", tau_dec, DIFFICULTY + bonus, **info))
    return pd.DataFrame(rows)


def test_diagonal_best_is_reproduced_when_the_matched_draft_wins() -> None:
    harmonic = len(DIFFICULTY) / (1 / DIFFICULTY).sum()  # speedup pools tokens / calls over prompts
    shifted = len(DIFFICULTY) / (1 / (DIFFICULTY + 0.5)).sum()
    (verdict,) = verdicts.diagonal_best(paired.prompt_cells(grid_sweep(best_at_diagonal=True)))
    assert verdict.verdict == REPRODUCED and verdict.effect == pytest.approx(shifted - harmonic)
    (verdict,) = verdicts.diagonal_best(paired.prompt_cells(grid_sweep(best_at_diagonal=False)))
    assert verdict.verdict == NOT_REPRODUCED


def test_a_grid_without_what_a_claim_needs_is_not_testable() -> None:
    one_tau = pd.DataFrame([cell(BASELINE, 0.0, DIFFICULTY)])
    tables = paired.prompt_cells(one_tau)
    assert falls(one_tau).verdict == NOT_TESTABLE and "two τ_dec" in falls(one_tau).note
    assert all(v.verdict == NOT_TESTABLE for v in verdicts.out_of_domain(tables))
    assert all(v.verdict == NOT_TESTABLE for v in verdicts.online_beats_offline(tables))
    assert composition.composition_gains(None)[0].verdict == NOT_TESTABLE
    assert verdicts.u_curve(paired.prompt_cells(grid_sweep(True)))[0].verdict == NOT_TESTABLE  # no τ_dec > 1


def test_curves_without_per_prompt_values_are_inconclusive_with_their_point_effect() -> None:
    by_tau_kd = {0.0: {10: 0.50, 100: 0.60}, 1.0: {10: 0.51, 100: 0.70}}
    curves = {
        f"offline/tau_kd={k:g}": [CurvePoint(s, acceptance={1.0: a}) for s, a in by_step.items()]
        for k, by_step in by_tau_kd.items()
    }
    drafts = [Draft(f"offline/tau_kd={k:g}", "offline", {k: 1.0}) for k in by_tau_kd]
    (verdict,) = verdicts.curves_part_late(curve_frame(curves, drafts))
    assert verdict.verdict == INCONCLUSIVE and "pooled" in verdict.note
    assert verdict.effect == pytest.approx(0.10 - 0.01)


def composition_verdicts(manual_gain: float, tuned_gain: float) -> list:
    """Table 3's highest-τ_dec row and tune records where the manual and tuned drafts' per-prompt speedups
    are those of the single draft times (1 + gain) on every prompt."""
    names = {"single draft": "single", "manual draft": "manual", "tuned draft": "tuned"}
    table3 = pd.DataFrame(
        [{"test_set": "in_domain", "tau_dec": 1.0, "manual gain": 0.0, "tuned gain": 0.0} | names]
    )
    gains = {"single": 1.0, "manual": 1.0 + manual_gain, "tuned": 1.0 + tuned_gain}
    records = pd.DataFrame([cell(name, 1.0, DIFFICULTY * gain) for name, gain in gains.items()])
    return composition.composition_gains(composition.Composition(table3, records))


def test_composition_gain_is_bootstrapped_from_the_tune_records() -> None:
    manual, tuned = composition_verdicts(0.15, -0.1)
    assert manual.verdict == REPRODUCED and manual.effect == pytest.approx(0.15)
    assert "inside" in manual.note
    assert tuned.verdict == NOT_REPRODUCED and tuned.effect == pytest.approx(-0.1)


def test_a_composition_gain_below_the_papers_band_is_not_reproduced() -> None:
    """The claim is a 12–20% gain: a gain clearly above 0 but clearly below 12% does not reproduce it."""
    manual, _ = composition_verdicts(0.05, 0.05)
    assert manual.effect == pytest.approx(0.05) and manual.low > 0 and manual.high < 0.12
    assert manual.verdict == NOT_REPRODUCED and "smaller gain" in manual.note


def test_curves_with_per_prompt_values_are_bootstrapped() -> None:
    """Where the probe's rows carry per-prompt sums, the parting is judged with an interval: here the gap
    grows from 0.02 to 0.20 on every one of 16 prompts."""
    tokens = np.full(16, 10.0)

    def point(step: int, alpha: float) -> CurvePoint:
        sums = tokens * (alpha + np.linspace(-0.05, 0.05, 16))  # prompts differ; the gap does not
        per_prompt = PromptSums(tuple(tokens.tolist()), tuple(sums.tolist()))
        return CurvePoint(step, acceptance={1.0: sums.sum() / tokens.sum()}, per_prompt={1.0: per_prompt})

    curves = {
        "online/tau_kd=0": [point(50, 0.50), point(100, 0.60)],
        "online/tau_kd=1": [point(50, 0.52), point(100, 0.80)],
    }
    drafts = [Draft(f"online/tau_kd={k:g}", "online", {k: 1.0}) for k in (0.0, 1.0)]
    (verdict,) = verdicts.curves_part_late(curve_frame(curves, drafts))
    assert verdict.verdict == REPRODUCED and verdict.effect == pytest.approx(0.18)


def test_a_sweeps_own_mixture_is_judged_against_its_best_single_tau_kd() -> None:
    rows = [
        cell(f"offline/tau_kd={k:g}", tau, DIFFICULTY * (1.0 + 0.05 * k), paradigm="offline", tau_kd=k)
        for k in (0.0, 1.0)
        for tau in (0.0, 1.0)
    ]
    rows += [
        cell("offline/mix=0:1,1:1", tau, DIFFICULTY * 1.05 * 1.15, paradigm="offline") for tau in (0.0, 1.0)
    ]
    (verdict,) = composition.sweep_mixture_gains(paired.prompt_cells(pd.DataFrame(rows)))
    assert verdict.verdict == REPRODUCED and verdict.effect == pytest.approx(0.15)
    assert "τ_dec 1" in verdict.scope
    (diagonal,) = verdicts.diagonal_best(paired.prompt_cells(pd.DataFrame(rows)))  # the mixture is no τ_kd
    # ±5% at τ_dec 0 and 1 cancel exactly; the 15% better mixture as a rival would make it negative
    assert diagonal.effect == pytest.approx(0.0, abs=1e-12)
