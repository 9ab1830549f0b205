"""`specray tune`: a Ray Tune search over mixtures of the cached τ_kd shards, against the paper's baselines.

Stages, on the driver: (1) the zoo and every τ_kd shard — generated here if missing, before the search, so
no trial ever starts a teacher; (2) one draft per single τ_kd of the grid, scored on the validation split;
(3) the paper's manual recipe per objective τ_dec (top-k τ_kd around that τ_dec's peak); (4) the search:
Optuna TPE (or random) proposes mixtures, ASHA stops trials whose acceptance estimate lags, every trial is
scored by the objective (mean analytic `speedup_model` over `tune.objective_temperatures` on validation —
never a test set); (5) the winner, the best single τ_kd and the manual recipe measured on the test sets:
Table 3, printed, saved as Markdown and CSV, and logged to MLflow with every trial as a child run and the
winner registered as a model. Trials and baselines train with the same step budget, through the same code.

Why a trial runs the train loop (`loop.train_draft`, the loop `specray distill` runs under Ray Train) in its
own process instead of `ray_train.distill` (Ray Train nested in the trial, with Tune's
`TuneReportCallback`): nested, each trial would hold a Tune actor, a Train controller and its worker group
plus a queue actor — on a 2-CPU machine the trial actor must be given 0 CPUs to let even one worker run, the
two levels of failure handling (Train restarts its workers, Tune restarts the trial) interleave, and every
run pays Train's start-up, longer than a whole micro trial in-process. In-process,
a trial is one actor with one distill worker's resources (`distill.num_cpus_per_worker` /
`num_gpus_per_worker`), `max_concurrent_trials` of them share the machine, and a restarted trial resumes
from its own checkpoint folder. Baselines train the same way, as Ray tasks with the same resources (a
finished `specray run` draft with the same fingerprint — same spec, paradigm, mixture and steps — is
reused instead: Ray Train's `distill.workers`-way DDP computes the same steps, see test_distill_ray.py).

`c` (draft/target step latency) is measured once, on the un-distilled draft, and used for every draft: all
drafts share one architecture, and per-draft timings on a busy machine would add noise to the objective.

Resume: the search lives in `<output_dir>/<name>/tune/search` (Tune's experiment folder) and `--resume`
restores it with `Tuner.restore`: finished trials are kept, unfinished ones restart and resume from their
latest checkpoint; finished baseline drafts, `c` and the baselines' validation records are reused; the
unfinished MLflow parent run is continued.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd
import ray

from specray.cluster.runtime import ray_session
from specray.config import SweepSpec
from specray.distill.checkpoints import draft_inputs, is_finished
from specray.distill.inputs import draft_folder_name, replicate_name
from specray.errors import SpecError
from specray.files import write_atomic
from specray.keys import digest
from specray.locks import output_folder
from specray.models.loading import load_tokenizer, resolve_model_path
from specray.specdec.cells import encode_test_prompts, eval_settings
from specray.specdec.records import EvalJob, StepCosts
from specray.sweep.plan import DraftPlan, sweep_dir
from specray.sweep.progress import SweepDisplay
from specray.sweep.tune.baselines import (
    Contenders,
    manual_recipe,
    peaks,
    table3,
    table3_markdown,
    write_table3,
)
from specray.sweep.tune.search import SearchFailed, TrialRecord, record_trials, search
from specray.sweep.tune.space import Recipe, at_best_gamma, baseline_recipe, budget_spec, check_tune
from specray.sweep.tune.trial import VALIDATION, TrialContext, distil_baseline
from specray.tracking.client import Tracker, open_tracker, sweep_key
from specray.tracking.lineage import DatasetRef, SweepData, draft_model, draft_note, sweep_data
from specray.tracking.names import BEST, cell_metrics

__all__ = ["SearchFailed", "TuneOutcome", "run_tune", "tune_dir"]

log = logging.getLogger(__name__)

SEARCH_DIR, TRIALS_DIR, BASELINES_DIR, REPORT_DIR = "search", "trials", "baselines", "report"
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


@dataclass
class TuneState:
    """The search's state file (tune.json): what a resumed search reuses rather than redoes. `key` is the
    spec's (with the tune section): a resumed search must have the same."""

    key: str
    step_costs: StepCosts | None = None
    validation: list[dict[str, Any]] | None = None  # the single τ_kd drafts' validation records
    validation_drafts: dict[str, str] | None = None  # which drafts (name -> folder) those records are of

    def to_json(self) -> dict[str, Any]:
        payload = asdict(self)
        payload["step_costs"] = self.step_costs.to_json() if self.step_costs is not None else None
        return payload

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> TuneState:
        costs = payload.get("step_costs")
        return cls(
            payload["key"],
            StepCosts.from_json(costs) if costs else None,
            payload.get("validation"),
            payload.get("validation_drafts"),
        )


@dataclass
class _Run:
    """What the stages share."""

    spec: SweepSpec
    out: Path
    tracker: Tracker
    parent: str
    display: SweepDisplay
    state: TuneState
    target_path: str = ""
    draft_path: str = ""
    prompts: dict[str, list[list[int]]] = field(default_factory=dict)  # validation + test sets
    runs: dict[str, str] = field(default_factory=dict)  # baseline draft name -> MLflow run id
    validation: list[dict[str, Any]] = field(default_factory=list)  # single τ_kd drafts' records
    inputs: Any = None  # ObjectRef of the DistillInputs of every τ_kd shard (read once)
    data: SweepData | None = None  # the datasets MLflow shows on the runs

    @property
    def step_costs(self) -> StepCosts:
        assert self.state.step_costs is not None, "step costs before _prepare measured them"
        return self.state.step_costs


def tune_dir(spec: SweepSpec) -> Path:
    return (sweep_dir(spec) / "tune").absolute()


def _claim_state(out: Path, spec: SweepSpec, resume: bool) -> TuneState:
    """The search's state file; a SpecError when the folder holds a search this call must not touch."""
    from ray.tune import Tuner

    path, key = out / STATE_FILE, sweep_key(spec, with_tune=True)
    state = json.loads(path.read_text()) if path.exists() else {}
    if not resume and Tuner.can_restore(out / SEARCH_DIR):
        raise SpecError(
            f"{out} already holds a search: add --resume to continue it, or delete it to start over"
        )
    if resume and state.get("key", key) != key:
        raise SpecError(f"{out}: the spec changed since this search started; --resume needs the same spec")
    return TuneState.from_json(state | {"key": key}) if resume else TuneState(key)


def _save_state(run: _Run) -> None:
    payload = json.dumps(run.state.to_json(), indent=2)
    write_atomic(run.out / STATE_FILE, lambda path: path.write_text(payload))


def run_tune(spec: SweepSpec, resume: bool = False, show_progress: bool = True) -> TuneOutcome:
    """Run (or with `resume` continue) the search, its baselines and Table 3. Holds the sweep's output
    folder (its drafts and c are shared with `specray run`) for the whole search."""
    check_tune(spec)
    with output_folder(sweep_dir(spec)):
        return _run_tune(spec, resume, show_progress)


def _run_tune(spec: SweepSpec, resume: bool, show_progress: bool) -> TuneOutcome:
    out = tune_dir(spec)
    state = _claim_state(out, spec, resume)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.tune_parent_run(spec, resume)
    out.mkdir(parents=True, exist_ok=True)
    data = sweep_data(spec)
    run = _Run(spec, out, tracker, parent, SweepDisplay(enabled=show_progress), state, data=data)
    tracker.log_datasets(parent, data.everything())
    with ray_session(spec.ray), run.display:
        context = _prepare(run)
        singles = _single_tau_kd_baselines(run)
        contenders, manual = _manual_baselines(run, singles)
        with run.display.stage("search", spec.tune.num_samples, "trial"):
            results = search(spec, context, out / SEARCH_DIR, resume, run.display.advance)
        trials, winner = record_trials(spec, tracker, parent, results, out / TRIALS_DIR)
        run.runs[TUNED + winner.recipe.name] = winner.run_id
        drafts = _table3_drafts(singles, manual, contenders, winner)
        replicates = _replicates(run, singles, manual, contenders, winner)
        drafts |= {plan.name: str(plan.output_dir) for plan in replicates}
        records = _evaluate(run, drafts, list(spec.eval.test_sets), "test sets")
        recipes = {plan.name: (plan.recipe, plan.replicate) for plan in replicates}
        for record in records:  # which contender each record measures, and which of its replicates
            record["recipe"], record["replicate"] = recipes.get(record["draft"], (record["draft"], 0))
    return _finish(
        run, resumed, records, replace(contenders, tuned=TUNED + winner.recipe.name), winner, trials
    )


# ---------------------------------------------------------------- preparation


def _local(path: str) -> str:
    """An existing local path made absolute (trials run elsewhere); an HF hub name as it is."""
    return str(Path(path).absolute()) if Path(path).exists() else path


def _prepare(run: _Run) -> TrialContext:
    """Models, shards (generated here if missing), prompts, c and what every trial shares."""
    from specray.distill.inputs import prepare_inputs
    from specray.teacher.shards import generate_teacher_shards

    spec = run.spec
    with run.display.stage("zoo", 1, "model"):
        run.target_path = _local(resolve_model_path(spec.models.target, spec.models.zoo))
        run.draft_path = _local(resolve_model_path(spec.models.draft, spec.models.zoo))
        run.display.advance()
    responses = len(spec.teacher.temperatures) * spec.data.train_size
    with run.display.stage("teacher shards", responses, "response"):  # a cache hit after `specray generate`
        generate_teacher_shards(spec, show_progress=False, on_progress=run.display.set_counts)
    tokenizer = load_tokenizer(run.target_path, spec.models.target.trust_remote_code)
    run.prompts = {
        VALIDATION: _validation_prompts(spec, tokenizer),
        **encode_test_prompts(spec, tokenizer, run.target_path),
    }
    if run.state.step_costs is None:
        run.state.step_costs = _measure_step_costs(run)
        _save_state(run)
    run.tracker.log_metrics(
        run.parent, {"cost_ratio": run.step_costs.cost_ratio(run.step_costs.batch_sizes[0])}
    )
    base = budget_spec(spec, baseline_recipe(spec, {}))
    inputs = prepare_inputs(base, spec.tune.paradigm, dict.fromkeys(spec.teacher.temperatures, 1.0))
    inputs = replace(inputs, target_path=run.target_path, draft_path=run.draft_path)
    run.inputs = ray.put(inputs)
    trials_dir = str(run.out / TRIALS_DIR)
    return TrialContext(
        spec.model_dump(mode="json"), inputs, run.prompts[VALIDATION], run.step_costs, trials_dir
    )


def _validation_prompts(spec: SweepSpec, tokenizer: Any) -> list[list[int]]:
    """Token ids of the validation prompts, encoded like the test prompts."""
    from specray.data.dataset import build_splits
    from specray.data.templates import encode_prompts

    return encode_prompts(build_splits(spec.data)[VALIDATION], tokenizer, spec.data)


def _measure_step_costs(run: _Run) -> StepCosts:
    """The step costs of the un-distilled draft: the spec's fixed c, the ones `specray run` measured for
    this sweep under the same key, or timed here on an eval actor (and saved for `specray run` alike)."""
    from specray.specdec.workers import make_eval_pool
    from specray.sweep.plan import step_costs_stage
    from specray.sweep.run import save_step_costs

    _, known = step_costs_stage(run.spec, sweep_dir(run.spec))
    if known is not None:
        return known
    prompts = {VALIDATION: run.prompts[VALIDATION]}
    settings = eval_settings(run.spec.eval)
    with make_eval_pool(run.spec, run.target_path, prompts, settings, replicas=1) as pool:
        return save_step_costs(run.spec, pool, run.draft_path, sweep_dir(run.spec))


# ---------------------------------------------------------------- baselines


def _baseline_plan(run: _Run, recipe: Recipe) -> DraftPlan:
    """Where a baseline draft lives: `specray run`'s draft if it was trained with this budget, else ours."""
    spec = budget_spec(run.spec, recipe)
    inputs = draft_inputs(spec, recipe.paradigm, recipe.mixture)
    key, folder_name = digest(inputs), draft_folder_name(recipe.name)
    sweep_draft = sweep_dir(run.spec) / "drafts" / folder_name
    folder = sweep_draft if is_finished(sweep_draft, key) else run.out / BASELINES_DIR / folder_name
    return DraftPlan(recipe.name, recipe.paradigm, recipe.mixture, folder.absolute(), key, inputs)


def _distil_baselines(
    run: _Run, plans: list[DraftPlan], role: str, specs: Mapping[str, SweepSpec] | None = None
) -> None:
    """Distil the unfinished baseline drafts (as many at once as the cluster holds), log each to its run.
    A draft trains under the baselines' budget spec, or under `specs[name]` where given (a replicate)."""
    from specray.sweep.run import finish_draft

    spec = budget_spec(run.spec, baseline_recipe(run.spec, {}))
    d = spec.distill
    task = ray.remote(distil_baseline).options(num_cpus=d.num_cpus_per_worker, num_gpus=d.num_gpus_per_worker)
    pending = {}
    for plan in plans:
        spec_json = (specs or {}).get(plan.name, spec).model_dump(mode="json")
        tags = plan.tags | {"tune_role": role}
        note = draft_note(run.spec, plan)
        run.runs[plan.name] = run.tracker.child_run(run.parent, plan.name, plan.key, tags, note)
        if is_finished(plan.output_dir, plan.key):
            finish_draft(
                plan, run.tracker, run.runs[plan.name], run.display, _datasets(run, plan), reused=True
            )
        else:
            assert plan.paradigm is not None, "a tune baseline is a distilled recipe (_baseline_plan)"
            ref = task.remote(spec_json, plan.paradigm, plan.mixture, str(plan.output_dir), run.inputs)
            pending[ref] = plan
    while pending:
        (done,), _ = ray.wait(list(pending), num_returns=1)
        plan = pending.pop(done)
        ray.get(done)  # a failed distillation stops the search; finished drafts stay finished
        finish_draft(plan, run.tracker, run.runs[plan.name], run.display, _datasets(run, plan))


def _replicates(
    run: _Run,
    singles: Mapping[float, DraftPlan],
    manual: Mapping[str, DraftPlan],
    contenders: Contenders,
    winner: TrialRecord,
) -> list[DraftPlan]:
    """Replicates 1 … N−1 (`tune.replicates`) of every draft Table 3 compares — the winner's recipe, each
    best single τ_kd and each manual recipe — trained with distill.seed + r under the same budget, in
    `baselines/` (reused by key on a resumed search). Replicate 0 is the draft the search already has."""
    spec = run.spec
    by_name = {plan.name: plan for plan in [*singles.values(), *manual.values()]}
    compared = {*contenders.single.values(), *contenders.manual.values()}
    recipes = {name: baseline_recipe(spec, by_name[name].mixture) for name in sorted(compared)}
    recipes[TUNED + winner.recipe.name] = winner.recipe
    plans, specs = [], {}
    for replicate in range(1, spec.tune.replicates):
        for name, recipe in recipes.items():
            replicate_spec = budget_spec(spec, recipe).for_replicate(replicate)
            inputs = draft_inputs(replicate_spec, recipe.paradigm, recipe.mixture)
            folder = draft_folder_name(replicate_name(name.replace(TUNED, "tuned__"), replicate))
            plan = DraftPlan(
                replicate_name(name, replicate),
                recipe.paradigm,
                recipe.mixture,
                (run.out / BASELINES_DIR / folder).absolute(),
                digest(inputs),
                inputs,
                replicate,
            )
            plans.append(plan)
            specs[plan.name] = replicate_spec
    if plans:
        with run.display.stage("replicates", len(plans), "draft"):
            _distil_baselines(run, plans, "replicate", specs)
    return plans


def _datasets(run: _Run, plan: DraftPlan) -> list[DatasetRef]:
    return run.data.for_draft(plan.mixture) if run.data is not None else []


def _single_tau_kd_baselines(run: _Run) -> dict[float, DraftPlan]:
    """One draft per τ_kd of the grid, and its validation records (logged to its run)."""
    grid = run.spec.teacher.temperatures
    plans = {tau: _baseline_plan(run, baseline_recipe(run.spec, {tau: 1.0})) for tau in grid}
    with run.display.stage("single τ_kd drafts", len(plans), "draft"):
        _distil_baselines(run, list(plans.values()), "single")
    drafts = {plan.name: str(plan.output_dir) for plan in plans.values()}
    if run.state.validation_drafts != drafts or run.state.validation is None:  # a resumed search keeps
        run.state.validation = _evaluate(run, drafts, [VALIDATION], "validation")  # the records it saved
        run.state.validation_drafts = drafts
        _save_state(run)
    run.validation = run.state.validation
    return plans


def _manual_baselines(run: _Run, singles: dict[float, DraftPlan]) -> tuple[Contenders, dict[str, DraftPlan]]:
    """Per objective τ_dec: the best single τ_kd on validation and the manual recipe around it."""
    spec = run.spec
    tau_kd_of = {plan.name: tau for tau, plan in singles.items()}
    by_tau_dec = peaks(run.validation, tau_kd_of)
    manual: dict[float, DraftPlan] = {}
    for tau_dec, peak in by_tau_dec.items():
        recipe = manual_recipe(spec.teacher.temperatures, peak, spec.tune.manual_top_k)
        manual[tau_dec] = _baseline_plan(run, baseline_recipe(spec, recipe))
    unique = {plan.name: plan for plan in manual.values()}
    with run.display.stage("manual recipes", len(unique), "draft"):
        _distil_baselines(run, list(unique.values()), "manual")
    labels = {singles[peak].name: f"{peak:g}" for peak in by_tau_dec.values()}
    labels |= {plan.name: "+".join(f"{tau:g}" for tau in sorted(plan.mixture)) for plan in unique.values()}
    contenders = Contenders(
        tuned="",
        single={tau_dec: singles[peak].name for tau_dec, peak in by_tau_dec.items()},
        manual={tau_dec: plan.name for tau_dec, plan in manual.items()},
        labels=labels,
    )
    return contenders, unique


def _table3_drafts(
    singles: dict[float, DraftPlan],
    manual: dict[str, DraftPlan],
    contenders: Contenders,
    winner: TrialRecord,
) -> dict[str, str]:
    """Draft name -> folder for every draft Table 3 compares."""
    by_name = {plan.name: str(plan.output_dir) for plan in [*singles.values(), *manual.values()]}
    drafts = {name: by_name[name] for name in {*contenders.single.values(), *contenders.manual.values()}}
    return drafts | {TUNED + winner.recipe.name: str(winner.draft_dir)}


# ---------------------------------------------------------------- evaluation and the end


def _evaluate(run: _Run, drafts: dict[str, str], test_sets: list[str], stage: str) -> list[dict[str, Any]]:
    """Analytic cells of `drafts` at every objective τ_dec and γ on `test_sets` (the eval pool, fixed c);
    each record's metrics go to its draft's run. Returns flat records at each cell's best γ."""
    from specray.specdec.cells import passes
    from specray.specdec.workers import make_eval_pool

    e = run.spec.eval
    settings = eval_settings(e, run.step_costs)
    jobs = [
        EvalJob(name, path, tau, test_set, "analytic", gamma)
        for name, path in drafts.items()
        for test_set in test_sets
        for tau in run.spec.tune.objective_temperatures
        for gamma in e.gamma
    ]
    prompts = {test_set: run.prompts[test_set] for test_set in test_sets}
    with (
        run.display.stage(stage, len(jobs), "cell"),
        make_eval_pool(run.spec, run.target_path, prompts, settings) as pool,
    ):
        records = pool.run(
            passes(jobs, e.drafts_per_pass),
            on_result=lambda done: run.display.advance(len(done)),
            show_progress=False,
        )
    with_gamma = len(e.gamma) > 1
    for record in records:
        run_id = run.runs.get(record.draft)
        if run_id is not None:
            run.tracker.log_metrics(run_id, cell_metrics(record, with_gamma))
    # lists dropped but the per-prompt sums, which the sweep report's paired bootstrap of Table 3 reads
    flat = [
        {k: v for k, v in r.flat().items() if not isinstance(v, list) or k.startswith("per_prompt_")}
        for r in records
    ]
    return [dict(r) for r in at_best_gamma(flat)]


def _finish(
    run: _Run,
    resumed: bool,
    records: list[dict[str, Any]],
    contenders: Contenders,
    winner: TrialRecord,
    trials: list[TrialRecord],
) -> TuneOutcome:
    """Table 3 (printed by the CLI, saved, logged), the winner registered, every run finished."""
    spec, tracker = run.spec, run.tracker
    tuned_label = winner.recipe.mixture_tag
    contenders = replace(contenders, labels=contenders.labels | {contenders.tuned: tuned_label})
    frame = table3(records, contenders)
    title = (
        f"Table 3 — {spec.name}: tuned mixture vs best single τ_kd vs manual recipe ({spec.tune.paradigm})"
    )
    markdown = table3_markdown(frame, tuned_label, title)
    report_dir = run.out / REPORT_DIR
    write_table3(frame, markdown, report_dir)
    pd.DataFrame([_trial_row(t) for t in trials]).to_csv(report_dir / "trials.csv", index=False)
    (report_dir / "cells.json").write_text(json.dumps(run.validation + records, indent=1))
    tracker.log_artifacts(run.parent, report_dir, "report")
    assert winner.objective is not None, "the winner is a completed trial, whose objective was measured"
    tracker.log_metrics(run.parent, _gains(frame) | {"objective/best": winner.objective})
    registered = _register(run, winner)
    for run_id in [*run.runs.values(), run.parent]:
        tracker.finish(run_id)
    return TuneOutcome(
        run.parent, resumed, winner, frame, markdown, report_dir, registered, trials, run.display.summary
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


def _register(run: _Run, winner: TrialRecord) -> tuple[str, str]:
    """Log the winner's draft as its trial run's model, tag it best and register that model with its
    mixture as tags."""
    spec, tracker, recipe = run.spec, run.tracker, winner.recipe
    name = spec.tune.registered_model or f"{spec.name}-tuned-draft"
    plan = replace(_baseline_plan(run, recipe), output_dir=Path(winner.draft_dir))
    model_id = tracker.log_draft_model(winner.run_id, draft_model(plan))
    tracker.set_tags(winner.run_id, {BEST: "true"})
    tracker.set_tags(run.parent, {"best_trial": winner.trial_id, "best_mixture": recipe.mixture_tag})
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
