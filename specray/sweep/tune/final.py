"""The full budget: Table 3's drafts retrained at the budget drafts are served at (`space.final_budget`).

The search ranks recipes on a short budget (`tune.steps`), where a draft is far from trained; what a user
serves is trained to the sweep's budget. So after the search, each contender — the winner's recipe, the
best single τ_kd and the manual recipe per objective τ_dec (both chosen on validation at the search budget)
— is trained again at the full budget, `tune.replicates` times (replicate r with distill.seed + r), and
measured on the test sets: Table 3. Every other single τ_kd of the grid is trained once at the full budget
too and, with the rest, measured on validation: the recipes whose search-budget and full-budget objectives
the rank agreement compares (`report.table3`).

These are ordinary drafts of their recipes (`Tune.draft`): a full-budget single τ_kd whose settings agree
with a finished `specray run` is that sweep's draft and is reused, not trained (at the default budget,
`tiny.yaml`'s 400 steps for `tune_tiny.yaml`); on `--resume` every draft published under its key is reused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pandas as pd

from specray.draft import Draft
from specray.report.table3 import RANK_COLUMNS
from specray.specdec.records import CellRecord
from specray.sweep.plan import VALIDATION
from specray.sweep.tune.baselines import Contenders
from specray.sweep.tune.driver import TUNED, Tune, one_folder_per_key
from specray.sweep.tune.space import Recipe, at_budget, baseline_recipe, final_budget, objective


@dataclass(frozen=True)
class Finalists:
    """What the search leaves for the full budget: per objective τ_dec the best single τ_kd and the manual
    recipe (chosen on validation at the search budget), the winner's recipe, and each recipe's search-budget
    draft (for the rank agreement: recipe name at the full budget -> its search-budget draft)."""

    single: Mapping[float, float]  # τ_dec -> τ_kd
    manual: Mapping[float, Mapping[float, float]]  # τ_dec -> mixture
    winner: Recipe
    drafts: Mapping[str, Draft]


@dataclass(frozen=True)
class Retrained:
    """The full budget's drafts and what they measured."""

    drafts: tuple[Draft, ...]  # every draft trained (or found) at the full budget
    contenders: Contenders  # Table 3's names: recipes, each with `tune.replicates` drafts
    validation: tuple[CellRecord, ...]  # every draft's validation cells (every γ)
    tests: tuple[CellRecord, ...]  # the contenders' replicates on the test sets (every γ)

    @property
    def recipes(self) -> dict[str, str]:
        """Draft name -> its recipe's (a replicate's name -> its contender's)."""
        return {draft.name: draft.recipe for draft in self.drafts}

    @property
    def compared(self) -> list[Draft]:
        """The drafts Table 3 compares: every replicate of its contenders (the export's candidates)."""
        names = self.contenders.names
        return [draft for draft in self.drafts if draft.recipe in names]

    def replicates(self, recipe: str) -> list[Draft]:
        return [draft for draft in self.drafts if draft.recipe == recipe]


def retrain(run: Tune, finalists: Finalists) -> Retrained:
    """Train (or reuse) every full-budget draft and measure it: every single τ_kd once on validation, the
    contenders' replicates on validation and the test sets."""
    spec, steps = run.spec, final_budget(run.spec)
    single = {tau: baseline_recipe(spec, {tau: 1.0}, steps) for tau in spec.teacher.temperatures}
    manual = {tau_dec: baseline_recipe(spec, mixture, steps) for tau_dec, mixture in finalists.manual.items()}
    tuned = at_budget(finalists.winner, steps)
    recipes = {single[tau].name: single[tau] for tau in finalists.single.values()}
    recipes |= {recipe.name: recipe for recipe in manual.values()} | {TUNED + tuned.name: tuned}
    replicates = range(spec.tune.replicates)
    planned = [run.draft(recipe) for recipe in single.values()]
    planned += [run.draft(recipe, r, name=name) for name, recipe in recipes.items() for r in replicates]
    controls: dict[str, dict[float, str]] = {}
    if spec.tune.controls:  # each mixture's samples at that τ_dec's best single τ_kd
        mixtures = {"manual": manual, "tuned": dict.fromkeys(finalists.single, tuned)}
        for who, by_tau_dec in mixtures.items():
            for tau_dec, recipe in by_tau_dec.items():
                if len(recipe.mixture) < 2:
                    continue  # one τ_kd: its own samples; nothing to control
                drafts = [run.control(recipe, finalists.single[tau_dec], r) for r in replicates]
                controls.setdefault(who, {})[tau_dec] = drafts[0].recipe
                planned += drafts
    searched_folders = {d.key: d.folder for d in finalists.drafts.values()}  # equal budgets: the search's
    planned = [replace(d, folder=searched_folders.get(d.key, d.folder)) for d in planned]
    full_budget = list({d.name: d for d in one_folder_per_key(planned)}.values())
    compared_recipes = set(recipes) | {name for by_tau in controls.values() for name in by_tau.values()}
    compared = [d for d in full_budget if d.recipe in compared_recipes]
    run.distill(full_budget, "final", "retrained drafts")  # stage names: results files key them (no commas)
    validation = run.evaluate(full_budget, [VALIDATION], "retrained validation")
    tests = run.evaluate(compared, list(spec.eval.test_sets), "retrained test sets")
    labels = {single[tau].name: f"{tau:g}" for tau in finalists.single.values()}
    labels |= {r.name: "+".join(f"{tau:g}" for tau in sorted(r.mixture)) for r in manual.values()}
    labels |= {d.recipe: f"{d.tau_kd:g} × {len(d.samples)} samples" for d in full_budget if d.samples}
    contenders = Contenders(
        tuned=TUNED + tuned.name,
        single={tau_dec: single[tau].name for tau_dec, tau in finalists.single.items()},
        manual={tau_dec: recipe.name for tau_dec, recipe in manual.items()},
        labels=labels | {TUNED + tuned.name: tuned.mixture_tag},
        controls={who: by_tau for who, by_tau in controls.items() if len(by_tau) == len(finalists.single)},
    )
    return Retrained(tuple(full_budget), contenders, tuple(validation), tuple(tests))


def draft_objectives(records: Sequence[CellRecord], taus_dec: Sequence[float]) -> dict[str, float]:
    """Each draft's validation objective (`space.objective`) from its records."""
    by_draft: dict[str, list[CellRecord]] = {}
    for record in records:
        if record.test_set == VALIDATION:
            by_draft.setdefault(record.draft, []).append(record)
    return {draft: objective(rs, taus_dec) for draft, rs in by_draft.items()}


def rank_rows(
    finalists: Finalists, retrained: Retrained, search_validation: Sequence[CellRecord], taus: Sequence[float]
) -> pd.DataFrame:
    """One row per recipe retrained at the full budget (a recipe once, however many names it has): its
    validation objective at the search budget (its search draft's) and at the full budget (the mean over
    its replicates)."""
    search = draft_objectives(search_validation, taus)
    full = draft_objectives(retrained.validation, taus)
    rows, seen = [], set()
    for recipe, searched_draft in finalists.drafts.items():
        replicates = retrained.replicates(recipe)
        if not replicates or replicates[0].key in seen or searched_draft.name not in search:
            continue
        seen.add(replicates[0].key)
        values = [full[d.name] for d in replicates if d.name in full]
        rows.append(
            {
                "recipe": recipe,
                "role": _role(recipe, searched_draft),
                "search objective": search[searched_draft.name],
                "full objective": sum(values) / len(values),
                "replicates": len(values),
            }
        )
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS))


def _role(recipe: str, searched: Draft) -> str:
    if recipe.startswith(TUNED):
        return "tuned"
    return "single" if len(searched.mixture) == 1 else "manual"
