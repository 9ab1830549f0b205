"""One stage at a time: validate a spec, generate teacher shards, distil one draft, evaluate drafts."""

from __future__ import annotations

from pathlib import Path

import typer

from specray.cli.common import OverridesArg, SweepArg, app, stage_spec, user_errors
from specray.config import dump_spec, load_spec
from specray.names import BASELINE


@app.command()
def validate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Validate a sweep spec and print it fully resolved (includes, defaults and overrides applied)."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])
    typer.echo(dump_spec(spec), nl=False)


@app.command()
def generate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Sample the teacher's response to every train prompt at every τ_kd into cached Parquet shards."""
    from specray.teacher.shards import generate_teacher_shards

    with user_errors():
        reports = generate_teacher_shards(stage_spec(sweep, overrides, "specray generate"))
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
        spec = stage_spec(sweep, overrides, "specray distill")
        if (tau_kd is None) == (mixture is None):
            raise SpecError("give exactly one of --tau-kd TAU or --mixture TAU:WEIGHT,...")
        weights = {tau_kd: 1.0} if tau_kd is not None else parse_mixture(mixture or "")
        problems = spec.distill.grid_axes_problems("specray distill") if paradigm == "online" else []
        if problems:
            raise SpecError("\n".join(problems))
        name = draft_name(paradigm, weights)
        target = output or Path(spec.output_dir) / spec.name / "drafts" / draft_folder_name(name)  # as `run`
        steps, tau_decs = spec.distill.steps_for(paradigm), spec.eval.temperatures
        typer.echo(f"distilling {name} for {steps} steps -> {target}")
        with curve_progress(name, steps, tau_decs) as report:
            result = run_distill(spec, paradigm, weights, target, report=report)
    typer.echo(f"draft written to {result.output_dir}")
    first, last = result.curves[0], result.curves[-1]
    for tau_dec, alpha in last.acceptance.items():
        typer.echo(
            f"  acceptance_rate at τ_dec={tau_dec:g}: {first.acceptance[tau_dec]:.3f} (step 0) -> {alpha:.3f}"
        )


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
        passes,
        plan_jobs,
    )
    from specray.sweep.run import LazyEvalPool

    with user_errors():
        spec = stage_spec(sweep, overrides, "specray evaluate")
        target_path = resolve_model_path(spec.models.target, spec.models.zoo)
        draft_path = resolve_model_path(spec.models.draft, spec.models.zoo)
        paths = drafts or [draft_path]
        named = {(BASELINE if not drafts else path): path for path in paths}
        check_drafts(target_path, named)
        prompts = encode_test_prompts(spec, load_tokenizer(target_path), target_path)
    e = spec.eval
    jobs = plan_jobs(e, [DraftRef(name, path) for name, path in named.items()])
    with ray_session(spec.ray), user_errors(), LazyEvalPool(spec, target_path, prompts) as lazy:
        pool = lazy.get()  # the sweep's eval pool: the same cached target samples, the same quality metrics
        if pool.step_costs is None:  # one timing for every draft: they share the student's architecture
            typer.echo(pool.measure_step_costs(draft_path, list(e.batch_sizes), list(e.gamma)).describe())
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
