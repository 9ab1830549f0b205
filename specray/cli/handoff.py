"""What a sweep hands to other tools and reads back: its τ_kd data for the trainers users run (`export-data`:
SpecForge and speculators files), and a vLLM server's acceptance beside the plan's (`observe`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer

from specray.cli.common import app, user_errors


@app.command()
def observe(
    url: str = typer.Argument(..., help="The vLLM server (http://HOST:PORT) or its /metrics URL."),
    seconds: float = typer.Option(60.0, "--seconds", min=0.1, help="Time between the two scrapes."),
    export: Path | None = typer.Option(
        None, "--export", help="An export folder (`specray export --to`): show its plan beside the server's."
    ),
    band: str | None = typer.Option(None, "--band", help="The band the traffic was sent in, by alias."),
    tau: float | None = typer.Option(None, "--tau", help="... or by a request temperature in it."),
) -> None:
    """Read a vLLM server's speculative-decoding acceptance over an interval: draft acceptance, mean
    acceptance length and acceptance per draft position, from its Prometheus counters scraped twice."""
    from specray.metrics import ACCEPTANCE_PER_POSITION, DRAFT_ACCEPTANCE, MEAN_ACCEPTANCE_LENGTH
    from specray.serving.observe import interval, metrics_url, parse_counters, planned_band, scrape

    with user_errors():
        planned = planned_band(export, band, tau) if export is not None else None
        where = metrics_url(url)
        before = parse_counters(scrape(url), where)
        start = time.monotonic()
        typer.echo(f"scraped {where}; scraping again in {seconds:g} s", err=True)
        time.sleep(seconds)
        after = parse_counters(scrape(url), where)
        observed = interval(before, after, time.monotonic() - start)
    typer.echo(
        f"over {observed.seconds:.1f} s: {observed.drafts:g} drafts, {observed.draft_tokens:g} draft tokens, "
        f"{observed.accepted:g} accepted"
    )
    expected = planned.expected if planned else {}
    rows = [
        ("draft acceptance", observed.draft_acceptance, DRAFT_ACCEPTANCE),
        ("mean acceptance length", observed.mean_acceptance_length, MEAN_ACCEPTANCE_LENGTH),
    ]
    header = f"{'':26s} {'server':>8s}"
    if planned:
        header += f"  plan (band {planned.alias}: {planned.draft}, γ={planned.gamma}, route {planned.route})"
    typer.echo(header)
    for label, value, key in rows:
        typer.echo(f"{label:26s} {value:8.3f}{_planned(expected, key)}")
    plan_positions = list(expected.get(ACCEPTANCE_PER_POSITION, []))
    for k, value in enumerate(observed.acceptance_per_position):
        shown = f"  {plan_positions[k]:.3f}" if k < len(plan_positions) else ""
        typer.echo(f"{f'acceptance at position {k + 1}':26s} {value:8.3f}{shown}")
    if planned and planned.gamma and len(observed.acceptance_per_position) != planned.gamma:
        typer.echo(
            f"note: the server drafts {len(observed.acceptance_per_position)} tokens per step, the plan's "
            f"γ is {planned.gamma}: set num_speculative_tokens to the plan's γ to compare like with like"
        )


def _planned(expected: Mapping[str, Any], key: str) -> str:
    if key not in expected:
        return ""
    ci = expected.get(f"{key}_ci95")
    return f"  {expected[key]:.3f}" + (f" ± {ci:.3f}" if ci is not None else "")


@app.command("export-data")
def export_data(
    source: str = typer.Argument(
        ...,
        help="A finished sweep or tune: its output folder (a tune's `tune/` folder) or MLflow parent run id.",
    ),
    to: Path = typer.Option(
        ..., "--to", help="Folder for the files (created; files of the same names replaced)."
    ),
    tau_kd: str | None = typer.Option(None, "--tau-kd", help="Single τ_kd of the run's grid, e.g. 0,0.6,1."),
    recipe: list[str] | None = typer.Option(
        None,
        "--recipe",
        help="A recipe the run trained (e.g. `tuned`, `mix=0.7:1,0.8:1`) or a mixture τ:w,τ:w over its grid; "
        "repeatable. Default: a sweep's every τ_kd, a tune's winner.",
    ),
    formats: str = typer.Option("specforge,speculators", "--format", help="specforge, speculators or both."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow of a run id."),
) -> None:
    """Write a finished run's teacher data — chosen τ_kd, or a recipe in its proportions — as SpecForge and
    speculators training files, with a manifest (rows per τ_kd, sha256) and the trainers' commands."""
    from specray.serving.trainer_data import check_export, export_data
    from specray.serving.trainer_recipes import choose_recipes, read_run

    with user_errors():
        taus = _numbers(tau_kd, "--tau-kd") if tau_kd else []
        run = read_run(source, tracking_uri)
        recipes = choose_recipes(run, taus, recipe or [])
        written = export_data(run, recipes, to, [f.strip() for f in formats.split(",") if f.strip()])
    for entry in written.manifest["recipes"]:
        counts = ", ".join(f"τ_kd {t}: {n}" for t, n in entry["rows_per_tau_kd"].items())
        skipped = entry["skipped_blank_responses"]
        typer.echo(
            f"{entry['name']}: {counts}" + (f" ({skipped} blank responses left out)" if skipped else "")
        )
        for fmt, file in entry["files"].items():
            typer.echo(f"  {fmt:12s} {to / file['path']}  ({file['rows']} rows)")
    problems = check_export(to)
    if problems:  # what was just written must read back as the manifest says
        typer.echo(f"error: {problems[0]}", err=True)
        raise typer.Exit(1)
    typer.echo(f"manifest: {to / 'manifest.json'}; the trainers' commands: {to / 'README.md'}")


def _numbers(text: str, option: str) -> list[float]:
    from specray.errors import SpecError

    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise SpecError(f"{option} {text!r}: give numbers separated by commas, e.g. 0,0.6,1") from None
