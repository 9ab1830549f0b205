"""The search budget (`tune.steps`): one draft per single τ_kd of the grid scored on validation, the paper's
manual recipe around each objective τ_dec's peak, the Ray Tune search over mixtures, and the search's own
Table 3 (its contenders trained once each at this budget, measured on the test sets) — kept as the
search's record; Table 3 proper is measured at the full budget (`final.py`).

Why a trial runs the train loop (`loop.train_draft`) in its own process instead of a Ray Train run nested
in the trial: nested, each trial would hold a Tune actor, a Train controller and its worker group plus a
queue actor — on a 2-CPU machine the trial actor must be given 0 CPUs to let even one worker run, the two
levels of failure handling (Train restarts its workers, Tune restarts the trial) interleave, and every
trial pays Train's start-up, longer than a whole micro trial. The baselines go through the stage runner's
Train runs like a sweep's drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from specray.draft import Draft
from specray.report.best import best_gamma_records
from specray.specdec.records import CellRecord
from specray.sweep.plan import VALIDATION
from specray.sweep.tune.baselines import Contenders, manual_recipe, peaks, table3, table3_markdown
from specray.sweep.tune.driver import SEARCH_DIR, TRIALS_DIR, TUNED, Tune
from specray.sweep.tune.final import Finalists
from specray.sweep.tune.search import TrialRecord, record_trials, search
from specray.sweep.tune.space import baseline_recipe, final_budget, steps_budget
from specray.sweep.tune.trial import TrialContext


@dataclass(frozen=True)
class SearchRecord:
    """What the search budget measured: its drafts' validation and test cells (every γ), its own Table 3,
    every trial and the winner."""

    finalists: Finalists
    validation: list[CellRecord]
    tests: list[CellRecord]
    table: pd.DataFrame
    markdown: str
    trials: list[TrialRecord]
    winner: TrialRecord
    tuned: Draft  # the winning trial's own draft


def search_budget(run: Tune, parent: str, resume: bool) -> SearchRecord:
    """Singles, manual recipes, the search, and the search's Table 3 (test sets, one training each)."""
    spec, display = run.spec, run.stages.display
    singles = {tau: run.draft(baseline_recipe(spec, {tau: 1.0})) for tau in spec.teacher.temperatures}
    run.distill(list(singles.values()), "single", "single τ_kd drafts")
    validation = run.evaluate(list(singles.values()), [VALIDATION], "validation")
    contenders, manual, peak = _manual_baselines(run, singles, best_gamma_records(validation))
    run.stages.release_pool()  # its actors would hold the CPUs the trials need
    with display.stage("search", spec.tune.num_samples, "trial"):
        results = search(spec, trial_context(run), run.out / SEARCH_DIR, resume, display.advance)
    trials, winner = record_trials(spec, run.runs.tracker, parent, results, run.out / TRIALS_DIR)
    tuned = run.draft(winner.recipe, name=TUNED + winner.recipe.name)
    tuned = replace(tuned, folder=Path(winner.draft_dir))  # the winning trial's own draft
    run.runs.runs[tuned.name] = winner.run_id
    unique_manual = list({d.name: d for d in manual.values()}.values())
    validation += run.evaluate([tuned, *unique_manual], [VALIDATION], "validation")
    chosen = {*contenders.single.values(), *contenders.manual.values()}
    baselines = {d.name: d for d in [*singles.values(), *unique_manual] if d.name in chosen}
    tests = run.evaluate([tuned, *baselines.values()], list(spec.eval.test_sets), "test sets")
    tag = winner.recipe.mixture_tag
    contenders = replace(contenders, tuned=tuned.name, labels=contenders.labels | {tuned.name: tag})
    frame = table3(tests, contenders)
    title = (
        f"Table 3 at the search budget ({steps_budget(spec)} steps, one training each) — {spec.name}: tuned "
        f"mixture vs best single τ_kd vs manual recipe ({spec.tune.paradigm})"
    )
    final = final_budget(spec)
    drafts = {baseline_recipe(spec, {tau: 1.0}, final).name: d for tau, d in singles.items()}
    drafts |= {baseline_recipe(spec, d.mixture, final).name: d for d in unique_manual}
    drafts[TUNED + winner.recipe.name] = tuned
    manual_mixtures = {tau_dec: dict(d.mixture) for tau_dec, d in manual.items()}
    finalists = Finalists(peak, manual_mixtures, winner.recipe, drafts)
    markdown = table3_markdown(frame, tag, title)
    return SearchRecord(finalists, validation, tests, frame, markdown, trials, winner, tuned)


def trial_context(run: Tune) -> TrialContext:
    """What every trial shares: the rows of every τ_kd shard (read once, here), the models, the validation
    prompts and the step costs."""
    from specray.distill.inputs import prepare_inputs

    spec = run.spec
    all_tau_kd = run.draft(baseline_recipe(spec, dict.fromkeys(spec.teacher.temperatures, 1.0)))
    inputs = prepare_inputs(all_tau_kd, run.plan.splits)
    assert run.cost is not None
    trials_dir = str(run.out / TRIALS_DIR)
    shard_keys = dict(run.plan.shards[0].keys)
    prompts = run.stages.prompts[VALIDATION]
    return TrialContext(spec.model_dump(mode="json"), inputs, prompts, run.cost, trials_dir, shard_keys)


def _manual_baselines(
    run: Tune, singles: dict[float, Draft], validation: list[CellRecord]
) -> tuple[Contenders, dict[float, Draft], dict[float, float]]:
    """Per objective τ_dec: the best single τ_kd on validation (its peak) and the manual recipe around it."""
    spec = run.spec
    tau_kd_of = {draft.name: tau for tau, draft in singles.items()}
    by_tau_dec = peaks(validation, tau_kd_of)
    manual: dict[float, Draft] = {}
    for tau_dec, peak in by_tau_dec.items():
        recipe = manual_recipe(spec.teacher.temperatures, peak, spec.tune.manual_top_k)
        manual[tau_dec] = run.draft(baseline_recipe(spec, recipe))
    unique = list({draft.name: draft for draft in manual.values()}.values())
    run.distill(unique, "manual", "manual recipes")
    labels = {singles[peak].name: f"{peak:g}" for peak in by_tau_dec.values()}
    labels |= {draft.name: "+".join(f"{tau:g}" for tau in sorted(draft.mixture)) for draft in unique}
    contenders = Contenders(
        tuned="",
        single={tau_dec: singles[peak].name for tau_dec, peak in by_tau_dec.items()},
        manual={tau_dec: draft.name for tau_dec, draft in manual.items()},
        labels=labels,
    )
    return contenders, manual, by_tau_dec
