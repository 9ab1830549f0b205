"""The one bootstrap over test prompts: every interval specray reports over prompts (the verdicts, the
per-category and replicate tables, the garden's reductions, a test set's task quality, the estimators'
ranking) resamples with `draws`, RESAMPLES times from a fixed seed, so a report is reproducible and every
interval has the same resolution.

One level (`bootstrap_interval`): the statistic on each resample of the prompts, and its 95% percentile
interval. Percentile rather than BCa: several effects are differences of maxima, where BCa's jackknife
acceleration is unstable, and a percentile interval can be checked by hand (a unit test pins one). Every
draft is scored on the same prompts of a test set, so one resample of prompt indices serves all of them
(paired); two test sets hold different prompts, so each is resampled on its own.

Two levels (`replicated_interval`): an effect measured on N training replicates of each draft, every
replicate scored on the same prompts. Its error has two sources. *Training*: another seed gives another
draft (the between-replicate spread). *Prompts*: another test set gives another estimate, and every
replicate shares the same prompts, so that error is common to all of them and the replicates' spread does
not show it. The interval adds the two variances, estimated each at its own level, and uses a t quantile
with the Welch–Satterthwaite degrees of freedom, because N is small (3 replicates give 2 degrees of freedom
at the training level, and a normal quantile there would cover far less than 95%):

    V_train  = s²(effect of each replicate on all prompts) / N
    V_prompt = bootstrap variance, over resampled prompts, of the effect averaged over the replicates
    effect ± t(0.975, ν) · √(V_train + V_prompt)
    ν = (V_train + V_prompt)² / (V_train²/(N−1) + V_prompt²/(P−1))

This is the variance-components interval for a crossed two-level design (replicates × prompts): Searle,
Casella & McCulloch, *Variance Components* (1992), ch. 4, with Satterthwaite's approximation (1946) for
the degrees of freedom; the prompt-level variance by the nonparametric bootstrap (Efron & Tibshirani 1993,
ch. 6), which also serves effects that are not means (a difference of maxima). With N = 1 there is no
training level: the interval is the prompts' alone and `training_measured` is False.

numpy and scipy only: the report, the quality scores and the garden all sit above it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# scipy.stats.t.ppf computes this function; scipy.special alone spares every process that imports this
# module (the eval actor, through quality.py) the import of scipy.stats (CHANGELOG has what it costs)
from scipy.special import stdtrit as student_t_quantile

RESAMPLES = 2000  # resamples of every bootstrap: the 2.5% tail is its 50 lowest values
SEED = 0
CONFIDENCE = 0.95

# resampled prompt indices [resamples, prompts] (or test set -> them) -> the statistic [resamples]
Statistic = Callable[[Any], np.ndarray]
# replicate indices [k], prompt indices as for Statistic -> the effect averaged over them [resamples]
Effect = Callable[[np.ndarray, Any], np.ndarray]


def draws(prompts: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """Prompt indices drawn with replacement: row r is resample r [resamples, prompts]."""
    return np.random.default_rng(seed).integers(0, prompts, size=(resamples, prompts))


def joint_draws(
    sizes: Mapping[str, int], resamples: int = RESAMPLES, seed: int = SEED
) -> dict[str, np.ndarray]:
    """`draws` for several test sets (test set -> its prompts), each resampled on its own, from one seed."""
    rng = np.random.default_rng(seed)
    return {name: rng.integers(0, n, size=(resamples, n)) for name, n in sizes.items()}


def percentile_interval(values: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The central `confidence` interval of resampled values (NaN when any is NaN: an empty resample)."""
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(np.asarray(values, dtype=float), [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_interval(
    statistic: Statistic, prompts: int | Mapping[str, int], resamples: int = RESAMPLES, seed: int = SEED
) -> tuple[float, float, float]:
    """(statistic on every prompt, low, high): its 95% percentile bootstrap. With `prompts` a mapping (test
    set -> its prompts) `statistic` takes a mapping of index arrays, each test set resampled on its own."""
    sizes = prompts if isinstance(prompts, Mapping) else {"": prompts}

    def indices(of: Mapping[str, np.ndarray]) -> Any:
        return of if isinstance(prompts, Mapping) else of[""]

    all_prompts = indices({name: np.arange(n)[None, :] for name, n in sizes.items()})
    effect = float(np.asarray(statistic(all_prompts))[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        resampled = np.asarray(statistic(indices(joint_draws(sizes, resamples, seed))))
    return (effect, *percentile_interval(resampled))


@dataclass(frozen=True)
class ReplicatedInterval:
    effect: float  # on every replicate and every prompt
    low: float
    high: float
    per_replicate: tuple[float, ...]  # each replicate's own effect, on every prompt
    training_measured: bool  # False with one replicate: the interval covers prompts only

    def agreeing(self, sign: int) -> str:
        """How many replicates show the effect's claimed sign on their own, e.g. "3/3"."""
        agree = sum(1 for e in self.per_replicate if sign * e > 0)
        return f"{agree}/{len(self.per_replicate)}"


def replicated_interval(
    effect: Effect,
    replicates: int,
    prompts: int | Mapping[str, int],
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> ReplicatedInterval:
    """The effect and its 95% interval over training replicates and test prompts (module docstring).
    `effect(r, p)`: the effect on replicates `r` (averaged over them) and prompts `p` [resamples, P].
    With `prompts` a mapping (test set -> its prompts), `p` is a mapping too, each test set's prompts
    resampled on their own (they are different prompts); P in ν is then the smallest test set."""
    sizes = prompts if isinstance(prompts, Mapping) else {"": prompts}

    def indices(of: Mapping[str, np.ndarray]) -> Any:
        return of if isinstance(prompts, Mapping) else of[""]

    all_prompts = indices({name: np.arange(n)[None, :] for name, n in sizes.items()})
    value = float(effect(np.arange(replicates), all_prompts)[0])
    own = tuple(float(effect(np.array([r]), all_prompts)[0]) for r in range(replicates))
    drawn = indices(joint_draws(sizes, resamples, seed))
    v_prompt = float(np.nanvar(effect(np.arange(replicates), drawn), ddof=1))
    if replicates < 2:
        half = 1.96 * math.sqrt(v_prompt)
        return ReplicatedInterval(value, value - half, value + half, own, False)
    v_train = float(np.var(own, ddof=1)) / replicates
    total = v_train + v_prompt
    if total == 0.0 or not math.isfinite(total):
        bound = value if total == 0.0 else math.nan
        return ReplicatedInterval(value, bound, bound, own, True)
    smallest = min(sizes.values())
    dof = total**2 / (v_train**2 / (replicates - 1) + v_prompt**2 / max(smallest - 1, 1))
    half = float(student_t_quantile(dof, 0.975)) * math.sqrt(total)
    return ReplicatedInterval(value, value - half, value + half, own, True)
