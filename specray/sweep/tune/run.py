"""`specray tune`: a Ray Tune search over mixtures of the cached τ_kd shards, against the paper's baselines.

The stages are the sweep's (`sweep/stages.py`: models, teacher shards, step costs, Train runs for every
baseline draft, keyed cells); what the tune adds is the search. In order: (1) the zoo and every τ_kd shard,
so no trial ever starts a teacher; the step costs (those `specray run` timed for this sweep are reused);
(2) one draft per single τ_kd of the grid, scored on the validation split; (3) the paper's manual recipe
per objective τ_dec (top-k τ_kd around that τ_dec's peak); (4) the search: Optuna TPE (or random)
proposes mixtures, ASHA stops trials whose acceptance estimate lags, every trial is scored by the
objective (mean analytic `speedup_model` over `tune.objective_temperatures` on validation — never a test
set); (5) the winner, the best single τ_kd and the manual recipe (each `tune.replicates` times) measured
on the test sets: Table 3, printed, saved as Markdown and CSV, and logged to MLflow with every trial as a
child run and the winner registered as a model. Trials and baselines train with the same step budget.

Why a trial runs the train loop (`loop.train_draft`) in its own process instead of a Ray Train run nested
in the trial: nested, each trial would hold a Tune actor, a Train controller and its worker group plus a
queue actor — on a 2-CPU machine the trial actor must be given 0 CPUs to let even one worker run, the two
levels of failure handling (Train restarts its workers, Tune restarts the trial) interleave, and every
trial pays Train's start-up, longer than a whole micro trial. The baselines go through the stage runner's
Train runs like a sweep's drafts; a finished `specray run` draft with the same key is reused.

Resume: the search lives in `<output_dir>/<name>/tune/search` (Tune's experiment folder) and `--resume`
restores it with `Tuner.restore`: finished trials are kept, unfinished ones restart and resume from their
latest checkpoint; finished baseline drafts, the step costs and every cell saved under its key are reused;
the unfinished MLflow parent run is continued.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from specray.cluster.runtime import ray_session
from specray.config import SweepSpec
from specray.distill.checkpoints import is_finished
from specray.draft import Draft, draft_folder_name, plan_draft, replicate_name
from specray.errors import SpecError
from specray.files import write_atomic
from specray.locks import output_folder
from specray.report.best import best_gamma_records
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.plan import VALIDATION, SweepPlan, plan_shards, plan_sweep, sweep_dir
from specray.sweep.progress import SweepDisplay
from specray.sweep.stages import Stages
from specray.sweep.tracked import DraftRuns, sweep_data
from specray.sweep.tune.baselines import (
    Contenders,
    manual_recipe,
    peaks,
    table3,
    table3_markdown,
    write_table3,
)
from specray.sweep.tune.search import SearchFailed, TrialRecord, record_trials, search
from specray.sweep.tune.space import (
    Recipe,
    baseline_recipe,
    budget_spec,
    check_tune,
    tune_grid,
)
from specray.sweep.tune.trial import TrialContext
from specray.tracking.client import open_tracker, sweep_key
from specray.tracking.lineage import draft_model
from specray.tracking.names import BEST

__all__ = ["SearchFailed", "TuneOutcome", "run_tune", "tune_dir"]

log = logging.getLogger(__name__)

SEARCH_DIR, TRIALS_DIR, BASELINES_DIR, REPORT_DIR, CELLS_DIR = (
    "search",
    "trials",
    "baselines",
    "report",
    "cells",
)
STATE_FILE = "tune.json"
TUNED = "tuned:"  # prefix of the winner's name in records: its recipe may equal a baseline's


@dataclass
class TuneOutcome:
    parent_run_id: str
    resumed: bool
    winner: TrialRecord
    table: pd.DataFrame
    markdown: str
    report_dir: Path
    registered: tuple[str, str]  # (registered model, version)
    trials: list[TrialRecord]
    stages: dict[str, dict[str, float]] = field(default_factory=dict)


def tune_dir(spec: SweepSpec) -> Path:
    return (sweep_dir(spec) / "tune").absolute()


def _claim(out: Path, spec: SweepSpec, resume: bool) -> None:
    """The search's state file (the spec's key, with the tune section); a SpecError when the folder holds a
    search this call must not touch."""
    from ray.tune import Tuner

    path, key = out / STATE_FILE, sweep_key(spec, with_tune=True)
    saved = json.loads(path.read_text()).get("key", key) if path.exists() else key
    if not resume and Tuner.can_restore(out / SEARCH_DIR):
        raise SpecError(
            f"{out} already holds a search: add --resume to continue it, or delete it to start over"
        )
    if resume and saved != key:
        raise SpecError(f"{out}: the spec changed since this search started; --resume needs the same spec")
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps({"key": key}, indent=2)))


def run_tune(spec: SweepSpec, resume: bool = False, show_progress: bool = True) -> TuneOutcome:
    """Run (or with `resume` continue) the search, its baselines and Table 3. Holds the sweep's output
    folder (its drafts and step costs are shared with `specray run`) for the whole search."""
    check_tune(spec)
    with output_folder(sweep_dir(spec)):
        return _run_tune(spec, resume, show_progress)


@dataclass
class _Tune:
    """What the steps of one search share."""

    plan: SweepPlan
    out: Path
    stages: Stages
    runs: DraftRuns
    cost: StepCosts | None = None

    @property
    def spec(self) -> SweepSpec:
        return self.plan.spec

    def draft(self, recipe: Recipe, replicate: int = 0, name: str = "") -> Draft:
        """The draft of a recipe at the search's budget: `specray run`'s draft if it was trained with this
        budget, else one in the tune's `baselines/` folder."""
        spec, train = budget_spec(self.spec, recipe), self.plan.splits["train"]
        own = replicate and spec.teacher.replicate_shards  # its own teacher sample, seed + replicate
        keys = plan_shards(spec.for_replicate(replicate), train).keys if own else self.plan.shards[0].keys
        name = replicate_name(name or recipe.name, replicate)
        folder_name = draft_folder_name(name.replace(TUNED, "tuned__"))

        def folder(key: str) -> Path:
            in_sweep = self.plan.drafts_dir / folder_name
            return (
                in_sweep if is_finished(in_sweep, key) else self.out / BASELINES_DIR / folder_name
            ).absolute()

        return plan_draft(spec, keys, recipe.paradigm, recipe.mixture, replicate, name=name, folder=folder)

    def distil(self, drafts: list[Draft], role: str, stage: str) -> None:
        """Train (or reuse) `drafts` through the stage runner, each logged to a child run tagged `role`."""
        self.runs.open(drafts, {"tune_role": role})
        first, train = self.plan.shards[0], self.plan.splits["train"]
        own = [d for d in drafts if any(first.keys.get(tau) != key for tau, key in d.shards.items())]
        if own:  # replicates with their own teacher sample (teacher.replicate_shards)
            self.stages.generate([plan_shards(d.train_spec, train) for d in own])
        self.stages.distil(drafts, self.runs.draft_done, stage=stage)

    def evaluate(self, drafts: list[Draft], test_sets: list[str], stage: str) -> list[CellRecord]:
        """Analytic cells of `drafts` at every objective τ_dec and γ on `test_sets`; each record at its
        draft's best γ is returned (the others go to MLflow and the cells folder too)."""
        assert self.cost is not None, "the step costs are measured before any cell"
        jobs = self.plan.cell_jobs(self.cost, drafts, tune_grid(self.spec, test_sets))
        records = self.stages.evaluate(jobs, self.cost, self.runs.records_done, self.out / CELLS_DIR, stage)
        return best_gamma_records(records)


def _run_tune(spec: SweepSpec, resume: bool, show_progress: bool) -> TuneOutcome:
    out = tune_dir(spec)
    _claim(out, spec, resume)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.tune_parent_run(spec, resume)
    plan = plan_sweep(spec, validation=True)
    tracker.log_datasets(parent, sweep_data(plan).everything())
    display = SweepDisplay(enabled=show_progress)
    with ray_session(spec.ray), display, Stages(plan, display) as stages:
        run = _Tune(plan, out, stages, DraftRuns(tracker, parent, plan))
        stages.models()
        stages.generate()
        run.cost = stages.time_steps()
        tracker.log_metrics(parent, {"cost_ratio": run.cost.cost_ratio(run.cost.batch_sizes[0])})
        singles = {tau: run.draft(baseline_recipe(spec, {tau: 1.0})) for tau in spec.teacher.temperatures}
        run.distil(list(singles.values()), "single", "single τ_kd drafts")
        validation = run.evaluate(list(singles.values()), [VALIDATION], "validation")
        contenders, manual = _manual_baselines(run, singles, validation)
        with display.stage("search", spec.tune.num_samples, "trial"):
            results = search(spec, _trial_context(run), out / SEARCH_DIR, resume, display.advance)
        trials, winner = record_trials(spec, tracker, parent, results, out / TRIALS_DIR)
        tuned = run.draft(winner.recipe, name=TUNED + winner.recipe.name)
        tuned = replace(tuned, folder=Path(winner.draft_dir))  # the winning trial's own draft
        run.runs.runs[tuned.name] = winner.run_id
        chosen = {*contenders.single.values(), *contenders.manual.values()}
        baselines = {d.name: d for d in [*singles.values(), *manual.values()] if d.name in chosen}
        compared = [tuned, *baselines.values()]
        replicates = _replicates(run, compared, winner.recipe)
        records = run.evaluate([*compared, *replicates], list(spec.eval.test_sets), "test sets")
    recipes = {draft.name: draft.recipe for draft in [*compared, *replicates]}  # replicates -> their recipe
    contenders = replace(contenders, tuned=tuned.name)
    return _finish(run, parent, resumed, validation + records, records, recipes, contenders, winner, trials)


def _trial_context(run: _Tune) -> TrialContext:
    """What every trial shares: the rows of every τ_kd shard (read once, here), the models, the validation
    prompts and the step costs."""
    from specray.distill.inputs import prepare_inputs

    spec = run.spec
    everything = run.draft(baseline_recipe(spec, dict.fromkeys(spec.teacher.temperatures, 1.0)))
    inputs = prepare_inputs(everything, run.plan.splits)
    assert run.cost is not None
    trials_dir = str(run.out / TRIALS_DIR)
    shard_keys = dict(run.plan.shards[0].keys)
    prompts = run.stages.prompts[VALIDATION]
    return TrialContext(spec.model_dump(mode="json"), inputs, prompts, run.cost, trials_dir, shard_keys)


def _manual_baselines(
    run: _Tune, singles: dict[float, Draft], validation: list[CellRecord]
) -> tuple[Contenders, dict[float, Draft]]:
    """Per objective τ_dec: the best single τ_kd on validation and the manual recipe around it."""
    spec = run.spec
    tau_kd_of = {draft.name: tau for tau, draft in singles.items()}
    by_tau_dec = peaks(validation, tau_kd_of)
    manual: dict[float, Draft] = {}
    for tau_dec, peak in by_tau_dec.items():
        recipe = manual_recipe(spec.teacher.temperatures, peak, spec.tune.manual_top_k)
        manual[tau_dec] = run.draft(baseline_recipe(spec, recipe))
    unique = list({draft.name: draft for draft in manual.values()}.values())
    run.distil(unique, "manual", "manual recipes")
    labels = {singles[peak].name: f"{peak:g}" for peak in by_tau_dec.values()}
    labels |= {draft.name: "+".join(f"{tau:g}" for tau in sorted(draft.mixture)) for draft in unique}
    contenders = Contenders(
        tuned="",
        single={tau_dec: singles[peak].name for tau_dec, peak in by_tau_dec.items()},
        manual={tau_dec: draft.name for tau_dec, draft in manual.items()},
        labels=labels,
    )
    return contenders, manual


def _replicates(run: _Tune, compared: list[Draft], tuned: Recipe) -> list[Draft]:
    """Replicates 1 … N−1 (`tune.replicates`) of every draft Table 3 compares — the winner's recipe, each
    best single τ_kd and each manual recipe — trained with distill.seed + r under the same budget, in
    `baselines/` (reused by key on a resumed search). Replicate 0 is the draft the search already has."""
    spec = run.spec
    drafts = []
    for replicate in range(1, spec.tune.replicates):
        for draft in compared:
            recipe = tuned if draft.name.startswith(TUNED) else baseline_recipe(spec, draft.mixture)
            drafts.append(run.draft(recipe, replicate, name=draft.name))
    if drafts:
        run.distil(drafts, "replicate", "replicates")
    return drafts


def _finish(
    run: _Tune,
    parent: str,
    resumed: bool,
    everything: list[CellRecord],
    records: list[CellRecord],
    recipes: dict[str, str],
    contenders: Contenders,
    winner: TrialRecord,
    trials: list[TrialRecord],
) -> TuneOutcome:
    """Table 3 (printed by the CLI, saved, logged), the winner registered, every run finished."""
    spec, tracker = run.spec, run.runs.tracker
    tuned_label = winner.recipe.mixture_tag
    contenders = replace(contenders, labels=contenders.labels | {contenders.tuned: tuned_label})
    frame = table3(records, contenders, recipes)
    title = (
        f"Table 3 — {spec.name}: tuned mixture vs best single τ_kd vs manual recipe ({spec.tune.paradigm})"
    )
    markdown = table3_markdown(frame, tuned_label, title)
    report_dir = run.out / REPORT_DIR
    write_table3(frame, markdown, report_dir)
    pd.DataFrame([_trial_row(t) for t in trials]).to_csv(report_dir / "trials.csv", index=False)
    cells = [record.flat() | {"recipe": recipes.get(record.draft, record.draft)} for record in everything]
    (report_dir / "cells.json").write_text(json.dumps(cells, indent=1))
    tracker.log_artifacts(parent, report_dir, "report")
    assert winner.objective is not None, "the winner is a completed trial, whose objective was measured"
    tracker.log_metrics(parent, _gains(frame) | {"objective/best": winner.objective})
    registered = _register(run, parent, winner)
    run.runs.finish()
    tracker.finish(parent)
    return TuneOutcome(
        parent, resumed, winner, frame, markdown, report_dir, registered, trials, run.stages.display.summary
    )


def _trial_row(trial: TrialRecord) -> dict[str, Any]:
    recipe = trial.recipe
    return {
        "trial_id": trial.trial_id,
        "status": trial.status,
        "paradigm": recipe.paradigm,
        "mixture": recipe.mixture_tag,
        "objective": trial.objective,
        **{k: v for k, v in recipe.distill.items() if k != "steps"},
    }


def _gains(frame: pd.DataFrame) -> dict[str, float]:
    """Parent-run metrics: the relative gains of Table 3 per test set and τ_dec."""
    metrics = {}
    for row in frame.to_dict("records"):
        where = f"{row['test_set']}/tau_dec_{row['tau_dec']:g}"
        metrics[f"tuned_gain/{where}"] = row["tuned gain"]
        metrics[f"manual_gain/{where}"] = row["manual gain"]
    return metrics


def _register(run: _Tune, parent: str, winner: TrialRecord) -> tuple[str, str]:
    """Log the winner's draft as its trial run's model, tag it best and register that model with its
    mixture as tags."""
    spec, tracker, recipe = run.spec, run.runs.tracker, winner.recipe
    name = spec.tune.registered_model or f"{spec.name}-tuned-draft"
    draft = replace(run.draft(recipe), folder=Path(winner.draft_dir))
    model_id = tracker.log_draft_model(winner.run_id, draft_model(draft))
    tracker.set_tags(winner.run_id, {BEST: "true"})
    tracker.set_tags(parent, {"best_trial": winner.trial_id, "best_mixture": recipe.mixture_tag})
    tags = {
        "mixture": recipe.mixture_tag,
        "paradigm": recipe.paradigm,
        "trial_id": winner.trial_id,
        "objective": f"{winner.objective:.6g}",
        "objective_temperatures": json.dumps(spec.tune.objective_temperatures),
        "sweep": spec.name,
        **{f"distill.{k}": str(v) for k, v in recipe.distill.items()},
    }
    version = tracker.register_draft(name, winner.run_id, model_id, tags)
    return name, version
