"""The interval over training replicates and test prompts (`specray.bootstrap.replicated_interval`), on
constructed data where the truth is known: calibrated on null data, and neither fooled by one lucky replicate
nor by an effect within prompt noise."""

from __future__ import annotations

import numpy as np

from specray.bootstrap import Effect, draws, percentile_interval, replicated_interval
from specray.report.paired import INCONCLUSIVE, REPRODUCED, judge


def prompt_only_interval(
    effect: Effect, replicates: int, prompts: int, resamples: int, seed: int = 0
) -> tuple[float, float]:
    """The interval a single-seed analysis gives: prompts resampled, the replicates taken as fixed. For
    comparison only: it ignores training variance."""
    return percentile_interval(effect(np.arange(replicates), draws(prompts, resamples, seed)))


def _mean_effect(values: np.ndarray):
    """An effect that is the mean of values [R, P] over the chosen replicates and prompts."""

    def effect(replicates: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        return values[replicates][:, prompts].mean(axis=0).mean(axis=-1)

    return effect


def _study(
    rng: np.random.Generator, replicates: int, prompts: int, training: float, noise: float
) -> np.ndarray:
    """values[r, p] = u_r + e_rp: a training offset per replicate, prompt noise per value; true effect 0."""
    return rng.normal(0, training, (replicates, 1)) + rng.normal(0, noise, (replicates, prompts))


def test_on_null_data_the_interval_covers_zero_at_its_level_and_the_prompt_only_one_does_not() -> None:
    rng = np.random.default_rng(7)
    covered = prompt_covered = 0
    studies = 200
    for i in range(studies):
        values = _study(rng, replicates=3, prompts=48, training=0.1, noise=0.3)
        effect = _mean_effect(values)
        interval = replicated_interval(effect, 3, 48, resamples=400, seed=i)
        covered += interval.low <= 0.0 <= interval.high
        low, high = prompt_only_interval(effect, 3, 48, resamples=400, seed=i)
        prompt_covered += low <= 0.0 <= high
    assert covered / studies >= 0.93, covered
    assert prompt_covered / studies < 0.8, prompt_covered  # training variance ignored: too narrow


def test_an_effect_in_one_replicate_of_three_is_not_reproduced() -> None:
    rng = np.random.default_rng(1)
    values = rng.normal(0, 0.05, (3, 64))
    values[0] += 1.0  # one lucky training run
    interval = replicated_interval(_mean_effect(values), 3, 64, resamples=500)
    assert interval.agreeing(+1) == "1/3" or interval.agreeing(+1) == "2/3"
    assert judge(interval.low, interval.high, +1) == INCONCLUSIVE
    low, high = prompt_only_interval(_mean_effect(values), 3, 64, resamples=500)
    assert judge(low, high, +1) == REPRODUCED  # what a prompts-only interval would have claimed


def test_an_effect_consistent_across_replicates_but_within_prompt_noise_is_inconclusive() -> None:
    rng = np.random.default_rng(2)
    values = 0.02 + rng.normal(0, 0.0001, (3, 1)) + rng.normal(0, 0.5, (1, 32)).repeat(3, axis=0)
    interval = replicated_interval(_mean_effect(values), 3, 32, resamples=500)
    assert interval.agreeing(+1) == "3/3" and judge(interval.low, interval.high, +1) == INCONCLUSIVE


def test_a_clear_effect_on_every_replicate_is_reproduced_and_one_replicate_measures_prompts_only() -> None:
    rng = np.random.default_rng(3)
    values = 0.5 + _study(rng, replicates=4, prompts=64, training=0.05, noise=0.2)
    interval = replicated_interval(_mean_effect(values), 4, 64, resamples=500)
    assert interval.training_measured and interval.agreeing(+1) == "4/4"
    assert judge(interval.low, interval.high, +1) == REPRODUCED
    single = replicated_interval(_mean_effect(values[:1]), 1, 64, resamples=500)
    assert not single.training_measured and single.per_replicate == (single.effect,)
