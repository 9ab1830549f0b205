"""The `specray` command line. Each subcommand validates its spec before doing any work."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from specray.config import ZooSpec, dump_spec, load_spec
from specray.errors import USER_ERRORS, ray_cause
from specray.names import BASELINE

if TYPE_CHECKING:  # Ray's SDK loads only when a cluster command runs
    from ray.job_submission import JobSubmissionClient

app = typer.Typer(
    help="Temperature-centric knowledge distillation sweeps for speculative decoding, on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
zoo_app = typer.Typer(
    help="The tiny model zoo: tokenizer, target and draft trained locally.", no_args_is_help=True
)
data_app = typer.Typer(help="Inspect a sweep's data: sources, splits and prompts.", no_args_is_help=True)
jobs_app = typer.Typer(help="Ray jobs on a cluster: list, status, logs, stop.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")
app.add_typer(data_app, name="data")
app.add_typer(jobs_app, name="jobs")

SweepArg = typer.Argument(..., help="Sweep YAML, e.g. sweeps/tiny.yaml.", exists=False)
OverridesArg = typer.Argument(None, help="KEY=VALUE overrides, e.g. eval.gamma=3 teacher.replicas=2.")


@contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes (bad spec, data or model) end with one clear message and exit code 2, no traceback."""
    try:
        yield
    except USER_ERRORS as e:
        typer.echo(f"error: {ray_cause(e)}", err=True)  # from inside a Ray actor: its own message only
        raise typer.Exit(2) from None


@contextmanager
def resumable(kept: Path, resume_flag: str | None = None) -> Iterator[None]:
    """A long job stopped by its environment (MLflow gone, a folder that cannot be written) ends with what
    failed, where the finished work is, and the command that resumes it; exit code 1, no traceback. Ctrl-C
    says the same (exit code 130). Any other exception is a bug and keeps its traceback."""
    import shlex

    from specray.errors import TrackingError, describe_os_error, find_cause

    def resume_hint(when: str) -> None:
        argv = ["specray", *sys.argv[1:]]
        argv += [resume_flag] if resume_flag and resume_flag not in argv else []
        typer.echo(
            f"Finished work is kept under {kept} and in the cache; {when}resume with:\n  {shlex.join(argv)}",
            err=True,
        )

    try:
        yield
    except KeyboardInterrupt:
        typer.echo("\ninterrupted", err=True)
        resume_hint("")
        raise typer.Exit(130) from None
    except Exception as e:
        cause = find_cause(e, (TrackingError, OSError))
        if cause is None or isinstance(e, USER_ERRORS):
            raise
        what = describe_os_error(cause) if isinstance(cause, OSError) else str(cause)
        typer.echo(f"error: {what}", err=True)
        resume_hint("once that is fixed, ")
        raise typer.Exit(1) from None


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


@app.command()
def validate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Validate a sweep spec and print it fully resolved (includes, defaults and overrides applied)."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])
    typer.echo(dump_spec(spec), nl=False)


@zoo_app.command("build")
def zoo_build(
    spec: Path | None = typer.Option(None, "--spec", help="Sweep YAML whose models.zoo recipe to build."),
    overrides: list[str] = OverridesArg,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the zoo is cached."),
    samples: int = typer.Option(3, "--samples", min=0, help="Target samples to show at τ=0 and τ=1."),
) -> None:
    """Build the tiny zoo (cached by a hash of its recipe) and show a few target samples."""
    import time

    from specray.models.zoo import build_zoo

    with user_errors():
        zoo_spec = load_spec(spec, overrides or []).models.zoo if spec else ZooSpec()
    _set_threads()
    started = time.perf_counter()
    zoo = build_zoo(zoo_spec, force=force)
    elapsed = time.perf_counter() - started
    status = "cache hit" if zoo.cached else "built"
    typer.echo(f"zoo {status} in {elapsed:.1f}s: {zoo.root}")
    for name, info in zoo.info["models"].items():
        typer.echo(
            f"  {name}: {info['parameters'] / 1e6:.2f}M parameters, final loss {info['final_loss']:.3f}"
        )
    if samples:
        _show_samples(zoo.target, samples)


def _show_samples(model_dir: Path, n: int) -> None:
    from specray.data.synthetic import IN_DOMAIN, OUT_OF_DOMAIN, synthetic_corpus
    from specray.data.templates import format_prompt
    from specray.models.zoo import sample_responses

    examples = synthetic_corpus(n, seed=2024, families=IN_DOMAIN[::3] + OUT_OF_DOMAIN)
    prompts = [format_prompt(e.instruction, e.input) for e in examples]
    for tau in (0.0, 1.0):
        typer.echo(f"target samples at τ={tau}:")
        for example, response in zip(examples, sample_responses(model_dir, prompts, tau), strict=False):
            task = example.instruction + (f" [{example.input}]" if example.input else "")
            typer.echo(f"  {task}\n    -> {response!r}")


@data_app.command("show")
def data_show(sweep: Path = SweepArg, overrides: list[str] = OverridesArg, n: int = 2) -> None:
    """Load a sweep's data sources and print split sizes, task families and a few prompts."""
    from collections import Counter

    from specray.data.dataset import build_splits
    from specray.data.templates import format_prompt

    with user_errors():
        splits = build_splits(load_spec(sweep, overrides or []).data)
        for name, examples in splits.items():
            families = Counter(e.family for e in examples).most_common()
            typer.echo(f"{name}: {len(examples)} examples; families: {dict(families)}")
            for example in examples[:n]:
                typer.echo("  " + format_prompt(example.instruction, example.input).replace("\n", "\n  "))
                typer.echo(f"  [reference] {example.output!r}")


@app.command()
def generate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Sample the teacher's response to every train prompt at every τ_kd into cached Parquet shards."""
    from specray.teacher.pool import generate_teacher_shards

    with user_errors():
        reports = generate_teacher_shards(load_spec(sweep, overrides or []))
    for report in reports.values():
        typer.echo(report.describe())
    if all(report.cached for report in reports.values()):
        typer.echo(f"cache hit for all {len(reports)} τ_kd shards: nothing generated")


@app.command()
def distill(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    paradigm: str = typer.Option("offline", "--paradigm", help="offline (SeqKD) or online (KD)."),
    tau_kd: float | None = typer.Option(None, "--tau-kd", help="Distil on the teacher shard of this τ_kd."),
    mixture: str | None = typer.Option(None, "--mixture", help="Or a τ_kd mixture: 0.7:1,0.8:1,0.9:1."),
    output: Path | None = typer.Option(None, "--output", help="Draft dir [OUTPUT_DIR/NAME/drafts/…]."),
) -> None:
    """Distil the sweep's draft on teacher shards with Ray Train; print progress and acceptance per τ_dec."""
    from specray.distill.inputs import draft_folder_name, draft_name, parse_mixture
    from specray.distill.progress import curve_progress
    from specray.distill.ray_train import distill as run_distill
    from specray.errors import SpecError

    with user_errors():
        spec = load_spec(sweep, overrides or [])
        if (tau_kd is None) == (mixture is None):
            raise SpecError("give exactly one of --tau-kd TAU or --mixture TAU:WEIGHT,...")
        weights = {tau_kd: 1.0} if tau_kd is not None else parse_mixture(mixture or "")
        name = draft_name(paradigm, weights)
        target = output or Path(spec.output_dir) / spec.name / "drafts" / draft_folder_name(name)  # as `run`
        steps, tau_decs = spec.distill.steps_for(paradigm), spec.eval.temperatures
        typer.echo(f"distilling {name} for {steps} steps -> {target}")
        with curve_progress(name, steps, tau_decs) as report:
            result = run_distill(spec, paradigm, weights, target, report=report)
    typer.echo(f"draft written to {result.output_dir}")
    first, last = result.curves[0], result.curves[-1]
    for key in (k for k in last if k.startswith("acceptance_rate/")):
        tau_dec = key.split("=", 1)[1]
        typer.echo(f"  acceptance_rate at τ_dec={tau_dec}: {first[key]:.3f} (step 0) -> {last[key]:.3f}")


@app.command()
def evaluate(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    drafts: list[str] = typer.Option(
        None,
        "--draft",
        help="Draft model dir or HF name (repeatable); default: the spec's un-distilled draft.",
    ),
    output: Path | None = typer.Option(None, "--output", help="Also write every cell's record as JSON here."),
) -> None:
    """Measure acceptance and speedup of drafts per τ_dec (analytic for all cells, empirical where named)."""
    import json

    from specray.cluster.runtime import ray_session
    from specray.models.loading import load_tokenizer, resolve_model_path
    from specray.specdec.cells import (
        DraftRef,
        check_drafts,
        encode_test_prompts,
        eval_settings,
        passes,
        plan_jobs,
    )
    from specray.specdec.workers import make_eval_pool

    with user_errors():
        spec = load_spec(sweep, overrides or [])
        target_path = resolve_model_path(spec.models.target, spec.models.zoo)
        draft_path = resolve_model_path(spec.models.draft, spec.models.zoo)
        paths = drafts or [draft_path]
        named = {(BASELINE if not drafts else path): path for path in paths}
        check_drafts(target_path, named)
        prompts = encode_test_prompts(spec, load_tokenizer(target_path))
    e = spec.eval
    jobs = plan_jobs(e, [DraftRef(name, path) for name, path in named.items()])
    with (
        ray_session(spec.ray),
        user_errors(),
        make_eval_pool(spec, target_path, prompts, eval_settings(e)) as pool,
    ):
        if pool.cost_ratio is None:  # one c for every draft: they share the student's architecture
            typer.echo(pool.measure_cost_ratio(draft_path).describe())
        records = pool.run(passes(jobs, e.drafts_per_pass))
    _print_eval_table([record.flat() for record in records])
    if output:
        output.write_text(json.dumps([record.to_json() for record in records], indent=2))
        typer.echo(f"wrote {len(records)} records to {output}")


def _print_eval_table(records: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    groups: dict[tuple[str, str, int], dict[float, dict]] = {}
    for r in records:
        cell = groups.setdefault((r["draft"], r["test_set"], r["gamma"]), {}).setdefault(r["tau_dec"], {})
        cell[r["estimator"]] = r
    for (draft, test_set, gamma), by_tau in groups.items():
        table = Table(title=f"{draft} on {test_set} (γ={gamma})")
        for column in (
            "τ_dec",
            "acceptance_rate",
            "block_efficiency",
            "speedup_model",
            "empirical α",
            "speedup",
        ):
            table.add_column(column, justify="right")
        for tau, cells in sorted(by_tau.items()):
            analytic, empirical = cells.get("analytic", {}), cells.get("empirical", {})
            table.add_row(
                f"{tau:g}",
                _fmt(analytic.get("acceptance_rate"), analytic.get("acceptance_rate_ci95")),
                _fmt(analytic.get("block_efficiency_simulated")),
                _fmt(analytic.get("speedup_model")),
                _fmt(empirical.get("acceptance_rate"), empirical.get("acceptance_rate_ci95")),
                _fmt(empirical.get("speedup")),
            )
        Console(width=max(120, Console().width)).print(table)


def _fmt(value: float | None, ci95: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" ±{ci95:.3f}" if ci95 is not None else "")


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
    from specray.sweep.plan import sweep_dir
    from specray.sweep.run import plan_sweep, run_sweep

    with user_errors():
        spec = load_spec(sweep, overrides or [])
        if dry_run:
            _print_plan(plan_sweep(spec), spec.name)
            return
        _set_threads()
        with resumable(sweep_dir(spec)):
            outcome = run_sweep(spec, on_plan=lambda work: _print_plan(work, spec.name))
    state = "resumed" if outcome.resumed else "new"
    typer.echo(
        f"sweep {spec.name}: {len(outcome.records)} cells; MLflow run {outcome.parent_run_id} ({state})"
    )
    typer.echo(f"  {outcome.cost_ratio.describe()}")
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
    """Rebuild a sweep's report (figures, tables, Markdown) from what its MLflow run holds."""
    import tempfile

    from specray.report.build import build_report
    from specray.report.tables import load_composition
    from specray.tracking import fetch_sweep_records

    with user_errors(), tempfile.TemporaryDirectory() as tmp:
        records = fetch_sweep_records(tracking_uri, run_id, Path(tmp))
    folder = output or Path("reports") / run_id
    title = f"specray sweep: {records['name']} (MLflow run {run_id})"
    parts = (records["cells"], records["drafts"], records["curves"], records["lengths"])
    extra = {"cost_ratio": records.get("cost_ratio"), "projected_cost_ratio": records["projected_cost_ratio"]}
    extra |= {"token_lengths": records.get("token_lengths")}
    if tune is not None:
        with user_errors():
            extra["composition"] = load_composition(tune)
    path = build_report(*parts, folder, title=title, **extra)
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
    from specray.serving.command import run_export, verify_outcome

    with user_errors():
        outcome = run_export(source, to, bands, test_set, min_speedup, tracking_uri, register_drafts)
    _print_routes(outcome)
    if verify:
        _set_threads()
        with user_errors():
            checks = verify_outcome(outcome, verify_prompts)
        _print_checks(checks, outcome.folder)
        if not all(check.agrees for check in checks):
            raise typer.Exit(1)


def _print_routes(outcome) -> None:
    typer.echo(f"export written to {outcome.folder} (routing.json, drafts/, vllm/, sglang/, README.md)")
    for band in outcome.plan["bands"]:
        what = (
            f"{band['draft_name']} γ={band['gamma']}" if band["route"] == "speculative" else "no speculation"
        )
        typer.echo(f"  {band['alias']:12s} {what:36s} {band['reason']}")
    if outcome.model_name:
        versions = ", ".join(f"{folder} v{v}" for folder, v in outcome.registered.items()) or "none"
        typer.echo(f"MLflow registry: {outcome.model_name}: {versions}; export run {outcome.export_run_id}")


def _print_checks(checks, folder: Path) -> None:
    import json
    from dataclasses import asdict

    if not checks:
        typer.echo("verify: no band is routed to a draft; nothing to check")
    for c in checks:
        verdict = "inside" if c.agrees else "OUTSIDE"
        typer.echo(
            f"verify {c.alias} (τ={c.tau_dec:g}, γ={c.gamma}, {c.prompts} prompts): HF draft acceptance "
            f"{c.draft_acceptance:.3f} ± {c.draft_acceptance_ci95:.3f}, "
            f"plan {c.predicted_draft_acceptance:.3f} "
            f"({verdict} the interval); mean acceptance length {c.mean_acceptance_length:.3f} ± "
            f"{c.mean_acceptance_length_ci95:.3f} (plan {c.predicted_mean_acceptance_length:.3f}); speedup "
            f"{c.speedup:.3f} ± {c.speedup_ci95:.3f} (plan {c.predicted_speedup:.3f}, "
            f"{c.predicted_speedup_basis}); {c.seconds:.0f}s"
        )
    payload = [asdict(c) | {"agrees": c.agrees} for c in checks]
    (folder / "verify.json").write_text(json.dumps(payload, indent=2))
    typer.echo(f"verify: written to {folder / 'verify.json'}")


@app.command()
def tune(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted search."),
) -> None:
    """Search τ_kd mixtures with Ray Tune (Optuna TPE + ASHA) and print Table 3: the tuned mixture vs the best
    single τ_kd and the paper's manual recipe, on the test sets."""
    from specray.sweep.tune import SearchFailed, run_tune, tune_dir

    with user_errors():
        spec = load_spec(sweep, overrides or [])
        _set_threads()
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


# ---------------------------------------------------------------- cluster (Ray Jobs API)

AddressOpt = typer.Option(
    "http://127.0.0.1:8265",
    "--address",
    envvar=["RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"],
    help="The cluster's Jobs API: the Ray dashboard's HTTP address.",
)
JobIdArg = typer.Argument(..., help="Submission id, e.g. specray-smoke-20260121-030405-1a2b.")


@app.command()
def submit(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    address: str = AddressOpt,
    tune: bool = typer.Option(False, "--tune", help="Run `specray tune` on the cluster, not `specray run`."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Follow the job's output until it ends."),
    working_dir: Path = typer.Option(Path("."), "--working-dir", help="Folder uploaded for the job."),
    env: list[str] = typer.Option(None, "--env", help="NAME (local value) or NAME=VALUE; repeatable."),
    secrets: bool = typer.Option(True, "--secrets/--no-secrets", help="Pass HF_TOKEN, MLflow credentials."),
    driver_cpus: float | None = typer.Option(None, "--driver-cpus", min=0, help="1 on GPU sweeps, else 0"),
    driver_gpus: float = typer.Option(0.0, "--driver-gpus", min=0, help="GPUs for the job's driver."),
    submission_id: str | None = typer.Option(None, "--submission-id", help="Default: specray-NAME-TIME-XXXX"),
) -> None:
    """Submit a sweep to a Ray cluster as a job, then follow its output; exit 0 only if it SUCCEEDED."""
    from specray.cluster import jobs
    from specray.cluster.submit import Redactor, build_job_request

    with user_errors():
        request = build_job_request(
            sweep,
            overrides or [],
            working_dir=working_dir,
            command="tune" if tune else "run",
            env=env or [],
            pass_secrets=secrets,
            driver_cpus=driver_cpus,
            driver_gpus=driver_gpus,
            submission_id=submission_id,
        )
        for line in request.describe():
            typer.echo(line, err=True)
        client = jobs.connect(address)
        jobs.check_runs_specray(client, address, request.runtime_env.get("env_vars", {}))
        job_id = jobs.submit(client, request)
    typer.echo(f"submitted {job_id} to {address}", err=True)
    if wait:
        _follow_job(client, job_id, address, Redactor.from_environ())
    else:
        typer.echo(f"follow it with: specray jobs logs {job_id} --follow --address {address}", err=True)


def _follow_job(client: JobSubmissionClient, job_id: str, address: str, redact: Callable[[str], str]) -> None:
    """Stream a job's output until it ends: exit 1 unless it SUCCEEDED, 130 on Ctrl-C (the job runs on)."""
    from specray.cluster import jobs

    try:
        with user_errors():
            info = jobs.follow(client, job_id, lambda chunk: typer.echo(redact(chunk), nl=False))
    except KeyboardInterrupt:
        hint = f"specray jobs stop {job_id} --address {address}"
        typer.echo(f"\nstopped following; job {job_id} keeps running (stop it: {hint})", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"job {job_id} {info.status}: {info.message}", err=True)
    if info.status != "SUCCEEDED":
        raise typer.Exit(1)


@jobs_app.command("list")
def jobs_list(address: str = AddressOpt) -> None:
    """Every job the cluster knows, oldest first: id, status, start, sweep, command."""
    from specray.cluster import jobs

    with user_errors():
        rows = [jobs.summary_row(info) for info in jobs.list_jobs(jobs.connect(address))]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]  # the last cell: as is
        typer.echo("  ".join([*padded, row[4]]))


@jobs_app.command("status")
def jobs_status(job_id: str = JobIdArg, address: str = AddressOpt) -> None:
    """A job's status, message, command, times and metadata (never its env vars, which may hold secrets)."""
    from specray.cluster import jobs

    with user_errors():
        info = jobs.details(jobs.connect(address), job_id)
    for line in jobs.describe(info):
        typer.echo(line)


@jobs_app.command("logs")
def jobs_logs(
    job_id: str = JobIdArg,
    address: str = AddressOpt,
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream new output until the job ends."),
) -> None:
    """A job's output so far; with --follow, stream it until the job ends (exit 1 unless it SUCCEEDED)."""
    from specray.cluster import jobs
    from specray.cluster.submit import Redactor

    redact = Redactor.from_environ()
    with user_errors():
        client = jobs.connect(address)
        text = "" if follow else jobs.logs(client, job_id)
    if follow:
        _follow_job(client, job_id, address, redact)
    else:
        typer.echo(redact(text), nl=False)


@jobs_app.command("stop")
def jobs_stop(
    job_id: str = JobIdArg,
    address: str = AddressOpt,
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait (up to 60 s) until it has stopped."),
) -> None:
    """Stop a running job: its driver gets SIGTERM, then SIGKILL; its actors and tasks end with it."""
    from specray.cluster import jobs

    with user_errors():
        client = jobs.connect(address)
        requested = jobs.stop(client, job_id)
        info = jobs.wait(client, job_id, timeout_s=60) if wait and requested else jobs.details(client, job_id)
    typer.echo(f"job {job_id}: {'stop requested' if requested else 'was not running'}; now {info.status}")


def _print_plan(work, name: str) -> None:
    typer.echo(f"plan for sweep {name} (what is reused, what will be computed, and why):")
    for line in work.lines():
        typer.echo(f"  {line}")


def _set_threads() -> None:
    import os

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("SPECRAY_THREADS", os.cpu_count() or 1))))
