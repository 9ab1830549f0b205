"""The Ray Tune run of `specray tune` (new or restored) and its trials' record in MLflow.

Searcher: Optuna TPE (`tune.search: optuna`, behind a ConcurrencyLimiter) or random search, both seeded by
`tune.seed`, reading the `objective` of each trial's last result. During training that value is the
objective's estimate from the probe; a trial ASHA stops early therefore reaches Optuna with its estimate at
the step where it was stopped — lower than it would have ended, which is the direction ASHA judged.
Scheduler: ASHA on `acceptance_estimate`, with the KD step as time (`max_t` = the step budget, grace period
= `tune.asha_grace_period` reports); its stops depend on when trials report, so two runs can choose
differently. With `tune.early_stopping: none` no trial stops early and Optuna proposes trials in batches of
`tune.max_concurrent_trials`, each from the results of every earlier batch: the choices then depend on the
trials' results only, and a trial's draft is its recipe's (seeded by `distill.seed`), so the same command on
the same machine picks the same winner.

Trials go to MLflow once the search returns, from Tune's own record of every result (`ResultGrid`): one
child run per trial with its config and recipe as params, its curves at their KD steps, its measured
validation cells and a `status` tag (completed, stopped_early, error). Doing it after the search keeps
every MLflow call on the driver's main thread and out of Tune's pickled state, and makes it idempotent: a
resumed search logs each trial once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ray.tune import Callback

from specray.config import SweepSpec, TuneSpec
from specray.sweep.tune.space import Recipe, recipe_from_config, search_space, steps_budget
from specray.sweep.tune.trial import (
    ACCEPTANCE_ESTIMATE,
    DRAFT_DIR,
    MEASURED,
    OBJECTIVE,
    TrialContext,
    run_trial,
)
from specray.tracking.client import Tracker

MAX_TRIAL_FAILURES = 2  # a crashed trial restarts (and resumes its checkpoint) this often
CURVE_KEYS = ("loss", "tokens_per_s", "seconds_per_step", "lr", ACCEPTANCE_ESTIMATE)


class SearchFailed(RuntimeError):
    """The search ended without any trial that finished its training budget."""


class TrialsEnded(Callback):
    """Advances the driver's progress display as trials end.

    Tune pickles its callbacks with the experiment, and a live display (threads, a console) cannot be
    pickled: the pickled copy has none, so a restored search moves the display only when it returns.
    """

    def __init__(self, advance: Callable[[], None] | None = None) -> None:
        self.advance = advance

    def __getstate__(self) -> dict[str, Any]:
        return {"advance": None}

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        if self.advance is not None:
            self.advance()

    on_trial_error = on_trial_complete


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id  # short, and the same name as the trial's draft folder


def _search_alg(t: TuneSpec) -> Any:
    if t.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        optuna = OptunaSearch(metric=OBJECTIVE, mode="max", seed=t.seed)
        # batch: the next trials are proposed once every running one has ended, from the same history
        # whatever order they ended in (Tune's default proposes one as soon as any trial ends)
        batch = t.early_stopping == "none"
        return ConcurrencyLimiter(optuna, max_concurrent=t.max_concurrent_trials, batch=batch)
    from ray.tune.search import BasicVariantGenerator

    return BasicVariantGenerator(max_concurrent=t.max_concurrent_trials, random_state=t.seed)


def _tuner(spec: SweepSpec, trainable: Any, path: Path, on_trial_end: Callable[[], None] | None) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    t = spec.tune
    scheduler = (
        FIFOScheduler()
        if t.early_stopping == "none"
        else ASHAScheduler(
            time_attr="step",
            metric=ACCEPTANCE_ESTIMATE,
            mode="max",
            max_t=steps_budget(spec),
            grace_period=t.asha_grace_period * spec.distill.report_every,
            reduction_factor=t.asha_reduction_factor,
        )
    )
    tune_config = tune.TuneConfig(
        search_alg=_search_alg(t),
        scheduler=scheduler,
        num_samples=t.num_samples,
        trial_dirname_creator=_trial_dirname,
        reuse_actors=False,
    )
    run_config = tune.RunConfig(
        name=path.name,
        storage_path=str(path.parent),
        failure_config=tune.FailureConfig(max_failures=MAX_TRIAL_FAILURES),
        callbacks=[TrialsEnded(on_trial_end)],
        verbose=0,  # the driver's display shows progress; Tune's tables would list every trial twice a minute
    )
    return tune.Tuner(
        trainable, param_space=search_space(spec), tune_config=tune_config, run_config=run_config
    )


def search(
    spec: SweepSpec,
    context: TrialContext,
    path: Path,
    resume: bool,
    on_trial_end: Callable[[], None] | None = None,
) -> Any:
    """Run the search in `path` (Tune's experiment folder), or continue it there; returns the ResultGrid.
    `on_trial_end` is called as each trial ends (not after a restore, see TrialsEnded)."""
    from ray import tune

    d = spec.distill
    resources = {"cpu": d.num_cpus_per_worker, "gpu": d.num_gpus_per_worker}
    trainable = tune.with_resources(tune.with_parameters(run_trial, context=context), resources)
    if resume and tune.Tuner.can_restore(path):
        tuner = tune.Tuner.restore(str(path), trainable, resume_unfinished=True)
    else:
        tuner = _tuner(spec, trainable, path, on_trial_end)
    return tuner.fit()


# ---------------------------------------------------------------- the trials' record


def _history(result: Any) -> list[dict[str, Any]]:
    """Every result a trial reported, one per KD step (a restarted trial reports some steps again)."""
    frame = result.metrics_dataframe
    if frame is None or frame.empty or "step" not in frame:
        return []
    rows = frame.drop_duplicates("step", keep="last").sort_values("step")
    return rows.to_dict("records")


@dataclass(frozen=True)
class TrialRecord:
    """One Tune trial as the search left it: its recipe, status, measured objective (None unless
    completed), last metrics and per-step history, its draft folder and (once logged) its MLflow run."""

    trial_id: str
    status: str  # completed | stopped_early | error
    recipe: Recipe
    config: dict[str, Any]
    objective: float | None
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    draft_dir: Path
    run_id: str = ""


def summarise(spec: SweepSpec, results: Any, trials_dir: Path) -> list[TrialRecord]:
    """One record per trial of Tune's ResultGrid."""
    trials = []
    for result in results:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name
        measured = metrics.get(MEASURED) == 1
        status = "error" if result.error else "completed" if measured else "stopped_early"
        trials.append(
            TrialRecord(
                trial_id=trial_id,
                status=status,
                recipe=recipe_from_config(spec, result.config),
                config=dict(result.config),
                objective=float(metrics[OBJECTIVE]) if measured else None,
                metrics=metrics,
                history=_history(result),
                draft_dir=trials_dir / trial_id / DRAFT_DIR,
            )
        )
    return trials


def _curve_point(row: dict[str, Any]) -> dict[str, Any]:
    """The MLflow curve of one result: the loop's curve keys, the ASHA signal and the objective's estimate
    (the measured objective is logged apart, so the two never share a metric)."""
    point = {k: v for k, v in row.items() if k in CURVE_KEYS or k.startswith("acceptance_rate/")}
    if row.get(MEASURED) == 0:
        point["objective_estimate"] = row.get(OBJECTIVE)
    clean = {k: float(v) for k, v in point.items() if isinstance(v, int | float) and math.isfinite(v)}
    return clean | {"step": int(row["step"])}


def _final_cells(metrics: dict[str, Any]) -> dict[str, float]:
    """The measured objective and the validation cells of a completed trial's last result."""
    cells = {k: v for k, v in metrics.items() if "/validation/" in k}
    return cells | {OBJECTIVE: metrics[OBJECTIVE]}


def log_trial(tracker: Tracker, parent: str, trial: TrialRecord, steps: int) -> str:
    """The trial's child run (config as params, curves as metrics, status tag), logged once."""
    recipe = trial.recipe
    tags = {"paradigm": recipe.paradigm, "mixture": recipe.mixture_tag, "tau_kd": "", "status": trial.status}
    run_id = tracker.trial_run(parent, trial.trial_id, recipe.name, tags)
    tracker.set_tags(run_id, {"status": trial.status})
    if ACCEPTANCE_ESTIMATE not in tracker.metric_keys(run_id):
        params = trial.config | {"mixture": recipe.mixture_tag, "paradigm": recipe.paradigm}
        tracker.log_params(run_id, params | {f"distill.{k}": v for k, v in recipe.distill.items()})
        tracker.log_curves(run_id, [_curve_point(row) for row in trial.history])
        if trial.status == "completed":
            tracker.log_metrics(run_id, _final_cells(trial.metrics), step=steps)
    tracker.finish(run_id, ok=trial.status != "error")
    return run_id


def record_trials(
    spec: SweepSpec, tracker: Tracker, parent: str, results: Any, trials_dir: Path
) -> tuple[list[TrialRecord], TrialRecord]:
    """Log every trial to MLflow; returns the trials and the winner (highest measured objective)."""
    trials = [
        replace(trial, run_id=log_trial(tracker, parent, trial, steps_budget(spec)))
        for trial in summarise(spec, results, trials_dir)
    ]
    completed = [t for t in trials if t.status == "completed"]
    if not completed:
        errors = [str(r.error).splitlines()[0] for r in results if r.error][:3]
        raise SearchFailed(
            f"none of the {len(trials)} trials finished its training budget; "
            f"first errors: {errors or 'none'} (Tune's folder: {results.experiment_path})"
        )
    return trials, max(completed, key=lambda t: t.objective or 0.0)
