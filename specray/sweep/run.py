"""`specray run`: zoo → teacher shards → distillation per (paradigm, τ_kd) → eval cells → report.

Resumable by construction: shards are cached by content key, a draft is finished iff its completion marker
exists, and an evaluation cell is finished iff its record file exists (written atomically before its
metrics go to MLflow). Re-running the same sweep after the driver died finds the unfinished MLflow parent
run by its sweep key, skips every finished draft and cell, and backfills MLflow with anything the driver
saved locally but had not logged yet. All MLflow calls happen on this (the driver's main) thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from specray.cluster.runtime import ray_session
from specray.config import SweepSpec
from specray.models.loading import load_tokenizer, resolve_model_path
from specray.report.build import build_report
from specray.specdec.cells import TEST_SPLITS, encode_test_prompts, eval_settings, plan_jobs
from specray.specdec.evaluator import EvalJob, continuations_file, default_continuations_dir
from specray.specdec.workers import EvalPool
from specray.sweep.plan import DraftPlan, baseline_plan, plan_drafts, sweep_dir
from specray.sweep.progress import SweepDisplay
from specray.tracking import Tracker, cell_metrics, open_tracker

log = logging.getLogger(__name__)


@dataclass
class SweepOutcome:
    parent_run_id: str
    resumed: bool
    report: Path
    records: list[dict[str, Any]]
    stages: dict[str, dict[str, float]] = field(default_factory=dict)  # seconds and peak memory per stage


def run_sweep(spec: SweepSpec, show_progress: bool = True) -> SweepOutcome:
    """Run (or resume) the whole sweep; returns where the report is and what was measured."""
    out = sweep_dir(spec)
    preflight(spec)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.parent_run(spec)
    plans = plan_drafts(spec)
    display = SweepDisplay(enabled=show_progress)
    with ray_session(spec.ray), display:
        with display.stage("zoo", 1):
            target_path = resolve_model_path(spec.models.target, spec.models.zoo)
            draft_path = resolve_model_path(spec.models.draft, spec.models.zoo)
            display.advance()
        with display.stage("teacher shards", len(spec.teacher.temperatures)):
            from specray.teacher.pool import generate_teacher_shards

            generate_teacher_shards(spec, show_progress=False)
            display.advance(len(spec.teacher.temperatures))
        runs = {plan.name: tracker.child_run(parent, plan.name, plan.tags) for plan in plans}
        with display.stage("distill", len(plans)):
            curves = _distill_all(spec, plans, tracker, runs, display)
        baseline = baseline_plan(spec, draft_path)
        runs[baseline.name] = tracker.child_run(parent, baseline.name, baseline.tags)
        prompts = encode_test_prompts(spec, load_tokenizer(target_path))
        everything = [baseline, *plans]
        jobs = plan_jobs(
            spec.eval, {p.name: str(p.output_dir) for p in everything}, {p.name: p.tau_kd for p in everything}
        )
        with display.stage("eval", len(jobs)):
            records = _evaluate_all(spec, jobs, target_path, prompts, tracker, runs, display, out / "cells")
    lengths = _output_lengths(spec, target_path, prompts)
    drafts = {plan.name: plan.info for plan in [baseline, *plans]}
    report = _report(spec, tracker, parent, records, drafts, curves, lengths, out)
    stage_metrics = {f"stage_seconds/{k.replace(' ', '_')}": v["seconds"] for k, v in display.summary.items()}
    tracker.log_metrics(parent, stage_metrics)
    for run_id in [*runs.values(), parent]:
        tracker.finish(run_id)
    return SweepOutcome(parent, resumed, report, records, display.summary)


def preflight(spec: SweepSpec) -> None:
    """Everything that can be checked in seconds, before MLflow runs are created or Ray starts: the output
    and cache folders are writable, the data sources load into the configured splits, and models given by
    name or path have a tokenizer, safetensors weights and one shared vocabulary (zoo entries are built
    later, and share one tokenizer by construction)."""
    from specray.data.dataset import build_splits
    from specray.models.loading import check_model_dir, check_same_vocabulary
    from specray.models.zoo import cache_dir

    check_writable(sweep_dir(spec), "output_dir", "choose another with output_dir=PATH")
    check_writable(cache_dir(), "the cache folder", "set SPECRAY_CACHE to a writable folder")
    build_splits(spec.data)
    refs = {"target": spec.models.target, "draft": spec.models.draft}
    paths = {name: ref.name_or_path for name, ref in refs.items() if ref.zoo is None}
    tokenizers = {name: load_tokenizer(path, refs[name].trust_remote_code) for name, path in paths.items()}
    for path in paths.values():
        check_model_dir(path)
    if len(tokenizers) == 2:
        check_same_vocabulary(tokenizers["target"], tokenizers["draft"], paths["target"], paths["draft"])


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Create `folder` if needed and write (then remove) a probe file in it; a SpecError if that fails."""
    from specray.errors import SpecError, describe_os_error

    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".specray-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"{what}: cannot write to {folder} ({describe_os_error(e)}); {fix}") from None


# ---------------------------------------------------------------- distillation


def _concurrent_runs(spec: SweepSpec) -> int:
    """How many distillations fit side by side on the cluster (Ray still decides where each goes)."""
    d = spec.distill
    cpus = ray.cluster_resources().get("CPU", 1.0)
    per_run = max(d.workers * d.num_cpus_per_worker, 1e-9)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    by_gpu = gpus / (d.workers * d.num_gpus_per_worker) if d.num_gpus_per_worker else float("inf")
    return max(1, int(min(cpus / per_run, by_gpu)))


def _distill_all(
    spec: SweepSpec, plans: list[DraftPlan], tracker: Tracker, runs: dict[str, str], display: SweepDisplay
) -> dict[str, list[dict]]:
    """Distil every unfinished draft (several at once where resources allow); log each finished one."""
    from specray.distill.checkpoints import is_finished
    from specray.distill.ray_train import distill

    curves: dict[str, list[dict]] = {}
    todo = [plan for plan in plans if not is_finished(plan.output_dir)]
    for plan in plans:
        if plan not in todo:
            curves[plan.name] = finish_draft(plan, tracker, runs[plan.name], display)
    with ThreadPoolExecutor(max_workers=_concurrent_runs(spec)) as executor:
        pending: dict[Future, DraftPlan] = {
            executor.submit(distill, spec, plan.paradigm, plan.mixture, plan.output_dir): plan
            for plan in todo
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                plan = pending.pop(future)
                future.result()  # a failed distillation stops the sweep; finished drafts stay finished
                curves[plan.name] = finish_draft(plan, tracker, runs[plan.name], display)
    return curves


def finish_draft(plan: DraftPlan, tracker: Tracker, run_id: str, display: SweepDisplay) -> list[dict]:
    """Log a finished draft's curves and model dir to its run, once."""
    curves = json.loads((plan.output_dir / "curves.json").read_text())
    if "loss" not in tracker.metric_keys(run_id):
        tracker.log_curves(run_id, curves)
        tracker.log_artifacts(run_id, plan.output_dir, "draft")
    display.advance()
    return curves


# ---------------------------------------------------------------- evaluation


def _cell_file(folder: Path, job: EvalJob) -> Path:
    return folder / f"{hashlib.sha256(job.key.encode()).hexdigest()[:24]}.json"


def _save_record(folder: Path, job: EvalJob, record: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".cell-")
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)
    os.replace(tmp, _cell_file(folder, job))


def _evaluate_all(
    spec: SweepSpec,
    jobs: list[EvalJob],
    target_path: str,
    prompts: dict[str, list[list[int]]],
    tracker: Tracker,
    runs: dict[str, str],
    display: SweepDisplay,
    folder: Path,
) -> list[dict[str, Any]]:
    """Evaluate the cells without a record yet; every record ends up once on disk and once in MLflow."""
    files = {job.key: _cell_file(folder, job) for job in jobs}
    saved = {key: json.loads(path.read_text()) for key, path in files.items() if path.exists()}
    logged = {name: tracker.metric_keys(run_id) for name, run_id in runs.items()}
    for record in saved.values():  # backfill what a killed driver saved but had not logged
        metrics = cell_metrics(record)
        if not set(metrics) <= logged[record["draft"]]:
            tracker.log_metrics(runs[record["draft"]], metrics)
    display.advance(len(saved))
    todo = [job for job in jobs if job.key not in saved]
    by_key = {job.key: job for job in todo}

    def on_result(record: dict[str, Any]) -> None:
        fields = ("draft", "draft_path", "tau_dec", "test_set", "estimator")
        job = by_key[EvalJob(*(record[f] for f in fields)).key]
        _save_record(folder, job, record)
        tracker.log_metrics(runs[record["draft"]], cell_metrics(record))
        saved[job.key] = record
        display.advance()

    if todo:
        e, target = spec.eval, spec.models.target
        resources = (e.replicas, e.num_cpus, e.num_gpus)
        model = {"dtype": target.dtype, "trust_remote_code": target.trust_remote_code}
        with EvalPool(target_path, prompts, eval_settings(e), *resources, **model) as pool:
            pool.run(todo, on_result=on_result, show_progress=False)
    return [saved[job.key] for job in jobs]


def _output_lengths(
    spec: SweepSpec, target_path: str, prompts: dict[str, list[list[int]]]
) -> dict[str, dict[float, list[int]]]:
    """Token lengths of the target's cached test outputs per test set and τ_dec (paper Fig. 5)."""
    settings = eval_settings(spec.eval)
    lengths: dict[str, dict[float, list[int]]] = {}
    for test_set in TEST_SPLITS:
        for tau in spec.eval.temperatures:
            if test_set not in prompts:
                continue
            path = continuations_file(
                default_continuations_dir(), target_path, prompts[test_set], tau, settings
            )
            if path.exists():
                responses = json.loads(path.read_text())["responses"]
                lengths.setdefault(test_set, {})[tau] = [len(r) for r in responses]
    return lengths


# ---------------------------------------------------------------- report


def _report(spec, tracker, parent, records, drafts, curves, lengths, out: Path) -> Path:
    """Write the report locally, then give MLflow the report and the plain records it was built from."""
    report = build_report(
        records, drafts, curves, lengths, out / "report", title=f"specray sweep: {spec.name}"
    )
    json_lengths = {test_set: {str(t): v for t, v in by_tau.items()} for test_set, by_tau in lengths.items()}
    inputs = {"cells": records, "drafts": drafts, "curves": curves, "lengths": json_lengths}
    for name, payload in inputs.items():
        tracker.log_dict(parent, payload, f"records/{name}.json")
    tracker.log_artifacts(parent, out / "report", "report")
    return report
