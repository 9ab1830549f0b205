"""One stage at a time: validate a spec, generate teacher shards, distill one draft, evaluate drafts."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from specray.cli.common import OverridesArg, SweepArg, app, stage_spec, user_errors
from specray.config import dump_spec, load_spec
from specray.names import BASELINE

if TYPE_CHECKING:
    from specray.distill.curves import CurvePoint


@app.command()
def validate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Validate a sweep spec and print it fully resolved (includes, defaults and overrides applied)."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])
    typer.echo(dump_spec(spec), nl=False)


@app.command()
def generate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Sample the teacher's response to every train prompt at every τ_kd into cached Parquet shards."""
    from specray.sweep.plan import plan_sweep
    from specray.teacher.shards import ShardReport, generate_shards

    with user_errors():
        plan = plan_sweep(stage_spec(sweep, overrides, "specray generate"))
        reports: dict[tuple[int, float], ShardReport] = {}
        for sample in plan.shards:  # one teacher sample, or one per replicate (teacher.replicate_shards)
            reports |= {
                (sample.spec.teacher.seed, tau): report
                for tau, report in generate_shards(sample.spec, sample.examples, sample.keys).items()
            }
    for report in reports.values():
        typer.echo(report.describe())
    if all(report.cached for report in reports.values()):
        typer.echo(f"cache hit for all {len(reports)} τ_kd shards: nothing generated")


@app.command()
def distill(
    sweep: Path = SweepArg,
    overrides: list[str] = OverridesArg,
    paradigm: str = typer.Option("offline", "--paradigm", help="offline (SeqKD) or online (KD)."),
    tau_kd: float | None = typer.Option(None, "--tau-kd", help="Distill on the teacher shard of this τ_kd."),
    mixture: str | None = typer.Option(None, "--mixture", help="Or a τ_kd mixture: 0.7:1,0.8:1,0.9:1."),
    output: Path | None = typer.Option(None, "--output", help="Draft dir [OUTPUT_DIR/NAME/drafts/…]."),
) -> None:
    """Distill the sweep's draft on teacher shards with Ray Train; print progress and acceptance per τ_dec."""
    from specray.distill.inputs import parse_mixture
    from specray.distill.ray_train import distill as distill_one
    from specray.draft import draft_name, plan_draft
    from specray.errors import SpecError
    from specray.sweep.plan import plan_sweep

    with user_errors():
        spec = stage_spec(sweep, overrides, "specray distill")
        if (tau_kd is None) == (mixture is None):
            raise SpecError("give exactly one of --tau-kd TAU or --mixture TAU:WEIGHT,...")
        weights = {tau_kd: 1.0} if tau_kd is not None else parse_mixture(mixture or "")
        problems = spec.distill.grid_axes_problems("specray distill") if paradigm == "online" else []
        if problems:
            raise SpecError("\n".join(problems))
        plan = plan_sweep(spec)
        name = draft_name(paradigm, weights)
        # the sweep's own draft of this recipe (where `specray run` puts it), or one planned the same way
        draft = next((d for d in plan.drafts if d.name == name), None) if output is None else None
        if draft is None:
            keys, root = plan.shards[0].keys, plan.drafts_dir
            draft = plan_draft(spec, keys, paradigm, weights, root=root, folder=output)
        steps, tau_decs = draft.train_spec.distill.steps, spec.eval.temperatures
        typer.echo(f"distilling {name} for {steps} steps -> {draft.folder}")
        with curve_progress(name, steps, tau_decs) as report:
            result = distill_one(draft, report, plan.splits)
    typer.echo(f"draft written to {result.output_dir}")
    first, last = result.curves[0], result.curves[-1]
    for tau_dec, alpha in last.acceptance.items():
        typer.echo(
            f"  acceptance_rate at τ_dec={tau_dec:g}: {first.acceptance[tau_dec]:.3f} (step 0) -> {alpha:.3f}"
        )


@contextmanager
def curve_progress(
    draft: str, steps: int, tau_decs: Sequence[float]
) -> Iterator[Callable[[CurvePoint], None]]:
    """A `distill(..., report=...)` callback for one draft: on a terminal a line per curve point as it
    arrives; elsewhere a `LineMeter` over the training steps whose lines carry the latest loss and
    acceptance."""
    from specray.distill.curves import curve_line, curve_note
    from specray.progress import LineMeter, live_display

    if live_display():
        yield lambda curve: print(curve_line(curve, tau_decs), flush=True)
        return
    with LineMeter("distill", steps, "step") as meter:

        def report(curve: CurvePoint) -> None:
            meter.set_postfix_str(curve_note(draft, curve, steps, tau_decs))
            meter.set_counts(curve.step, steps)

        yield report


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
    from specray.draft import Draft
    from specray.models.sources import resolve_model_path
    from specray.progress import SweepDisplay
    from specray.specdec.cells import check_drafts, passes, plan_jobs
    from specray.sweep.plan import plan_sweep
    from specray.sweep.stages import Stages

    with user_errors():
        spec = stage_spec(sweep, overrides, "specray evaluate")
        plan = plan_sweep(spec)
        target_path = resolve_model_path(spec.models.target, spec.models)
        draft_path = resolve_model_path(spec.models.draft, spec.models)
        paths = drafts or [draft_path]
        named = {(BASELINE if not drafts else path): path for path in paths}
        check_drafts(target_path, named)
    e = spec.eval
    jobs = plan_jobs(e, [Draft(name, None, {}, Path(path)) for name, path in named.items()])  # not cached
    with ray_session(spec.ray), user_errors(), Stages(plan, SweepDisplay(enabled=False)) as stages:
        pool = (
            stages.pool()
        )  # the sweep's eval pool: the same cached target samples, the same quality metrics
        if pool.step_costs is None:  # one timing for every draft: they share the student's architecture
            typer.echo(pool.measure_step_costs(draft_path, list(e.batch_sizes), list(e.gamma)).describe())
        records = pool.run(passes(jobs, e.drafts_per_pass))
    _print_eval_table(records)
    if output:
        output.write_text(json.dumps([record.to_json() for record in records], indent=2))
        typer.echo(f"wrote {len(records)} records to {output}")


def _print_eval_table(records: list) -> None:  # noqa: ANN001 (CellRecords: imported lazily)
    from rich.console import Console
    from rich.table import Table

    from specray.metrics import (
        ACCEPTANCE_RATE,
        ACCEPTANCE_RATE_CI95,
        BLOCK_EFFICIENCY,
        BLOCK_EFFICIENCY_SIMULATED,
        SPEEDUP,
        SPEEDUP_MODEL,
    )

    groups: dict[tuple[str, str, int], dict[float, dict]] = {}
    for r in records:
        by_tau = groups.setdefault((r.draft, r.test_set, r.gamma), {})
        by_tau.setdefault(r.tau_dec, {})[r.estimator] = r.metrics
    columns = ("τ_dec", ACCEPTANCE_RATE, BLOCK_EFFICIENCY, SPEEDUP_MODEL, "empirical α", SPEEDUP)
    for (draft, test_set, gamma), by_tau in groups.items():
        table = Table(title=f"{draft} on {test_set} (γ={gamma})")
        for column in columns:
            table.add_column(column, justify="right")
        for tau, cells in sorted(by_tau.items()):
            analytic, empirical = cells.get("analytic", {}), cells.get("empirical", {})
            table.add_row(
                f"{tau:g}",
                _fmt(analytic.get(ACCEPTANCE_RATE), analytic.get(ACCEPTANCE_RATE_CI95)),
                _fmt(analytic.get(BLOCK_EFFICIENCY_SIMULATED)),
                _fmt(analytic.get(SPEEDUP_MODEL)),
                _fmt(empirical.get(ACCEPTANCE_RATE), empirical.get(ACCEPTANCE_RATE_CI95)),
                _fmt(empirical.get(SPEEDUP)),
            )
        Console(width=max(120, Console().width)).print(table)


def _fmt(value: float | None, ci95: float | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" ±{ci95:.3f}" if ci95 is not None else "")
