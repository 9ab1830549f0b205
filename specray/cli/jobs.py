"""Ray jobs on a cluster (the Jobs API): submit a sweep, follow, list, inspect and stop jobs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from specray.cli.common import OverridesArg, SweepArg, app, jobs_app, user_errors

if TYPE_CHECKING:  # Ray's SDK loads only when a cluster command runs
    from ray.job_submission import JobSubmissionClient


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
