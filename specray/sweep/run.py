"""`specray run`: zoo → teacher shards → distillation per (paradigm, τ_kd) → eval cells → report.

Every result is cached under a key of everything that made it (`specray/keys.py`): a shard by its shard key,
a draft by its draft key (recorded in its completion marker), c by the pair and device it was timed on, a
cell by its cell key (its record file's name). A run first plans — per stage, what it reuses and what it will
compute and why (`specray run --dry-run` prints only that) — then computes exactly what the plan lists, so a
changed setting recomputes what it changes and nothing else, and a result made under other settings is
never reported under the new ones.

Resumable by the same token: a re-run after the driver died finds the unfinished MLflow parent run with the
spec's key, reuses every finished shard, draft and cell, and backfills MLflow with anything the driver saved
locally but had not logged yet. All MLflow calls happen on this (the driver's main) thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from specray.cluster.runtime import ray_session
from specray.config import SweepSpec, dump_spec
from specray.data.shards import is_complete, train_shard_keys
from specray.devices import device_kind
from specray.distill.checkpoints import read_curves
from specray.distill.convergence import convergence_metrics
from specray.distill.curves import CurvePoint, curves_to_json
from specray.draft import Draft
from specray.files import check_writable, write_json, write_text
from specray.keys import cost_ratio_inputs, digest, model_id
from specray.locks import output_folder
from specray.models.loading import load_tokenizer, resolve_model_path
from specray.report.build import build_report
from specray.specdec.categories import with_categories
from specray.specdec.cells import (
    encode_test_prompts,
    eval_settings,
    evaluated_examples,
    passes,
    plan_jobs,
    prompt_categories,
    prompt_conversations,
    prompts_fingerprints,
    workload_json,
)
from specray.specdec.evaluator import continuations_file, default_continuations_dir
from specray.specdec.records import CellRecord, EvalJob, StepCosts
from specray.specdec.workers import EvalPool, make_eval_pool
from specray.sweep.plan import (
    SPEC_FILE,
    DraftPlan,
    StagePlan,
    baseline_plan,
    cell_stage,
    draft_stage,
    plan_drafts,
    read_cells,
    shard_specs,
    step_costs_file,
    step_costs_stage,
    sweep_dir,
)
from specray.sweep.preflight import preflight
from specray.sweep.progress import SweepDisplay
from specray.sweep.schedule import concurrent_runs, split_runs
from specray.tracking.client import Tracker, describe_sweep, open_tracker
from specray.tracking.lineage import (
    DRAFTS_VIEW,
    DatasetRef,
    SweepData,
    draft_model,
    draft_note,
    sweep_data,
)
from specray.tracking.names import CellAxes, cell_metrics

log = logging.getLogger(__name__)


@dataclass
class SweepOutcome:
    parent_run_id: str
    resumed: bool
    report: Path
    records: list[CellRecord]
    step_costs: StepCosts
    plan: list[StagePlan]
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds and peak memory per stage
    runs_page: str = ""  # the MLflow UI's runs table of the sweep, in the drafts view


@dataclass
class SweepWork:
    """The plan: per stage what is reused and what will be computed, and the units to compute."""

    stages: list[StagePlan]
    drafts: list[DraftPlan]  # every distilled draft of the sweep
    drafts_todo: list[DraftPlan]
    step_costs: StepCosts | None  # None: to be measured

    def lines(self) -> list[str]:
        return [stage.line() for stage in self.stages]


def target_id(spec: SweepSpec) -> str:
    """The target as the continuations' cache key sees it (the model and the dtype it runs in)."""
    return f"{model_id(spec.models.target, spec.models)}|{spec.models.target.dtype}"


def plan_sweep(spec: SweepSpec) -> SweepWork:
    """What `run_sweep` will reuse and compute (reads what is on disk; loads no model, starts nothing)."""
    out = sweep_dir(spec)
    keys = [key for shards_of in shard_specs(spec) for key in train_shard_keys(shards_of).values()]
    done = sum(is_complete(key) for key in keys)
    shards = StagePlan("teacher shards", reused=done, todo=len(keys) - done)
    if shards.todo:
        shards.reasons["not generated yet"] += shards.todo
    drafts = plan_drafts(spec)
    draft_plan, drafts_todo = draft_stage(spec, drafts)
    cost_plan, cost = step_costs_stage(spec, out)
    jobs = cell_jobs(spec, [baseline_plan(spec, ""), *drafts], cost)
    cells_plan, _ = cell_stage(jobs, read_cells(out / "cells"), out / "cells")
    if cost is None and cells_plan.todo:
        cells_plan.note = "analytic cells are keyed by the step costs, which are measured first"
    return SweepWork([shards, draft_plan, cost_plan, cells_plan], drafts, drafts_todo, cost)


def cell_jobs(spec: SweepSpec, drafts: list[DraftPlan], cost: StepCosts | None) -> list[EvalJob]:
    keyed = (spec, prompts_fingerprints(spec), None if cost is None else cost.fingerprint())
    return plan_jobs(spec.eval, [plan.ref for plan in drafts], keyed)


def run_sweep(
    spec: SweepSpec, show_progress: bool = True, on_plan: Callable[[SweepWork], None] | None = None
) -> SweepOutcome:
    """Run (or resume) the whole sweep; returns where the report is and what was measured. The sweep's
    output folder is held for the whole run: a second run on it is refused (`locks.FolderInUse`)."""
    check_writable(sweep_dir(spec), "output_dir", "choose another with output_dir=PATH")
    with output_folder(sweep_dir(spec)):
        return _run_sweep(spec, show_progress, on_plan)


def _run_sweep(
    spec: SweepSpec, show_progress: bool, on_plan: Callable[[SweepWork], None] | None
) -> SweepOutcome:
    out = sweep_dir(spec)
    preflight(spec)
    write_text(out / SPEC_FILE, dump_spec(spec))  # the settings its results are keyed by (`specray export`)
    work = plan_sweep(spec)
    if on_plan is not None:
        on_plan(work)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.parent_run(spec)
    data = describe_sweep(tracker, parent, spec, len(work.drafts))  # its datasets, description, runs view
    display = SweepDisplay(enabled=show_progress)
    with ray_session(spec.ray), display:
        with display.stage("zoo", 1, "model"):
            target_path = resolve_model_path(spec.models.target, spec.models.zoo)
            draft_path = resolve_model_path(spec.models.draft, spec.models.zoo)
            display.advance()
        samples = shard_specs(spec)  # one teacher sample, or one per replicate (teacher.replicate_shards)
        per_sample = len(spec.teacher.temperatures) * spec.data.train_size
        with display.stage("teacher shards", per_sample * len(samples), "response"):
            from specray.teacher.shards import generate_teacher_shards

            for i, sample in enumerate(samples):
                offset = i * per_sample

                def counts(done: int, total: int, reused: int = 0, offset: int = offset) -> None:
                    display.set_counts(offset + done, per_sample * len(samples), reused)

                generate_teacher_shards(sample, show_progress=False, on_progress=counts)
        runs = {
            p.name: tracker.child_run(parent, p.name, p.key, p.tags, draft_note(spec, p)) for p in work.drafts
        }
        with display.stage("distill", len(work.drafts), "draft"):
            curves = _distill_all(spec, work, tracker, runs, display, data)
        baseline = baseline_plan(spec, draft_path)
        note = draft_note(spec, baseline)
        runs[baseline.name] = tracker.child_run(parent, baseline.name, baseline.key, baseline.tags, note)
        tracker.log_datasets(runs[baseline.name], data.tests)
        tokenizer = load_tokenizer(target_path)
        prompts = encode_test_prompts(spec, tokenizer, target_path)
        everything = [baseline, *work.drafts]
        pool = LazyEvalPool(spec, target_path, prompts)
        with pool:
            with display.stage("step costs", 1, "measurement"):
                cost = work.step_costs or save_step_costs(spec, pool.get(), draft_path, out)
                display.advance()
            jobs = cell_jobs(spec, everything, cost)
            with display.stage("eval", len(jobs), "cell"):
                records = _evaluate_all(spec, jobs, pool, cost, tracker, runs, display, out / "cells")
    outputs = _target_outputs(spec, prompts)
    lengths = {
        test_set: {tau: [len(r) for r in rs] for tau, rs in by.items()} for test_set, by in outputs.items()
    }
    drafts = {plan.name: plan.info for plan in everything}
    characters = token_characters(outputs, tokenizer)
    report = _report(spec, tracker, parent, records, drafts, curves, (lengths, characters), cost, out)
    stage_metrics = {f"stage_seconds/{k.replace(' ', '_')}": v["seconds"] for k, v in display.summary.items()}
    tracker.log_metrics(parent, stage_metrics | _cost_metrics(cost))
    for run_id in [*runs.values(), parent]:
        tracker.finish(run_id)
    page = tracker.runs_page(DRAFTS_VIEW)
    return SweepOutcome(parent, resumed, report, records, cost, work.stages, display.summary, page)


class LazyEvalPool:
    """The eval pool, started only when something needs it (a re-run with every cell saved loads nothing)."""

    def __init__(self, spec: SweepSpec, target_path: str, prompts: dict[str, list[list[int]]]) -> None:
        self.spec, self.target_path, self.prompts = spec, target_path, prompts
        self.pool: EvalPool | None = None

    def get(self) -> EvalPool:
        if self.pool is None:
            settings, everything = eval_settings(self.spec.eval), evaluated_examples(self.spec)
            examples = {test_set: everything[test_set] for test_set in self.prompts}
            self.pool = make_eval_pool(
                self.spec,
                self.target_path,
                self.prompts,
                settings,
                target_id=target_id(self.spec),
                examples=examples,
            )
        return self.pool

    def __enter__(self) -> LazyEvalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.close()


# ---------------------------------------------------------------- distillation


def _distill_all(
    spec: SweepSpec,
    work: SweepWork,
    tracker: Tracker,
    runs: dict[str, str],
    display: SweepDisplay,
    data: SweepData,
) -> dict[str, list[CurvePoint]]:
    """Distil every draft the plan lists, in as many Train runs side by side as the cluster fits, each run
    distilling its share of the drafts one after another (`split_runs`); log each one as it is published.
    Each distillation's latest loss and acceptance reach the display as they are reported."""
    from specray.distill.ray_train import DraftJob, distill_drafts

    curves: dict[str, list[CurvePoint]] = {}
    samples = {0: data}  # each replicate's own teacher sample, with teacher.replicate_shards

    def datasets_of(plan: DraftPlan) -> list[DatasetRef]:
        sample = plan.replicate if spec.teacher.replicate_shards else 0
        if sample not in samples:
            samples[sample] = sweep_data(spec.for_replicate(sample))
        return samples[sample].for_draft(plan.mixture)

    for plan in work.drafts:
        if plan not in work.drafts_todo:
            datasets = datasets_of(plan)
            curves[plan.name] = finish_draft(plan, tracker, runs[plan.name], display, datasets, reused=True)
    todo = {plan.name: plan for plan in work.drafts_todo}
    reporters = {
        name: display.curve_reporter(name, spec.for_draft(p.paradigm or "", p.replicate, *p.variant))
        for name, p in todo.items()
    }
    published: SimpleQueue[str] = SimpleQueue()  # from the runs' threads to this one (MLflow stays here)

    def log_published() -> None:
        while not published.empty():
            plan = todo.get(published.get())
            if plan is not None and plan.name not in curves:
                datasets = datasets_of(plan)
                curves[plan.name] = finish_draft(plan, tracker, runs[plan.name], display, datasets)

    lanes = [
        lane
        for lane in split_runs(spec, work.drafts, concurrent_runs(spec))
        if {plan.name for plan in lane} & set(todo)
    ]
    with ThreadPoolExecutor(max_workers=max(1, len(lanes))) as executor:
        pending: set[Future] = {
            executor.submit(
                distill_drafts,
                spec,
                [
                    DraftJob(p.paradigm or "", p.mixture, p.output_dir, p.replicate, *p.variant, p.name)
                    for p in lane
                ],
                report=lambda draft, curve: reporters[draft](curve),
                published=published.put,
            )
            for lane in lanes
        }
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            log_published()
            for future in done:
                future.result()  # a failed run stops the sweep; published drafts stay published
    log_published()
    return curves


def finish_draft(
    plan: DraftPlan,
    tracker: Tracker,
    run_id: str,
    display: SweepDisplay,
    datasets: Sequence[DatasetRef] = (),
    reused: bool = False,
) -> list[CurvePoint]:
    """Log a finished draft's curves, the datasets it used and the draft as a logged model to its run, each
    once (a driver may die between any two); `reused`: it was found finished, not trained now."""
    curves = read_curves(plan.output_dir)
    logged = tracker.metric_keys(run_id)
    if "loss" not in logged:
        tracker.log_curves(run_id, curves_to_json(curves))
    trend = convergence_metrics(curves)  # the last window's slope of the probe's acceptance
    if trend and not set(trend) <= logged:
        tracker.log_metrics(run_id, trend)
    tracker.log_datasets(run_id, datasets)
    tracker.log_draft_model(run_id, draft_model(plan))
    display.advance(reused=reused)
    return curves


# ---------------------------------------------------------------- evaluation


def save_step_costs(spec: SweepSpec, pool: EvalPool, draft_path: str, out: Path) -> StepCosts:
    """The step costs, timed once on an eval actor with the un-distilled draft at every γ and B of the
    grid, saved with the sweep under their key."""
    e = spec.eval
    log.info("timing decoding steps on an eval actor (γ %s, B %s)", e.gamma, e.batch_sizes)
    measured = pool.measure_step_costs(draft_path, list(e.batch_sizes), list(e.gamma))
    inputs = cost_ratio_inputs(spec)
    cost = replace(measured, key=digest(inputs), key_inputs=inputs)
    write_json(step_costs_file(out, cost.key), cost.to_json())
    log.info("%s", cost.describe())
    return cost


def _cost_metrics(cost: StepCosts) -> dict[str, float]:
    """The step costs as parent-run metrics: c, and every timing in milliseconds."""
    metrics = {"cost_ratio": cost.cost_ratio(cost.batch_sizes[0])}
    for b in cost.batch_sizes:
        metrics[f"step_ms/draft/batch_{b}"] = 1e3 * cost.draft[b].seconds
        metrics |= {f"step_ms/target/batch_{b}/k_{k}": 1e3 * t.seconds for k, t in cost.target[b].items()}
    return metrics


def _evaluate_all(
    spec: SweepSpec,
    jobs: list[EvalJob],
    pool: LazyEvalPool,
    cost: StepCosts,
    tracker: Tracker,
    runs: dict[str, str],
    display: SweepDisplay,
    folder: Path,
) -> list[CellRecord]:
    """Evaluate the cells without a record under their key; every record ends up once on disk and once in
    MLflow (metrics carry γ, ε and the lenience function when the sweep has more than one)."""
    axes = CellAxes.of(spec)
    categories, conversations = prompt_categories(spec), prompt_conversations(spec)

    def labelled(record: CellRecord) -> CellRecord:
        return with_categories(record, categories, conversations)

    saved = {key: labelled(record) for key, record in read_cells(folder).items()}
    stage, todo = cell_stage(jobs, saved, folder)
    logged = {name: tracker.metric_keys(run_id) for name, run_id in runs.items()}
    for job in jobs:  # backfill what a killed driver saved but had not logged
        if job.key in saved:
            metrics = cell_metrics(saved[job.key], axes=axes)
            if not set(metrics) <= logged[job.draft]:
                tracker.log_metrics(runs[job.draft], metrics)
    display.advance(stage.reused, reused=True)

    def on_result(records: list[CellRecord]) -> None:
        for record in map(labelled, records):
            write_json(folder / f"{record.key}.json", record.to_json(), indent=None)
            tracker.log_metrics(runs[record.draft], cell_metrics(record, axes=axes))
            saved[record.key] = record
        display.advance(len(records))

    if todo:
        evaluators = pool.get()
        evaluators.step_costs = cost
        evaluators.run(passes(todo, spec.eval.drafts_per_pass), on_result=on_result, show_progress=False)
    # a record is found by its key; the draft it names is this sweep's name for it (the same weights may
    # have been evaluated under another name: `online/tau_kd=1` before it was `online/tau_kd=1/fkl/gkd`)
    return [replace(saved[job.key], draft=job.draft) for job in jobs]


def _target_outputs(
    spec: SweepSpec, prompts: dict[str, list[list[int]]]
) -> dict[str, dict[float, list[list[int]]]]:
    """The target's cached test outputs (response token ids) per test set and τ_dec."""
    settings, device = eval_settings(spec.eval), device_kind(spec.eval.num_gpus)
    outputs: dict[str, dict[float, list[list[int]]]] = {}
    for test_set in spec.eval.test_sets:
        for tau in spec.eval.temperatures:
            if test_set not in prompts:
                continue
            folder = default_continuations_dir()
            path = continuations_file(folder, target_id(spec), prompts[test_set], tau, settings, device)
            if path.exists():
                outputs.setdefault(test_set, {})[tau] = json.loads(path.read_text())["responses"]
    return outputs


def token_characters(
    outputs: dict[str, dict[float, list[list[int]]]], tokenizer: Any
) -> dict[str, dict[float, dict[int, int]]]:
    """Per test set and τ_dec: how many generated tokens have each length in characters (paper Fig. 5, a
    proxy for how hard the tokens are). A token's length is that of its decoded text without surrounding
    whitespace (a word's leading space is not counted; a token of only whitespace counts its own
    characters); special tokens (EOS) are left out."""
    special = set(tokenizer.all_special_ids)
    width: dict[int, int] = {}  # token id -> characters, decoded once per id
    counts: dict[str, dict[float, dict[int, int]]] = {}
    for test_set, by_tau in outputs.items():
        for tau, responses in by_tau.items():
            ids = [i for response in responses for i in response if i not in special]
            for i in set(ids) - width.keys():
                text = tokenizer.decode([i])
                width[i] = len(text.strip()) or len(text)
            here = counts.setdefault(test_set, {}).setdefault(tau, {})
            for i in ids:
                here[width[i]] = here.get(width[i], 0) + 1
    return counts


# ---------------------------------------------------------------- report


def _report(spec, tracker, parent, records, drafts, curves, outputs, cost: StepCosts, out: Path) -> Path:
    """Write the report locally, then give MLflow the report and the plain records it was built from.
    `outputs`: (token lengths of the target's test outputs, their characters-per-token counts)."""
    typed = [Draft.from_json({**info, "name": name}) for name, info in drafts.items()]
    lengths, characters = outputs
    report = build_report(
        records,
        typed,
        curves,
        lengths,
        out / "report",
        title=f"specray sweep: {spec.name}",
        step_costs=cost,
        projected_cost_ratio=spec.eval.projected_cost_ratio,
        token_lengths=characters,
        workload=workload_json(spec),
    )
    json_lengths = {test_set: {str(t): v for t, v in by_tau.items()} for test_set, by_tau in lengths.items()}
    json_curves = {name: curves_to_json(points) for name, points in curves.items()}
    cells, drafts = [r.to_json() for r in records], [d.to_json() for d in typed]
    inputs = {"cells": cells, "drafts": drafts, "curves": json_curves, "lengths": json_lengths}
    inputs["step_costs"] = cost.to_json()
    inputs["workload"] = workload_json(spec) or {}
    inputs["token_lengths"] = {
        test_set: {str(t): {str(k): n for k, n in c.items()} for t, c in by.items()}
        for test_set, by in characters.items()
    }
    for name, payload in inputs.items():
        tracker.log_dict(parent, payload, f"records/{name}.json")
    tracker.log_artifacts(parent, out / "report", "report")
    return report
