"""The search space of `specray tune` and the pure maps around it.

A trial's config holds one score per τ_kd of the grid (`w_tau_kd_<τ>`, log-uniform in [MIN_SCORE, 1]), plus
the paradigm, divergence and λ when `tune` asks to search them. Log-uniform, because with uniform scores
over 11 τ_kd almost every sample normalises to a near-uniform mix of all of them; on a log scale a few τ_kd
dominate a typical sample, and broad mixes stay reachable. The scores become a mixture in one of two ways:

- `weights`: the scores, normalised to shares; a τ_kd with less than MIN_SHARE of the data is dropped (it
  would barely change the run, and the recipe stays readable), the rest renormalised and rounded.
- `subset`: the `subset_size` τ_kd with the highest scores, equal weights. I.i.d. scores give uniformly
  random subsets, and TPE can learn which τ_kd to score high — unlike one categorical over C(n, k)
  subsets, where TPE learns nothing across subsets that share members.

Every trial and every search-budget baseline trains with the same budget (`tune.steps`, else
`distill.steps`): only the recipe differs. Table 3's drafts are then retrained at the full budget
(`final_budget`). The ASHA signal is the acceptance the loop's probe reports during training, averaged
over the objective τ_dec; the objective is the mean analytic `speedup_model` over those τ_dec on the
validation split.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specray.config import EvalSpec, LenienceSpec, SweepSpec
from specray.distill.curves import CurvePoint
from specray.draft import draft_name, mixture_tag
from specray.errors import SpecError
from specray.metrics import SPEEDUP_MODEL
from specray.ops import expected_block_efficiency
from specray.report.best import best_gamma_records
from specray.specdec.records import CellRecord, StepCosts

WEIGHT_PREFIX = "w_tau_kd_"
MIN_SCORE = 0.01  # scores span two decades: a τ_kd can weigh up to 100x another
MIN_SHARE = 0.05  # a τ_kd below 5% of the data is dropped from a `weights` mixture
SHARE_DIGITS = 3


def weight_param(tau_kd: float) -> str:
    """The config key of τ_kd's score (no '/' or '=': Tune reads '/' as nesting)."""
    return f"{WEIGHT_PREFIX}{tau_kd:g}"


@dataclass(frozen=True)
class Recipe:
    """What one trial or baseline trains: a paradigm, a τ_kd mixture and distill overrides."""

    paradigm: str
    mixture: dict[float, float]
    distill: dict[str, Any] = field(default_factory=dict)  # e.g. {"steps": 100, "divergence": "rkl"}

    @property
    def name(self) -> str:
        return draft_name(self.paradigm, self.mixture)

    @property
    def mixture_tag(self) -> str:
        """`0.7:0.4,0.9:0.6`: the mixture as MLflow tags and tables show it."""
        return mixture_tag(self.mixture)


# ---------------------------------------------------------------- scores -> mixture


def normalise(scores: Mapping[float, float], min_share: float = MIN_SHARE) -> dict[float, float]:
    """Scores -> shares summing to ~1 (rounded), without τ_kd under `min_share`; the best one always stays."""
    clipped = {tau: max(0.0, float(score)) for tau, score in scores.items()}
    total = sum(clipped.values())
    if total <= 0.0:  # all zero: nothing to prefer, so mix everything equally
        clipped, total = dict.fromkeys(clipped, 1.0), float(len(clipped))
    shares = {tau: score / total for tau, score in clipped.items()}
    best = max(sorted(shares), key=lambda tau: shares[tau])
    kept = {tau: share for tau, share in shares.items() if share >= min_share or tau == best}
    kept_total = sum(kept.values())
    return {tau: round(kept[tau] / kept_total, SHARE_DIGITS) for tau in sorted(kept)}


def top_k(scores: Mapping[float, float], k: int) -> dict[float, float]:
    """The k τ_kd with the highest scores (ties: the lower τ_kd), equal weights."""
    ranked = sorted(scores, key=lambda tau: (-scores[tau], tau))
    return dict.fromkeys(sorted(ranked[:k]), 1.0)


def mixture_from_config(
    config: Mapping[str, Any], grid: Sequence[float], space: str, subset_size: int
) -> dict[float, float]:
    """A trial's τ_kd mixture from its scores."""
    scores = {tau: float(config[weight_param(tau)]) for tau in grid}
    return top_k(scores, subset_size) if space == "subset" else normalise(scores)


def steps_budget(spec: SweepSpec) -> int:
    """The search budget: every trial's steps, and the search-budget baselines'."""
    return spec.tune.steps or spec.distill.steps


def final_budget(spec: SweepSpec) -> int:
    """The budget Table 3's drafts are retrained at: `tune.final_steps`, else the included sweep's own steps
    for the tune's paradigm — the budget its drafts are served at, and the one under which a full-budget
    single τ_kd is the sweep's own draft (same key)."""
    return spec.tune.final_steps or spec.distill.steps_for(spec.tune.paradigm)


def at_budget(recipe: Recipe, steps: int) -> Recipe:
    """The same recipe trained for `steps` steps (the winner retrained at the full budget)."""
    return replace(recipe, distill=recipe.distill | {"steps": steps})


def recipe_from_config(spec: SweepSpec, config: Mapping[str, Any]) -> Recipe:
    """A trial's recipe: its mixture, paradigm, and the distill settings it searches or is given."""
    t = spec.tune
    mixture = mixture_from_config(config, spec.teacher.temperatures, t.space, t.subset_size)
    overrides: dict[str, Any] = {"steps": steps_budget(spec)}
    for key in ("divergence", "onpolicy_fraction"):
        if key in config:
            overrides[key] = config[key]
    return Recipe(config.get("paradigm", t.paradigm), mixture, overrides)


def baseline_recipe(spec: SweepSpec, mixture: Mapping[float, float], steps: int | None = None) -> Recipe:
    """A baseline trains like a trial (`steps`: the search budget unless given), with the sweep's own
    paradigm, divergence and λ."""
    return Recipe(spec.tune.paradigm, dict(mixture), {"steps": steps or steps_budget(spec)})


def budget_spec(spec: SweepSpec, recipe: Recipe) -> SweepSpec:
    """The spec a recipe trains under: `distill` with the recipe's overrides, validated again. The budget
    holds for every paradigm: `distill.online_steps` does not apply to trials."""
    raw = spec.model_dump(mode="json")
    raw["distill"] |= recipe.distill | {"online_steps": None}
    return SweepSpec.model_validate(raw)


def search_space(spec: SweepSpec) -> dict[str, Any]:
    """Tune's param space: a log-uniform score per τ_kd; choices for what else `tune` asks to search."""
    from ray import tune

    t = spec.tune
    grid = spec.teacher.temperatures
    space: dict[str, Any] = {weight_param(tau): tune.loguniform(MIN_SCORE, 1.0) for tau in grid}
    for key, values in (
        ("paradigm", t.paradigms),
        ("divergence", t.divergences),
        ("onpolicy_fraction", t.onpolicy_fractions),
    ):
        if len(values) > 1:
            space[key] = tune.choice(list(values))
        elif values:
            space[key] = values[0]
    return space


# ---------------------------------------------------------------- signals


def acceptance_estimate(curve: CurvePoint, taus_dec: Sequence[float]) -> float | None:
    """Mean of the probe's acceptance over `taus_dec` in one curve point (None if one is missing)."""
    values = [curve.acceptance.get(float(tau), math.nan) for tau in taus_dec]
    if not all(math.isfinite(v) for v in values):
        return None
    return sum(values) / len(values)


def speedup_estimate(
    curve: CurvePoint, taus_dec: Sequence[float], costs: StepCosts, gammas: Sequence[int]
) -> float | None:
    """The objective as estimated from a curve point: the i.i.d. block efficiency of the probe's α (a
    β-based figure: the probe keeps no per-position counts) in the cost model's per-step speedup at the
    smallest batch size, at the best γ of the grid for each τ_dec."""
    alphas = [curve.acceptance.get(float(tau), math.nan) for tau in taus_dec]
    if not all(math.isfinite(a) for a in alphas):
        return None
    speedups = [
        max(
            costs.speedup(expected_block_efficiency(min(1.0, max(0.0, a)), g), g, costs.batch_sizes[0])
            for g in gammas
        )
        for a in alphas
    ]
    return sum(speedups) / len(speedups)


def objective(records: Sequence[CellRecord], taus_dec: Sequence[float]) -> float:
    """Mean analytic `speedup_model` (at the best γ) over `taus_dec`; ValueError if a τ_dec has no record."""
    by_tau = {float(r.tau_dec): float(r.metrics[SPEEDUP_MODEL]) for r in best_gamma_records(records)}
    missing = [tau for tau in taus_dec if float(tau) not in by_tau]
    if missing:
        raise ValueError(f"no analytic record at τ_dec {missing}")
    return sum(by_tau[float(tau)] for tau in taus_dec) / len(taus_dec)


def tune_grid(spec: SweepSpec, test_sets: Sequence[str]) -> EvalSpec:
    """The cells the search and Table 3 measure: analytic, lossless, at every objective τ_dec and γ of the
    grid, on `test_sets` (validation for the baselines' choice, the test sets for Table 3)."""
    update = {
        "temperatures": list(spec.tune.objective_temperatures),
        "estimators": ["analytic"],
        "test_sets": list(test_sets),
        "lenience": LenienceSpec(),
    }
    return spec.eval.model_copy(update=update)


# ---------------------------------------------------------------- the edge


def check_tune(spec: SweepSpec) -> None:
    """What `specray tune` needs beyond SweepSpec's own checks (a plain `specray run` needs none of it)."""
    t, grid = spec.tune, spec.teacher.temperatures
    problems = []
    if len(grid) < 2:
        problems.append(f"teacher.temperatures: a mixture needs at least 2 τ_kd, got {grid}")
    if t.space == "subset" and not 1 <= t.subset_size <= len(grid):
        problems.append(
            f"tune.subset_size: must be between 1 and {len(grid)} (the τ_kd grid), got {t.subset_size}"
        )
    missing = sorted(set(t.objective_temperatures) - set(spec.eval.temperatures))
    if missing:
        problems.append(
            f"tune.objective_temperatures: {missing} not in eval.temperatures {spec.eval.temperatures} "
            "(the training probe, ASHA's signal, measures acceptance at eval.temperatures)"
        )
    problems += spec.distill.grid_axes_problems("specray tune")
    grace = t.asha_grace_period * spec.distill.report_every
    if grace >= steps_budget(spec):
        problems.append(
            f"tune.asha_grace_period: {t.asha_grace_period} reports x distill.report_every "
            f"{spec.distill.report_every} = {grace} steps is not below the {steps_budget(spec)} steps "
            "per trial, so ASHA could never stop a trial"
        )
    if problems:
        raise SpecError("\n".join(problems))
