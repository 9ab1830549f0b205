"""A whole sweep: run (or resume) it, rebuild its report, export its answer for serving, tune mixtures."""

from __future__ import annotations

from pathlib import Path

import typer

from specray.cli.common import OverridesArg, SweepArg, app, resumable, set_threads, stage_spec, user_errors
from specray.cli.results import record_run
from specray.config import load_spec
from specray.named_files import check_named_files


@app.command()
def run(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be reused and computed; run nothing."
    ),
) -> None:
    """Run a whole sweep (zoo, teacher shards, distillation, evaluation, report); re-run to resume.

    Every result is cached under a key of the settings that made it: the run first prints, per stage, what
    it reuses and what it will compute and why."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])  # a bad spec is refused before the heavy imports below
        check_named_files(spec)  # so is a mistyped data path or model folder, by its field
        from specray.garden.plan import require_sweep
        from specray.sweep.plan import sweep_dir
        from specray.sweep.run import run_sweep
        from specray.sweep.startup import dry_run as planned

        require_sweep(spec, "specray run")
        if dry_run:
            _print_plan(*planned(spec), drafts=True)
            return
        set_threads()
        with resumable(sweep_dir(spec)):
            outcome = run_sweep(spec, on_plan=_print_plan)
    state = "resumed" if outcome.resumed else "new"
    typer.echo(
        f"sweep {spec.name}: {len(outcome.records)} cells; MLflow run {outcome.parent_run_id} ({state})"
    )
    typer.echo(f"  {outcome.step_costs.describe()}")
    for stage, figures in outcome.stages.items():
        typer.echo(
            f"  {stage:15s} {figures['seconds']:8.1f}s   peak memory in use {figures['peak_gib']:.2f} GiB"
        )
    typer.echo(f"report: {outcome.report}")
    if not spec.tracking.uri.startswith(("http://", "https://")):
        typer.echo(
            f"MLflow UI: mlflow ui --backend-store-uri {spec.tracking.uri} --host 127.0.0.1, then open"
        )
    typer.echo(f"MLflow runs: {outcome.runs_page}")
    record_run(spec, outcome)  # docs/results/*.json, when SPECRAY_RECORD names one (specray/cli/results.py)


@app.command()
def garden(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print what would be distilled and measured; run nothing."
    ),
) -> None:
    """Run DistillSpec's model garden (a spec with `models.garden`): distil the smaller targets and a draft
    for each, then measure quality against latency at every point; re-run to resume."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])
        check_named_files(spec)
        from specray.garden.plan import require_garden

        require_garden(spec)
        _run_garden(spec, dry_run)


def _run_garden(spec, dry_run: bool) -> None:  # noqa: ANN001 (a SweepSpec; imported lazily)
    from specray.distill.checkpoints import is_finished
    from specray.garden.plan import check_garden, garden_models
    from specray.garden.run import plan_garden, run_garden
    from specray.sweep.plan import sweep_dir
    from specray.sweep.startup import dry_run as planned

    plan, _ = planned(spec, check_garden)
    labels = [m.label for m in garden_models(spec)]
    typer.echo(
        f"garden {spec.name}: targets {', '.join(labels)} (teacher {labels[-1]}); distils {len(labels) - 1} "
        f"targets and {2 * len(labels) - 1} drafts, then measures every point at batch 1"
    )
    if dry_run:
        garden = plan_garden(plan)
        for made in [*garden.targets, *garden.drafts]:
            done = "finished" if is_finished(made.draft.folder, made.draft.key) else "to distill"
            typer.echo(f"  {made.role:6s} {made.draft.name:32s} key {made.draft.key[:12]}  {done}")
        train = len(plan.splits["train"])
        typer.echo(f"  {len(garden.points)} points; train split {train} prompts; nothing run")
        return
    set_threads()
    with resumable(sweep_dir(spec)):
        outcome = run_garden(spec)
    typer.echo(f"garden {spec.name}: {len(outcome.points)} points; MLflow run {outcome.parent_run_id}")
    record_run(spec, outcome)
    for stage, figures in outcome.stages.items():
        typer.echo(
            f"  {stage:15s} {figures['seconds']:8.1f}s   peak memory in use {figures['peak_gib']:.2f} GiB"
        )
    typer.echo(f"report: {outcome.report}")


@app.command()
def report(
    run_id: str = typer.Argument(..., help="MLflow run id of a sweep's parent run."),
    tracking_uri: str = typer.Option("sqlite:///mlflow.db", "--tracking-uri", help="Where that run lives."),
    output: Path | None = typer.Option(None, "--output", help="Report folder (default: reports/<run id>)."),
    tune: Path | None = typer.Option(
        None,
        "--tune",
        help="A finished `specray tune` folder (<output_dir>/<name>/tune): Table 3 and its verdict.",
    ),
) -> None:
    """Rebuild a sweep's or a model garden's report (figures, tables, Markdown) from what its MLflow parent
    run holds."""
    import tempfile

    from specray.distill.curves import curves_from_json
    from specray.report.build import build_report
    from specray.report.tables import load_composition
    from specray.specdec.records import StepCosts
    from specray.tracking.fetch import fetch_sweep_records, run_role

    folder = output or Path("reports") / run_id
    with user_errors():
        role = run_role(tracking_uri, run_id)
    if role == "garden":
        if tune is not None:
            typer.echo("error: --tune: a garden has no composition search; leave it out", err=True)
            raise typer.Exit(2)
        _garden_report(tracking_uri, run_id, folder)
        return
    with user_errors(), tempfile.TemporaryDirectory() as tmp:
        records = fetch_sweep_records(tracking_uri, run_id, Path(tmp))
    title = f"specray sweep: {records['name']} (MLflow run {run_id})"
    curves = {name: curves_from_json(points) for name, points in records["curves"].items()}
    parts = (records["cells"], records["drafts"], curves, records["lengths"])
    cost = StepCosts.from_json(records["step_costs"]) if records.get("step_costs") else None
    extra = {"step_costs": cost, "projected_cost_ratio": records["projected_cost_ratio"]}
    extra |= {"token_lengths": records.get("token_lengths"), "workload": records.get("workload") or None}
    extra["models"] = (records.get("models") or {}).get("line")  # None for a sweep logged before it
    if tune is not None:
        with user_errors():
            extra["composition"] = load_composition(tune)
    path = build_report(*parts, folder, title=title, **extra)
    typer.echo(f"report: {path}")


def _garden_report(tracking_uri: str, run_id: str, folder: Path) -> None:
    """A garden's report rebuilt from the points its parent run holds: the same figures and intervals
    (the same seed) as the run wrote."""
    import tempfile

    from specray.report.garden import write_garden_report
    from specray.specdec.garden_points import PointResult
    from specray.tracking.fetch import fetch_garden_records

    with user_errors(), tempfile.TemporaryDirectory() as tmp:
        records = fetch_garden_records(tracking_uri, run_id, Path(tmp))
    points = [PointResult.from_json(p) for p in records["points"]]
    path = write_garden_report(records["name"], points, folder, records["seed"])
    typer.echo(f"report: {path}")


@app.command()
def export(
    source: str = typer.Argument(
        ..., help="A finished sweep: its output folder or its MLflow parent run id."
    ),
    to: Path = typer.Option(..., "--to", help="Export folder (empty, or an earlier export to refresh)."),
    bands: str | None = typer.Option(
        None, "--bands", help="Band edges from 0, e.g. 0,0.3,0.7 (default: one band per measured τ_dec)."
    ),
    test_set: str = typer.Option("in_domain", "--test-set", help="The test set whose cells decide."),
    min_speedup: float = typer.Option(
        1.0, "--min-speedup", help="A draft is routed only if its speedup's 95% interval lies above this."
    ),
    tracking_uri: str | None = typer.Option(
        None, "--tracking-uri", help="MLflow of the run id / for the registry (default: the sweep's)."
    ),
    register_drafts: bool = typer.Option(True, "--register/--no-register", help="MLflow model registry."),
    verify: bool = typer.Option(False, "--verify", help="Check the plan with HF assisted generation."),
    verify_prompts: int = typer.Option(32, "--verify-prompts", min=2, help="Held-out test prompts per band."),
) -> None:
    """Export a sweep's answer for serving: per band of request temperatures the draft and γ with the best
    speedup (or no speculation), as HF draft folders with metadata, routing.json, vLLM and SGLang settings."""
    from specray.cli.results import record_checks
    from specray.serving.command import run_export, verify_outcome

    with user_errors():
        outcome = run_export(source, to, bands, test_set, min_speedup, tracking_uri, register_drafts)
    _print_routes(outcome)
    if verify:
        set_threads()
        with user_errors():
            checks = verify_outcome(outcome, verify_prompts)
        _print_checks(checks, outcome.folder)
        record_checks(checks)
        missed = [c.alias for c in checks if not (c.agrees and c.ours_agrees)]
        if missed:  # a plan that promises what its own decoder or HF does not measure is not shipped quietly
            typer.echo(f"verify: {len(missed)} of {len(checks)} bands missed: {', '.join(missed)}", err=True)
            raise typer.Exit(1)


def _print_routes(outcome) -> None:
    typer.echo(f"export written to {outcome.folder} (routing.json, drafts/, vllm/, sglang/, README.md)")
    for band in outcome.plan["bands"]:
        what = (
            f"{band['draft_name']} γ={band['gamma']}" if band["route"] == "speculative" else "no speculation"
        )
        typer.echo(f"  {band['alias']:12s} {what:36s} {band['reason']}")
        per_batch = band.get("batch_sizes", [])
        if len(per_batch) > 1:  # γ per batch-size band (0: no speculation at that load)
            gammas = ", ".join(f"B≥{entry['low']}: γ={entry['gamma']}" for entry in per_batch)
            typer.echo(f"  {'':12s} by batch size: {gammas}")
    if "workload" in outcome.plan:
        workload = outcome.plan["workload"]
        drafts = ", ".join(f"{d['draft']} {d['workload_speedup']:.3f}" for d in workload["drafts"][:3])
        typer.echo(
            f"workload on {workload['test_set']}: the plan's weighted speedup {workload['plan_speedup']:.3f} "
            f"(each draft alone, best first: {drafts})"
        )
    if outcome.model_name:
        versions = ", ".join(f"{folder} v{v}" for folder, v in outcome.registered.items()) or "none"
        typer.echo(f"MLflow registry: {outcome.model_name}: {versions}; export run {outcome.export_run_id}")


def _print_checks(checks, folder: Path) -> None:
    import json
    from dataclasses import asdict

    if not checks:
        typer.echo("verify: no band routed to a draft, no declined band with a candidate; nothing to check")
    for c in checks:
        verdict = "inside" if c.agrees else "OUTSIDE"
        what = "" if c.route == "speculative" else f", declined: its best candidate {c.draft}"
        typer.echo(
            f"verify {c.alias} (τ={c.tau_dec:g}, γ={c.gamma}, {c.prompts} prompts{what}): "
            f"HF draft acceptance "
            f"{c.draft_acceptance:.3f} ± {c.draft_acceptance_ci95:.3f}, "
            f"plan {c.predicted_draft_acceptance:.3f} "
            f"({verdict} the interval); mean acceptance length {c.mean_acceptance_length:.3f} ± "
            f"{c.mean_acceptance_length_ci95:.3f} (plan {c.predicted_mean_acceptance_length:.3f}); speedup "
            f"{c.speedup:.3f} ± {c.speedup_ci95:.3f} (plan {c.predicted_speedup:.3f}, "
            f"{c.predicted_speedup_basis}); specray's decoder {c.ours_speedup:.3f} ± "
            f"{c.ours_speedup_ci95:.3f} "
            f"(plan {'within' if c.ours_agrees else 'OUTSIDE'} ±10%); HF spends "
            f"{c.hf_overhead_ms_per_step:.2f} ms more per step; {c.seconds:.0f}s"
        )
    payload = [asdict(c) | {"agrees": c.agrees, "ours_agrees": c.ours_agrees} for c in checks]
    (folder / "verify.json").write_text(json.dumps(payload, indent=2))
    typer.echo(f"verify: written to {folder / 'verify.json'}")


@app.command()
def tune(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted search."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the search's budgets and what of its inputs is on disk; run nothing."
    ),
) -> None:
    """Search τ_kd mixtures with Ray Tune (Optuna TPE + ASHA), retrain the winner, the best single τ_kd and
    the paper's manual recipe at the full budget (tune.final_steps, tune.replicates each) and print Table 3
    on the test sets with intervals over training and prompts, and how the search budget ranks recipes."""
    from specray.sweep.tune import SearchFailed, run_tune, tune_dir

    with user_errors():
        spec = stage_spec(sweep, overrides, "specray tune")
        if dry_run:
            _print_tune_plan(spec)
            return
        set_threads()
        try:
            with resumable(tune_dir(spec), "--resume"):
                outcome = run_tune(spec, resume=resume)
        except SearchFailed as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
    typer.echo(outcome.markdown)
    state = "resumed" if outcome.resumed else "new"
    completed = sum(trial.status == "completed" for trial in outcome.trials)
    trials = f"{len(outcome.trials)} trials, {completed} completed"
    typer.echo(f"{trials}; MLflow run {outcome.parent_run_id} ({state})")
    name, version = outcome.registered
    typer.echo(f"winner: trial {outcome.winner.trial_id}, registered as {name} version {version}")
    for stage, figures in outcome.stages.items():
        seconds, peak = figures["seconds"], figures["peak_gib"]
        typer.echo(f"  {stage:18s} {seconds:8.1f}s   peak memory in use {peak:.2f} GiB")
    typer.echo(f"report: {outcome.report_dir}")
    record_run(spec, outcome, "tune")  # docs/results/*.json, when SPECRAY_RECORD names one


def _print_tune_plan(spec) -> None:  # noqa: ANN001 (a SweepSpec; imported lazily)
    """`specray tune --dry-run`: the checks and the plan every driver starts with, the search's budgets,
    and what of the shards and step costs is on disk."""
    from specray.sweep.startup import dry_run
    from specray.sweep.tune import tune_dir
    from specray.sweep.tune.space import check_tune, final_budget, steps_budget

    plan, found = dry_run(spec, check_tune, validation=True)
    t = spec.tune
    sets = ", ".join(f"{name} ({len(p.examples)} prompts)" for name, p in plan.prompt_sets.items())
    typer.echo(f"plan for tune {spec.name} in {tune_dir(spec)}:")
    typer.echo(f"  train split {len(plan.splits['train'])} prompts; prompt sets: {sets}")
    typer.echo(
        f"  search: {t.num_samples} trials ({t.search}, space {t.space}, early stopping {t.early_stopping}), "
        f"{t.max_concurrent_trials} at a time, {steps_budget(spec)} steps each, scored on validation at "
        f"τ_dec {', '.join(f'{x:g}' for x in t.objective_temperatures)}; baselines: "
        f"{len(spec.teacher.temperatures)} single τ_kd and the manual recipe (top {t.manual_top_k})"
    )
    controls = " and each mixture's control" if t.controls else ""
    typer.echo(
        f"  full budget: {final_budget(spec)} steps; the winner, the best single τ_kd and the manual "
        f"recipe{controls}, {t.replicates} replicate(s) each, on {', '.join(spec.eval.test_sets)}"
    )
    for line in found.lines()[:1] + found.lines()[2:3]:  # the teacher shards and the step costs
        typer.echo(f"  {line}")


def _print_plan(plan, found, drafts: bool = False) -> None:  # noqa: ANN001 (SweepPlan, Survey: lazy)
    """What the plan holds (`drafts`: every draft with its key and folder) and what of it is reused."""
    spec = plan.spec
    if drafts:
        sets = ", ".join(
            f"{name} ({len(p.examples)} prompts, key {p.key[:12]})" for name, p in plan.prompt_sets.items()
        )
        typer.echo(f"plan for sweep {spec.name} in {plan.folder}:")
        typer.echo(f"  train split {len(plan.splits['train'])} prompts; prompt sets: {sets}")
        for sample in plan.shards:
            keys = ", ".join(f"{tau:g}:{key.digest[:12]}" for tau, key in sample.keys.items())
            typer.echo(f"  teacher shards (teacher.seed {sample.spec.teacher.seed}): {keys}")
        for draft in plan.evaluated:
            steps = draft.train_spec.distill.steps if draft.trained else 0
            typer.echo(f"  draft {draft.name:34s} key {draft.key[:12]}  {steps:5d} steps  {draft.folder}")
        typer.echo(
            f"  step costs key {plan.step_costs_key[:12]}; {len(plan.cell_jobs(found.step_costs))} cells"
        )
    typer.echo(f"plan for sweep {spec.name} (what is reused, what will be computed, and why):")
    for line in found.lines():
        typer.echo(f"  {line}")
