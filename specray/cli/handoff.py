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
        ("draft acceptance", observed.draft_acceptance, "draft_acceptance"),
        ("mean acceptance length", observed.mean_acceptance_length, "mean_acceptance_length"),
    ]
    header = f"{'':26s} {'server':>8s}"
    if planned:
        header += f"  plan (band {planned.alias}: {planned.draft}, γ={planned.gamma}, route {planned.route})"
    typer.echo(header)
    for label, value, key in rows:
        typer.echo(f"{label:26s} {value:8.3f}{_planned(expected, key)}")
    plan_positions = list(expected.get("acceptance_per_position", []))
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
