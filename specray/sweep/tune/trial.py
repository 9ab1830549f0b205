"""One Tune trial of `specray tune`: distill a draft on the trial's τ_kd mixture, then score it on validation.

The trial runs the plain train loop (`loop.train_draft`, the loop `specray distill` runs under Ray Train) in
the trial's own process, with one distill worker's resources. Each curve point goes to Tune as it is
produced: the ASHA signal (`acceptance_estimate`: the probe's acceptance averaged over the objective
τ_dec) and an estimate of the objective from it (i.i.d. block efficiency at that α). The last point is held
back and reported together with the measured objective — the analytic `speedup_model` on the validation
split, averaged over the objective τ_dec — because ASHA stops a trial at its last step (`max_t`).

Nothing here reads the teacher shards or starts a teacher: the rows come from the driver, which read the
cached shards once (`TrialContext.inputs`). A trial that is restarted (worker failure, `--resume`) resumes
its distillation from the latest checkpoint in its folder, and one that had already measured its objective
reports the saved result again without training or evaluating.

A trial's draft is planned like every other (`specray.draft.plan_draft`: the recipe's budget spec, the
shards' keys), so its key is the one a baseline of the same recipe has.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specray.config import SweepSpec
from specray.data.shards import ShardKey
from specray.distill.checkpoints import is_finished, read_curves
from specray.distill.curves import CurvePoint
from specray.distill.inputs import DistillInputs
from specray.draft import plan_draft
from specray.files import write_atomic
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.tune.space import (
    acceptance_estimate,
    budget_spec,
    objective,
    recipe_from_config,
    speedup_estimate,
)
from specray.tracking.names import cell_metrics, metric_key

VALIDATION = "validation"
OBJECTIVE, ACCEPTANCE_ESTIMATE, MEASURED = "objective", "acceptance_estimate", "measured"
TRIAL_RESULT, DRAFT_DIR = "trial_result.json", "draft"


@dataclass(frozen=True)
class TrialContext:
    """What every trial shares, prepared once by the driver and passed through Ray's object store."""

    spec: dict[str, Any]  # the resolved sweep spec (JSON form)
    inputs: DistillInputs  # rows of every τ_kd shard, absolute model paths, probe prompts
    validation_prompts: list[list[int]]
    step_costs: StepCosts  # measured once: every draft has the same architecture
    trials_dir: str  # absolute: Tune runs a trial with its own working directory
    shard_keys: dict[float, ShardKey]  # the τ_kd shards the rows were read from (the drafts' key inputs)


def progress_metrics(curve: CurvePoint, spec: SweepSpec, step_costs: StepCosts) -> dict[str, Any]:
    """One curve point as a Tune result: step, the ASHA signal, the objective's estimate, the curve."""
    taus = spec.tune.objective_temperatures
    alpha = acceptance_estimate(curve, taus)
    estimate = speedup_estimate(curve, taus, step_costs, spec.eval.gamma)
    flat = curve.to_json()  # a Tune result is the curve's JSON edge: its keys, sanitised for MLflow
    metrics: dict[str, Any] = {metric_key(k): v for k, v in flat.items() if isinstance(v, int | float)}
    return metrics | {
        "step": curve.step,
        ACCEPTANCE_ESTIMATE: math.nan if alpha is None else alpha,
        OBJECTIVE: math.nan if estimate is None else estimate,
        MEASURED: 0,
    }


def _validate(spec: SweepSpec, context: TrialContext, draft: Path, name: str) -> list[CellRecord]:
    """The draft's analytic records on the validation split at each objective τ_dec and γ (fixed c)."""
    from specray.distill.loop import worker_resources
    from specray.specdec.cells import eval_settings
    from specray.specdec.evaluator import EvalJob, Evaluator

    settings = eval_settings(spec.eval, context.step_costs)
    target = spec.models.target
    device = str(worker_resources(spec).torch_device())  # the trial's own resources: one distill worker's
    evaluator = Evaluator(
        context.inputs.target_path,
        {VALIDATION: context.validation_prompts},
        settings,
        dtype=target.dtype,
        trust_remote_code=target.trust_remote_code,
        device=device,
    )
    records = []
    for tau in spec.tune.objective_temperatures:  # one pass per τ_dec: every γ from the same β
        jobs = [EvalJob(name, str(draft), tau, VALIDATION, "analytic", gamma) for gamma in spec.eval.gamma]
        records += evaluator.evaluate(jobs)
    return records


def final_metrics(
    spec: SweepSpec, curves: list[CurvePoint], records: list[CellRecord], step_costs: StepCosts
) -> dict[str, Any]:
    """The trial's last result: its last curve point plus the measured objective and validation cells."""
    with_gamma = len(spec.eval.gamma) > 1
    cells = {name: value for record in records for name, value in cell_metrics(record, with_gamma).items()}
    measured = objective(records, spec.tune.objective_temperatures)
    return progress_metrics(curves[-1], spec, step_costs) | cells | {OBJECTIVE: measured, MEASURED: 1}


def run_trial(config: dict[str, Any], context: TrialContext) -> None:
    """Tune's function trainable (wrapped by `tune.with_parameters(run_trial, context=...)`)."""
    from ray import tune
    from transformers.utils import logging as hf_logging

    from specray.distill.loop import train_draft, worker_resources

    hf_logging.disable_progress_bar()
    spec = SweepSpec.model_validate(context.spec)
    recipe = recipe_from_config(spec, config)
    trial_spec = budget_spec(spec, recipe)
    folder = Path(context.trials_dir) / tune.get_context().get_trial_id()
    saved = folder / TRIAL_RESULT
    if saved.exists():  # measured before the driver died: report it again, redo nothing
        tune.report(json.loads(saved.read_text()))
        return
    worker_resources(trial_spec).enter()  # threads as reserved (no oversubscription)
    draft, steps = folder / DRAFT_DIR, trial_spec.distill.steps

    def report(curve: CurvePoint) -> None:
        if curve.step < steps:  # the last point goes out with the objective (ASHA stops at max_t)
            tune.report(progress_metrics(curve, trial_spec, context.step_costs))

    planned = plan_draft(trial_spec, context.shard_keys, recipe.paradigm, recipe.mixture, folder=draft)
    if not is_finished(draft, planned.key):
        rows = {tau: context.inputs.rows[tau] for tau in recipe.mixture}
        train_draft(planned, report, inputs=replace(context.inputs, rows=rows))
    records = _validate(trial_spec, context, draft, recipe.name)
    result = final_metrics(trial_spec, read_curves(draft), records, context.step_costs)
    write_atomic(saved, lambda path: path.write_text(json.dumps(result)))
    tune.report(result)
