"""`specray garden` (a spec with `models.garden`): DistillSpec's model garden (Fig. 6), end to end.

1. distill each smaller target from the largest (the teacher): the teacher's shards, then one online Train
   run per target (`distill.ray_train.distill_runs`, as a sweep's drafts);
2. distill the draft from every raw and every distilled target, the same way (each target's own shards);
3. measure every point of the plot on one eval actor, one after another (batch 1; points never share the
   machine, so their latencies compare): each target alone, raw and distilled; raw target + raw draft;
   raw target + its distilled draft; distilled target + its distilled draft (DistillSpec), also lossily at
   `eval.lenience`'s ε < 1; at every τ_dec of `eval.empirical_temperatures` (else `eval.temperatures`) and
   γ of `eval.gamma`;
4. the report's garden section and MLflow: a parent run with every point's figures, a child run per
   distilled model with its training curves.

Every distilled model is published under its draft key and every point under a key of what it decoded, so a
re-run reuses what is finished and a changed setting recomputes what it changes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specray.cluster.runtime import ray_session
from specray.config import SweepSpec, dump_spec
from specray.distill.curves import CurvePoint, curves_to_json
from specray.draft import Draft, plan_draft
from specray.files import write_json, write_text
from specray.garden.plan import (
    GARDEN_DIR,
    GardenModel,
    check_garden,
    distilled_ref,
    garden_models,
    kd_mixture,
    model_label,
    pair_spec,
)
from specray.keys import garden_point_key, prompt_ids_key
from specray.metrics import LATENCY_MS_PER_TOKEN, QUALITY
from specray.models.sources import model_id, model_path
from specray.progress import SweepDisplay
from specray.report.garden import figures, write_garden_report
from specray.specdec.garden_points import MEASURE_FORMAT, GardenPoint, PointResult
from specray.specdec.workers import measure_garden_points
from specray.sweep.plan import SPEC_FILE, ShardPlan, SweepPlan, plan_shards
from specray.sweep.stages import Stages
from specray.sweep.startup import started
from specray.tracking.client import Tracker, open_tracker
from specray.tracking.names import garden_metric

log = logging.getLogger(__name__)


@dataclass
class GardenOutcome:
    parent_run_id: str
    report: Path
    points: list[PointResult]
    stages: dict[str, dict[str, float]]


@dataclass(frozen=True)
class Distilled:
    """What the garden knows of a model it distilled beyond its `Draft`: its role — "target" (a smaller
    target distilled from the teacher) or "draft" — and its teacher's label."""

    draft: Draft
    role: str
    teacher: str
    student: GardenModel

    @property
    def ref(self):  # noqa: ANN201 (a ModelRef)
        """The distilled model as a model of its own (in the student's dtype)."""
        return distilled_ref(self.student.ref, self.draft.folder)


def run_garden(spec: SweepSpec, show_progress: bool = True) -> GardenOutcome:
    """Run (or resume) the garden; its folder is held for the run (a second run on it is refused)."""
    with started(spec, check_garden) as plan:
        return _run_garden(plan, show_progress)


@dataclass(frozen=True)
class GardenPlan:
    """The garden, planned once before Ray starts (as a sweep's `SweepPlan`): every model it distils, with
    its key and folder, and every point of the plot with the models it decodes with."""

    sweep: SweepPlan
    targets: list[Distilled]  # the smaller targets, distilled from the teacher
    drafts: list[Distilled]  # the draft distilled from every raw and every distilled target
    points: list[GardenPoint]
    folders: ModelFolders  # every model the points decode with, by folder


def plan_garden(plan: SweepPlan) -> GardenPlan:
    """Every distillation and point of the garden of `plan.spec`, from the plan alone (model folders by
    where they are or will be made, nothing built or loaded)."""
    spec = plan.spec
    root = plan.folder / GARDEN_DIR
    models = garden_models(spec)
    teacher, smaller = models[-1], models[:-1]
    student = GardenModel(model_label(spec.models.draft), spec.models.draft)
    targets = [_distilled(plan, teacher, m, "target", root) for m in smaller]
    raw_and_distilled = [*models, *(GardenModel(d.draft.name, d.ref) for d in targets)]
    made = [_distilled(plan, m, student, "draft", root) for m in raw_and_distilled]
    drafts = {m.label: d for m, d in zip(raw_and_distilled, made, strict=True)}
    points = garden_points(spec, models, targets, drafts)
    return GardenPlan(plan, targets, made, points, model_folders(spec, models, [*targets, *made]))


def _run_garden(plan: SweepPlan, show_progress: bool) -> GardenOutcome:
    spec, garden = plan.spec, plan_garden(plan)
    write_text(plan.folder / SPEC_FILE, dump_spec(spec))
    tracker = open_tracker(spec.tracking.uri, spec.experiment)
    parent, _ = tracker.garden_run(spec)
    display = SweepDisplay(enabled=show_progress)

    def logged(made: Distilled, curves: list[CurvePoint]) -> None:
        _log_distilled(spec, tracker, parent, made, curves)

    with ray_session(spec.ray), display, Stages(plan, display) as stages:
        stages.models(spec.models.garden)
        _distill(stages, garden.targets, "distill targets", logged)
        _distill(stages, garden.drafts, "distill drafts", logged)
        with display.stage("garden points", len(garden.points), "point"):
            folder = plan.folder / GARDEN_DIR / "points"
            results = measure_points(plan, stages, garden.points, garden.folders, folder, display)
    report = _report(spec, results, tracker, parent, plan.folder)
    tracker.finish(parent)
    return GardenOutcome(parent, report, results, display.summary)


def _distilled(
    plan: SweepPlan, teacher: GardenModel, student: GardenModel, role: str, root: Path
) -> Distilled:
    """`student` distilled from `teacher` online under the pair's spec (`pair_spec`), on the teacher's own
    shards of the train split, in a folder named by its label and key."""
    pair = pair_spec(plan.spec, teacher.ref, student.ref)
    shards = plan_shards(pair, plan.splits["train"])
    name = f"{student.label}-distilled" if role == "target" else f"draft-of-{teacher.label}"
    folder = lambda key: (root / f"{role}s" / f"{name}-{key[:12]}").absolute()  # noqa: E731
    draft = plan_draft(pair, shards.keys, "online", kd_mixture(plan.spec), name=name, folder=folder)
    return Distilled(draft, role, teacher.label, student)


def _distill(
    stages: Stages,
    made: Sequence[Distilled],
    stage: str,
    logged: Callable[[Distilled, list[CurvePoint]], None],
) -> None:
    """Each teacher's shards, then every distillation through the stage runner (a teacher's shards are
    made once), each distilled model logged to its own child run as it is published."""
    samples: dict[str, ShardPlan] = {}
    for d in made:
        key = "|".join(k.digest for k in d.draft.shards.values())
        samples.setdefault(key, plan_shards(d.draft.train_spec, stages.plan.splits["train"]))
    stages.generate(list(samples.values()), stage=f"shards for {stage.removeprefix('distill ')}")
    by_name = {d.draft.name: d for d in made}
    stages.distill(
        [d.draft for d in made], lambda draft, curves, _: logged(by_name[draft.name], curves), stage
    )


def _log_distilled(
    spec: SweepSpec, tracker: Tracker, parent: str, model: Distilled, curves: list[CurvePoint]
) -> None:
    """A distilled model's child run with its training curves (once: a resumed run finds them logged)."""
    (tau_kd,) = kd_mixture(spec)
    tags = {
        "paradigm": "online",
        "tau_kd": f"{tau_kd:g}",
        "garden_role": model.role,
        "teacher": model.teacher,
    }
    run_id = tracker.child_run(parent, model.draft.name, model.draft.key, tags)
    if "loss" not in tracker.metric_keys(run_id):
        tracker.set_tags(run_id, {"mlflow.runName": f"{spec.name} · {model.draft.name}"})
        tracker.log_curves(run_id, curves_to_json(curves))
        tracker.finish(run_id)


def garden_points(
    spec: SweepSpec, models: Sequence[GardenModel], targets: Sequence[Distilled], drafts: dict[str, Distilled]
) -> list[GardenPoint]:
    """Every point of the plot (`specdec.garden_points.GardenPoint`); a point whose decodes another does
    (the teacher is its own distilled target) is listed once per curve but measured once."""
    e = spec.eval
    path = lambda ref: model_path(ref, spec.models)  # noqa: E731 (where it is or will be made)
    raw_draft = path(spec.models.draft)
    teacher = models[-1]
    distilled = [(d.draft.name, d.ref) for d in targets] + [(teacher.label, teacher.ref)]
    points = []
    for tau in e.empirical_temperatures or e.temperatures:
        # lossy points only at τ > 0: greedy verification has no ratio to relax (`LenienceSpec.points`)
        lossy = [(f, eps) for f, eps in e.lenience.points(tau) if f is not None and eps < 1.0]
        for m in models:
            points.append(GardenPoint("raw", m.label, path(m.ref), None, tau))
        for name, ref in distilled:
            points.append(GardenPoint("distilled", name, path(ref), None, tau))
        for gamma in e.gamma:
            for m in models:
                points.append(GardenPoint("speculative", m.label, path(m.ref), raw_draft, tau, gamma))
                kd = path(drafts[m.label].ref)
                points.append(GardenPoint("speculative_kd", m.label, path(m.ref), kd, tau, gamma))
            for name, ref in distilled:
                kd = path(drafts[name].ref)
                points.append(GardenPoint("distillspec", name, path(ref), kd, tau, gamma))
                for function, eps in lossy:
                    points.append(
                        GardenPoint("distillspec_lossy", name, path(ref), kd, tau, gamma, function, eps)
                    )
    return points


@dataclass(frozen=True)
class ModelFolders:
    """Every model a garden's points decode with, by folder: what it is (`ids`: the zoo entry's id or the
    name or path it was given, or `distilled/<draft key>` for a model the garden distilled, so a point's
    key does not change with where the folders are) and how it loads (`load`: dtype, remote code)."""

    ids: dict[str, str]
    load: dict[str, dict[str, Any]]


def model_folders(
    spec: SweepSpec, raw: Sequence[GardenModel], distilled: Sequence[Distilled]
) -> ModelFolders:
    named = [(m.ref, model_id(m.ref, spec.models)) for m in raw]
    named.append((spec.models.draft, model_id(spec.models.draft, spec.models)))
    named += [(d.ref, f"distilled/{d.draft.key}") for d in distilled]
    ids, load = {}, {}
    for ref, identity in named:
        folder = model_path(ref, spec.models)
        ids[folder] = identity
        load[folder] = {"dtype": ref.dtype, "trust_remote_code": ref.trust_remote_code}
    return ModelFolders(ids, load)


def point_key(spec: SweepSpec, point: GardenPoint, folders: ModelFolders, prompts_fingerprint: str) -> str:
    """A point's key (`keys.garden_point_key`): the models it decodes with by what they are, not where
    their folders are."""
    decodes = {k: v for k, v in point.to_json().items() if k not in ("curve", "model", "target", "draft")}
    decodes["target"] = folders.ids[point.target]
    decodes["draft"] = None if point.draft is None else folders.ids[point.draft]
    return garden_point_key(spec, decodes, prompts_fingerprint, MEASURE_FORMAT)


def garden_prompts(plan: SweepPlan, stages: Stages) -> tuple[list[list[int]], list[Any], str]:
    """The first `eval.empirical_prompts` prompts of the first test set (as the empirical cells take),
    their examples, and a fingerprint of the prompts' token ids (encoded with the teacher's tokenizer,
    which every model shares)."""
    test_set = plan.spec.eval.test_sets[0]
    n = plan.spec.eval.empirical_prompts
    prompts = stages.prompts[test_set][:n]
    examples = list(plan.prompt_sets[test_set].examples[:n])
    return prompts, examples, prompt_ids_key(prompts)


def measure_points(
    plan: SweepPlan,
    stages: Stages,
    points: Sequence[GardenPoint],
    folders: ModelFolders,
    folder: Path,
    display: SweepDisplay,
) -> list[PointResult]:
    """Every point's figures: read back where saved under its key, else measured on one eval actor
    (`specdec.workers.measure_garden_points`) and saved as it ends (a killed run keeps the points it
    finished)."""
    spec = plan.spec
    prompts, examples, prompts_fingerprint = garden_prompts(plan, stages)
    keys = [point_key(spec, p, folders, prompts_fingerprint) for p in points]
    saved: dict[str, PointResult] = {}
    for key in set(keys):
        file = folder / f"{key}.json"
        if file.exists():
            saved[key] = PointResult.from_json(json.loads(file.read_text()))
    display.advance(sum(k in saved for k in keys), reused=True)
    todo: dict[str, GardenPoint] = {}  # one measurement per key: the same decodes may serve two curves
    for point, key in zip(points, keys, strict=True):
        if key not in saved:
            todo.setdefault(key, point)
    order = list(todo)

    def measured(index: int, payload: dict[str, Any]) -> None:
        key = order[index]
        result = replace(PointResult.from_json(payload), key=key)
        write_json(folder / f"{key}.json", result.to_json(), indent=None)
        saved[key] = result
        display.note(result.point.label)
        display.advance(keys.count(key))

    if todo:
        points_todo = [todo[k] for k in order]
        measure_garden_points(spec, points_todo, plan.target_path, prompts, examples, folders.load, measured)
    # a saved point's figures under the name this run gives it
    return [replace(saved[k], point=p) for p, k in zip(points, keys, strict=True)]


def _report(spec: SweepSpec, results: list[PointResult], tracker: Tracker, parent: str, out: Path) -> Path:
    """The garden's report (Markdown and figure) and its MLflow side: every point's figures as metrics,
    the points' records and the report as artifacts."""
    folder = out / "report"
    report = write_garden_report(spec.name, results, folder, spec.eval.seed)
    latency, quality = figures(results)
    metrics = {}
    for result, lat, qual in zip(results, latency, quality, strict=True):
        label = result.point.label
        metrics[garden_metric(label, LATENCY_MS_PER_TOKEN)] = float(lat)
        if qual == qual:  # nan: no prompt of the test set has a quality score
            metrics[garden_metric(label, QUALITY)] = float(qual)
    tracker.log_metrics(parent, metrics)
    tracker.log_dict(parent, [r.to_json() for r in results], "records/garden_points.json")
    tracker.log_artifacts(parent, folder, "report")
    return report
