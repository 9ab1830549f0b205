"""`specray run`: zoo → teacher shards → distillation per (paradigm, τ_kd) → step costs → eval cells → report.

The driver of a sweep: it plans (`sweep/plan.py`: every key computed once), says what of the plan is on
disk (`sweep/survey.py`; `specray run --dry-run` prints only that), runs the stages (`sweep/stages.py`, the
runner the tune search and the model garden share), logs them to MLflow (`sweep/tracked.py`) and writes
the report. Every result is cached under a key of everything that made it (`specray/keys/`), so a changed
setting recomputes what it changes and nothing else, and a result made under other settings is never
reported under the new ones.

Resumable by the same token: a re-run after the driver died finds the unfinished MLflow parent run with the
spec's key, reuses every finished shard, draft and cell, and backfills MLflow with anything the driver saved
locally but had not logged yet. All MLflow calls happen on this (the driver's main) thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specray.cluster.runtime import ray_session
from specray.config import ModelRef, SweepSpec, dump_spec
from specray.distill.curves import CurvePoint, curves_to_json
from specray.draft import Draft
from specray.files import write_text
from specray.models.loading import load_tokenizer
from specray.progress import SweepDisplay
from specray.report.build import build_report
from specray.specdec.cells import workload_json
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.plan import SPEC_FILE, SweepPlan
from specray.sweep.stages import Stages
from specray.sweep.startup import started
from specray.sweep.survey import StagePlan, Survey, survey
from specray.sweep.tracked import DraftRuns, log_missing, sweep_data
from specray.tracking.client import describe_sweep, open_tracker
from specray.tracking.lineage import DRAFTS_VIEW

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


def run_sweep(
    spec: SweepSpec, show_progress: bool = True, on_plan: Callable[[SweepPlan, Survey], None] | None = None
) -> SweepOutcome:
    """Run (or resume) the whole sweep; returns where the report is and what was measured. The sweep's
    output folder is held for the whole run: a second run on it is refused (`locks.FolderInUse`)."""
    with started(spec) as plan:
        return _run_sweep(plan, show_progress, on_plan)


def _run_sweep(
    plan: SweepPlan, show_progress: bool, on_plan: Callable[[SweepPlan, Survey], None] | None
) -> SweepOutcome:
    spec = plan.spec
    write_text(plan.folder / SPEC_FILE, dump_spec(spec))  # the settings its results are keyed by (export)
    found = survey(plan)
    if on_plan is not None:
        on_plan(plan, found)
    tracker = open_tracker(spec.tracking.uri, spec.experiment)  # unreachable MLflow fails before any work
    parent, resumed = tracker.parent_run(spec)
    describe_sweep(tracker, parent, spec, sweep_data(plan), len(plan.drafts))  # before any work
    runs = DraftRuns(tracker, parent, plan)
    display = SweepDisplay(enabled=show_progress)
    curves: dict[str, list[CurvePoint]] = {}

    def draft_done(draft: Draft, points: list[CurvePoint], reused: bool) -> None:
        curves[draft.name] = points
        runs.draft_done(draft, points, reused)

    with ray_session(spec.ray), display, Stages(plan, display) as stages:
        stages.models()
        stages.generate()
        runs.open(plan.drafts)
        stages.distill(plan.drafts, draft_done)
        runs.open([plan.baseline])
        cost = stages.time_steps()
        records = stages.evaluate(plan.cell_jobs(cost), cost, runs.records_done, saved=found.cells)
        outputs = stages.target_outputs()
    tokenizer = load_tokenizer(plan.target_path, spec.models.target.trust_remote_code)
    lengths = {
        test_set: {tau: [len(r) for r in rs] for tau, rs in by.items()} for test_set, by in outputs.items()
    }
    characters = token_characters(outputs, tokenizer)
    drafts = list(plan.evaluated)
    report = _report(spec, tracker, parent, records, drafts, curves, (lengths, characters), cost, plan.folder)
    stage_metrics = {f"stage_seconds/{k.replace(' ', '_')}": v["seconds"] for k, v in display.summary.items()}
    log_missing(tracker, parent, stage_metrics | cost_metrics(cost))
    runs.finish()
    tracker.finish(parent)
    page = tracker.runs_page(DRAFTS_VIEW)
    return SweepOutcome(parent, resumed, report, records, cost, found.stages, display.summary, page)


def cost_metrics(cost: StepCosts) -> dict[str, float]:
    """The step costs as parent-run metrics: c, and every timing in milliseconds."""
    metrics = {"cost_ratio": cost.cost_ratio(cost.batch_sizes[0])}
    for b in cost.batch_sizes:
        metrics[f"step_ms/draft/batch_{b}"] = 1e3 * cost.draft[b].seconds
        metrics |= {f"step_ms/target/batch_{b}/k_{k}": 1e3 * t.seconds for k, t in cost.target[b].items()}
    return metrics


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


def models_line(spec: SweepSpec) -> str:
    """What the report's cells are of: each model's id (a GGUF file also by its name)."""
    from specray.models.sources import model_id
    from specray.named_files import gguf_path

    def named(ref: ModelRef) -> str:
        file = f" ({gguf_path(ref.gguf).name})" if ref.gguf is not None else ""
        return f"`{model_id(ref, spec.models)}`{file}"

    return f"Target {named(spec.models.target)}; draft {named(spec.models.draft)}."


def _report(spec, tracker, parent, records, drafts, curves, outputs, cost: StepCosts, out: Path) -> Path:
    """Write the report locally, then give MLflow the report and the plain records it was built from.
    `drafts`: the plan's; `outputs`: (token lengths of the target's test outputs, their characters-per-token
    counts)."""
    lengths, characters = outputs
    report = build_report(
        records,
        drafts,
        curves,
        lengths,
        out / "report",
        title=f"specray sweep: {spec.name}",
        step_costs=cost,
        projected_cost_ratio=spec.eval.projected_cost_ratio,
        token_lengths=characters,
        workload=workload_json(spec),
        models=models_line(spec),
    )
    json_lengths = {test_set: {str(t): v for t, v in by_tau.items()} for test_set, by_tau in lengths.items()}
    json_curves = {name: curves_to_json(points) for name, points in curves.items()}
    cells, listed = [r.to_json() for r in records], [d.to_json() for d in drafts]
    inputs = {"cells": cells, "drafts": listed, "curves": json_curves, "lengths": json_lengths}
    inputs["step_costs"] = cost.to_json()
    inputs["workload"] = workload_json(spec) or {}
    inputs["models"] = {"line": models_line(spec)}  # `specray report RUN_ID` rebuilds the same header
    inputs["token_lengths"] = {
        test_set: {str(t): {str(k): n for k, n in c.items()} for t, c in by.items()}
        for test_set, by in characters.items()
    }
    for name, payload in inputs.items():
        tracker.log_dict(parent, payload, f"records/{name}.json")
    tracker.log_artifacts(parent, out / "report", "report")
    return report
