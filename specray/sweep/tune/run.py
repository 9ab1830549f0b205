"""`specray tune`: a Ray Tune search over mixtures of the cached τ_kd shards, against the paper's baselines,
with Table 3 measured at the budget drafts are served at.

The stages are the sweep's (`sweep/stages.py`: models, teacher shards, step costs, Train runs, keyed
cells); what the tune adds is the search and the two budgets. In order: (1) the zoo and every τ_kd shard,
so no trial ever starts a teacher; the step costs (those `specray run` timed for this sweep are reused);
(2) at the search budget (`tune.steps`, `search_stage.py`): one draft per single τ_kd of the grid, scored on
the validation split; the paper's manual recipe per objective τ_dec (top-k τ_kd around that τ_dec's peak);
the search: Optuna TPE (or random) proposes mixtures, ASHA stops trials whose acceptance estimate lags,
every trial is scored by the objective (mean analytic `speedup_model` over `tune.objective_temperatures` on
validation — never a test set); and the search's own Table 3 (its contenders on the test sets, one
training each); (3) at the full budget (`tune.final_steps`, `final.py`): the winner's recipe, the best single
τ_kd and the manual recipe retrained `tune.replicates` times and measured on the test sets — Table 3, with
intervals over training and prompts — and every single τ_kd once more, for the rank agreement between the
two budgets; (4) the report folder (`outputs.py`), MLflow (every trial and draft a child run) and the
winner's full-budget draft registered as a model: of its replicates, the one whose validation objective
is closest to their mean (`draft.representative`).

Resume: the search lives in `<output_dir>/<name>/tune/search` (Tune's experiment folder) and `--resume`
restores it with `Tuner.restore`: finished trials are kept, unfinished ones restart and resume from their
latest checkpoint; every draft published under its key (search or full budget), the step costs and every
cell saved under its key are reused; the unfinished MLflow parent run is continued.
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
from specray.draft import representative
from specray.errors import SpecError
from specray.files import write_atomic
from specray.keys import spec_key
from specray.names import TUNE_DIR, TUNE_REPORT, TUNE_STATE
from specray.progress import SweepDisplay
from specray.report.composition import Composition
from specray.report.table3 import RankAgreement, gain_intervals, rank_agreement
from specray.specdec.records import StepCosts
from specray.sweep.plan import SweepPlan, sweep_dir
from specray.sweep.stages import Stages
from specray.sweep.startup import started
from specray.sweep.tracked import DraftRuns, sweep_data
from specray.sweep.tune.baselines import table3
from specray.sweep.tune.driver import SEARCH_DIR, Tune
from specray.sweep.tune.final import Retrained, draft_objectives, rank_rows, retrain
from specray.sweep.tune.outputs import (
    CELLS_FILE,
    SEARCH_CELLS_FILE,
    cells_json,
    write_cells,
    write_records,
    write_tables,
)
from specray.sweep.tune.search import SearchFailed, TrialRecord
from specray.sweep.tune.search_stage import SearchRecord, search_budget
from specray.sweep.tune.space import check_tune, final_budget, steps_budget
from specray.tracking.client import open_tracker
from specray.tracking.lineage import draft_model
from specray.tracking.names import BEST

__all__ = ["SearchFailed", "TuneOutcome", "run_tune", "tune_dir"]

log = logging.getLogger(__name__)


@dataclass
class TuneOutcome:
    parent_run_id: str
    resumed: bool
    winner: TrialRecord
    table: pd.DataFrame  # Table 3 at the full budget, with its intervals
    markdown: str  # the report: Table 3, the rank agreement, the verdicts, the search's own Table 3
    report_dir: Path
    registered: tuple[str, str]  # (registered model, version)
    trials: list[TrialRecord]
    rank: RankAgreement
    step_costs: StepCosts
    figures: dict[str, Any] = field(default_factory=dict)  # what a results file records (SPECRAY_RECORD)
    stages: dict[str, dict[str, float]] = field(default_factory=dict)


def tune_dir(spec: SweepSpec) -> Path:
    return (sweep_dir(spec) / TUNE_DIR).absolute()


def _claim(out: Path, spec: SweepSpec, resume: bool) -> None:
    """The search's state file (the spec's key, with the tune section); a SpecError when the folder holds a
    search this call must not touch."""
    from ray.tune import Tuner

    path, key = out / TUNE_STATE, spec_key(spec, with_tune=True)
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
    with started(spec, check_tune, validation=True) as plan:
        return _run_tune(plan, resume, show_progress)


def _run_tune(plan: SweepPlan, resume: bool, show_progress: bool) -> TuneOutcome:
    spec, out = plan.spec, tune_dir(plan.spec)
    _claim(out, spec, resume)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.tune_parent_run(spec, resume)
    tracker.log_datasets(parent, sweep_data(plan).datasets())
    display = SweepDisplay(enabled=show_progress)
    with ray_session(spec.ray), display, Stages(plan, display) as stages:
        run = Tune(plan, out, stages, DraftRuns(tracker, parent, plan))
        stages.models()
        stages.generate()
        run.cost = stages.time_steps()
        tracker.log_metrics(parent, {"cost_ratio": run.cost.cost_ratio(run.cost.batch_sizes[0])})
        searched = search_budget(run, parent, resume)
        retrained = retrain(run, searched.finalists)
    return _finish(run, parent, resumed, searched, retrained)


def _finish(
    run: Tune, parent: str, resumed: bool, searched: SearchRecord, retrained: Retrained
) -> TuneOutcome:
    """Table 3 at both budgets and the rank agreement (printed by the CLI, saved, logged), the winner
    registered, every run finished."""
    assert run.cost is not None
    composition, rank, markdown = _write_report(run, parent, searched, retrained)
    winner, tracker = searched.winner, run.runs.tracker
    assert winner.objective is not None, "the winner is a completed trial, whose objective was measured"
    rank_metrics = {f"rank/{k}": v for k, v in (("rho", rank.rho), ("low", rank.low), ("high", rank.high))}
    metrics = _gains(composition.table3) | _gains(searched.table, "search_") | rank_metrics
    finite = {k: v for k, v in metrics.items() if v == v}  # ρ has no interval below MIN_RECIPES recipes
    tracker.log_metrics(parent, finite | {"objective/best": winner.objective})
    registered = _register(run, parent, winner, retrained)
    run.runs.finish()
    tracker.finish(parent)
    figures = _figures(run.spec, composition.table3, rank, searched.trials)
    return TuneOutcome(
        parent,
        resumed,
        winner,
        composition.table3,
        markdown,
        run.out / TUNE_REPORT,
        registered,
        searched.trials,
        rank,
        run.cost,
        figures,
        run.stages.display.summary,
    )


def _write_report(
    run: Tune, parent: str, searched: SearchRecord, retrained: Retrained
) -> tuple[Composition, RankAgreement, str]:
    """The report folder (`outputs.py`), logged to the parent run: Table 3 with its intervals, the rank
    agreement, the search's own Table 3, the cells, the trials and the export's records."""
    spec, report_dir = run.spec, run.out / TUNE_REPORT
    assert run.cost is not None
    cells = cells_json([*retrained.validation, *retrained.tests], retrained.recipes)
    report_dir.mkdir(parents=True, exist_ok=True)
    write_cells(report_dir, CELLS_FILE, cells)
    write_cells(report_dir, SEARCH_CELLS_FILE, cells_json([*searched.validation, *searched.tests], {}))
    table = table3(retrained.tests, retrained.contenders, retrained.recipes)
    composition = Composition(table, pd.DataFrame(cells))
    taus = spec.tune.objective_temperatures
    rank = rank_agreement(rank_rows(searched.finalists, retrained, searched.validation, taus))
    composition = replace(composition, table3=gain_intervals(composition), rank=rank.recipes)
    title = (
        f"Table 3 — {spec.name}: tuned mixture vs best single τ_kd vs manual recipe ({spec.tune.paradigm}), "
        f"retrained at {final_budget(spec)} steps, {spec.tune.replicates} replicate(s) each"
    )
    markdown = write_tables(report_dir, composition, rank, (searched.table, searched.markdown), title)
    write_records(report_dir, spec, parent, retrained.compared, run.cost)
    pd.DataFrame([_trial_row(t) for t in searched.trials]).to_csv(report_dir / "trials.csv", index=False)
    run.runs.tracker.log_artifacts(parent, report_dir, "report")
    return composition, rank, markdown


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


def _gains(frame: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    """Parent-run metrics: the relative gains of a Table 3 per test set and τ_dec."""
    metrics = {}
    for row in frame.to_dict("records"):
        where = f"{row['test_set']}/tau_dec_{row['tau_dec']:g}"
        metrics[f"{prefix}tuned_gain/{where}"] = row["tuned gain"]
        metrics[f"{prefix}manual_gain/{where}"] = row["manual gain"]
        for who in ("tuned", "manual"):  # `tune.controls`
            if f"{who} vs control" in row:
                metrics[f"{prefix}{who}_vs_control/{where}"] = row[f"{who} vs control"]
    return metrics


def _figures(spec: SweepSpec, table: pd.DataFrame, rank: RankAgreement, trials: list[TrialRecord]) -> dict:
    """A results file's figures (`specray/cli/results.py`): the budgets, the gains with their intervals,
    the rank agreement and the trials."""
    gains: dict[str, dict[str, float | None]] = {}
    for row in table.to_dict("records"):
        where = f"{row['test_set']}_tau_dec_{row['tau_dec']:g}".replace(".", "_")
        for who in ("tuned", "manual"):
            columns = {"gain": f"{who} gain", "gain_low": f"{who} gain low", "gain_high": f"{who} gain high"}
            gains[f"{who}_{where}"] = {key: _finite(row.get(column)) for key, column in columns.items()}
            versus = f"{who} vs control"  # `tune.controls`: the gain over the same samples at one τ_kd
            if versus in row:
                columns = {"gain": versus, "gain_low": f"{versus} low", "gain_high": f"{versus} high"}
                gains[f"{who}_vs_control_{where}"] = {key: _finite(row.get(c)) for key, c in columns.items()}
    completed = sum(t.status == "completed" for t in trials)
    return {
        "search_steps": steps_budget(spec),
        "final_steps": final_budget(spec),
        "replicates": spec.tune.replicates,
        "trials": len(trials),
        "completed_trials": completed,
        "gains": gains,
        "rank": {
            "rho": _finite(rank.rho),
            "low": _finite(rank.low),
            "high": _finite(rank.high),
            "recipes": len(rank.recipes),
        },
        # each role's best validation objective at the full budget: the best single τ_kd there may not be
        # Table 3's (the search budget's choice)
        "full_objective": {
            role: found[1] for role in ("single", "manual", "tuned") if (found := rank.best(role))
        },
    }


def _finite(value: Any) -> float | None:
    """A figure, or None where there is none (a results file leaves those out)."""
    return float(value) if value is not None and value == value else None


def _register(run: Tune, parent: str, winner: TrialRecord, retrained: Retrained) -> tuple[str, str]:
    """Register the winner's full-budget draft — of its replicates, the one whose validation objective is
    closest to their mean — as a model with its mixture as tags, and tag the winning trial best."""
    spec, tracker, recipe = run.spec, run.runs.tracker, winner.recipe
    name = spec.tune.registered_model or f"{spec.name}-tuned-draft"
    objectives = draft_objectives(retrained.validation, spec.tune.objective_temperatures)
    replicates = {d.name: d for d in retrained.replicates(retrained.contenders.tuned)}
    chosen = replicates[representative({n: objectives[n] for n in replicates})]
    run_id = run.runs.runs[chosen.name]
    model_id = tracker.log_draft_model(run_id, draft_model(chosen))
    tracker.set_tags(winner.run_id, {BEST: "true"})
    tracker.set_tags(parent, {"best_trial": winner.trial_id, "best_mixture": recipe.mixture_tag})
    tags = {
        "mixture": recipe.mixture_tag,
        "paradigm": recipe.paradigm,
        "trial_id": winner.trial_id,
        "objective": f"{winner.objective:.6g}",
        "full_budget_objective": f"{objectives[chosen.name]:.6g}",
        "steps": str(final_budget(spec)),
        "replicate": f"{chosen.replicate} of {len(replicates)} (closest to their mean objective)",
        "objective_temperatures": json.dumps(spec.tune.objective_temperatures),
        "sweep": spec.name,
        **{f"distill.{k}": str(v) for k, v in recipe.distill.items() if k != "steps"},
    }
    version = tracker.register_draft(name, run_id, model_id, tags)
    return name, version
