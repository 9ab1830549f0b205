"""Ray's Jobs API (the dashboard's HTTP address, e.g. http://HEAD:8265): submit, follow, list, stop.

Thin wrappers over `ray.job_submission.JobSubmissionClient` that turn its failures into one-line errors and
never show a job's runtime_env (its env_vars may hold secrets).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import aiohttp
import ray.exceptions
from ray.job_submission import JobDetails, JobErrorType, JobStatus, JobSubmissionClient

from specray.cluster.submit import JobRequest, redact_uri_credentials
from specray.errors import SpecError

log = logging.getLogger(__name__)
# Ray's SDK logs request bodies at DEBUG, runtime_env env_vars (secrets) included: never let `-v` show them.
logging.getLogger("ray.dashboard.modules.dashboard_sdk").setLevel(logging.INFO)
# A line per skipped .gitignore file and per closed websocket would bury the job's own output.
logging.getLogger("ray._private.runtime_env.packaging").setLevel(logging.WARNING)
logging.getLogger("ray.dashboard.modules.job.sdk").setLevel(logging.WARNING)
# The SDK lets these beat the address it is given; specray's --address reads them itself as defaults.
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
# The SDK's failures: ConnectionError/requests errors (OSError), RuntimeError for refused requests
# (unknown job, duplicate submission id), ValueError for a bad address or an oversized working dir,
# RayError for a refused token.
SDK_ERRORS = (ray.exceptions.RayError, RuntimeError, ValueError, OSError)
# Ray >= 2.5x clusters may require a token (`ray start` enables it when ~/.ray/auth_token exists).
AUTH_ERROR = getattr(ray.exceptions, "AuthenticationError", ())
AUTH_HINT = (
    "the cluster uses Ray token auth: run with RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN, "
    "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token"
)


class ClusterError(SpecError):
    """The cluster address or job id the user gave cannot be used; reported like a bad spec (exit code 2)."""


def _first_line(error: BaseException) -> str:
    """The SDK's messages run to paragraphs; the first line says what failed."""
    text = (str(error).strip() or type(error).__name__).splitlines()[0]
    return f"{text} ({AUTH_HINT})" if isinstance(error, AUTH_ERROR) else text


@contextmanager
def _only_given_address() -> Iterator[None]:
    """Hide RAY_ADDRESS & co. while the client resolves its address, so --address means what it says."""
    saved = {name: os.environ.pop(name) for name in ADDRESS_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def connect(address: str) -> JobSubmissionClient:
    """A client for the cluster's Jobs API; a ClusterError naming the address when it cannot be reached."""
    with _only_given_address():
        try:
            return JobSubmissionClient(address)
        except SDK_ERRORS as e:
            raise ClusterError(
                f"cannot reach the Ray Jobs API at {address}: {_first_line(e)} "
                "(give the dashboard's HTTP address, e.g. http://HEAD:8265)"
            ) from None


def _call(what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except SDK_ERRORS as e:
        raise ClusterError(f"{what}: {_first_line(e)}") from None


PROBE_ENTRYPOINT = "specray --help > /dev/null"
PROBE_TIMEOUT_S = 180.0
PROBE_ATTEMPTS = 3
PROBE_RETRY_S = 2.0
RAY_SAYS = ("Running entrypoint for job", "Job entrypoint command failed")  # Ray's lines, not the shell's
# A job that failed before its entrypoint ran (Ray could not set up its runtime env or start its supervisor
# actor, e.g. a head that has just started and is busy) says nothing about the cluster's specray: the probe
# runs again. Any other failure (the entrypoint's own, or none given) is the shell's answer.
NOT_THE_ENTRYPOINT = frozenset(
    kind.value  # JobDetails.error_type holds the value
    for kind in (
        JobErrorType.RUNTIME_ENV_SETUP_FAILURE,
        JobErrorType.JOB_SUPERVISOR_ACTOR_START_TIMEOUT,
        JobErrorType.JOB_SUPERVISOR_ACTOR_START_FAILURE,
        JobErrorType.JOB_SUPERVISOR_ACTOR_UNKNOWN_FAILURE,
        JobErrorType.JOB_SUPERVISOR_ACTOR_DIED,
    )
)


def failed_before_entrypoint(info: JobDetails) -> bool:
    """Whether a failed job never ran its entrypoint: Ray's job machinery failed, not the command."""
    return info.status == JobStatus.FAILED and info.error_type in NOT_THE_ENTRYPOINT


def check_runs_specray(client: JobSubmissionClient, address: str, env_vars: dict[str, str]) -> None:
    """Refuse, before anything is uploaded, a cluster whose job environment cannot run `specray`: a probe
    job (no working dir, no resources) runs the CLI the way the real job will, through the job's shell on
    the PATH the cluster's Ray was started with. A probe that does not end in time is let through; one that
    Ray failed to start (`failed_before_entrypoint`) is tried again, up to PROBE_ATTEMPTS times."""
    for attempt in range(1, PROBE_ATTEMPTS + 1):
        probe = _call(
            "checking that the cluster can run specray",
            client.submit_job,
            entrypoint=PROBE_ENTRYPOINT,
            runtime_env={"env_vars": env_vars} if env_vars else None,
            entrypoint_num_cpus=0,
            metadata={"specray.probe": "can this cluster's job environment run specray"},
        )
        info = wait(client, probe, poll_s=0.5, timeout_s=PROBE_TIMEOUT_S)
        if info.status == JobStatus.SUCCEEDED:
            return
        if not info.status.is_terminal():
            log.warning(
                "the probe job %s has not ended after %.0f s; submitting anyway", probe, PROBE_TIMEOUT_S
            )
            return
        if not failed_before_entrypoint(info):
            break
        if attempt == PROBE_ATTEMPTS:
            first = (info.message or str(info.error_type)).strip().splitlines()[-1]
            raise ClusterError(
                f"the cluster at {address} could not start a job ({info.error_type}) in {PROBE_ATTEMPTS} "
                f"tries, the last: {first!r}. Check its Ray (`ray status`, the head's logs under "
                "/tmp/ray/session_latest/logs) and submit again"
            )
        log.warning(
            "the probe job %s failed before it ran (%s); trying again (%d of %d)",
            probe,
            info.error_type,
            attempt + 1,
            PROBE_ATTEMPTS,
        )
        time.sleep(PROBE_RETRY_S)
    # the job's own output: its logs, or the tail of them Ray puts in the failure message
    output = f"{logs(client, probe)}\n{info.message or ''}".splitlines()
    said = (
        [line for line in output if line.strip() and not line.startswith(RAY_SAYS)] or [str(info.status)]
    )[-1]
    exit_code = f", exit {info.driver_exit_code}" if info.driver_exit_code is not None else ""
    raise ClusterError(
        f"the cluster at {address} cannot run specray: its job shell said {said!r}{exit_code}. Start Ray "
        "there from an environment where specray is installed (activate the virtualenv before `ray start`), "
        "or run the project's image (infra/docker/Dockerfile)"
    )


def submit(client: JobSubmissionClient, request: JobRequest) -> str:
    """Upload the working dir and start the job; returns its submission id."""
    return _call("submitting the job", client.submit_job, **request.submit_kwargs())


def details(client: JobSubmissionClient, job_id: str) -> JobDetails:
    return _call(f"job {job_id}", client.get_job_info, job_id)


def logs(client: JobSubmissionClient, job_id: str) -> str:
    return _call(f"logs of job {job_id}", client.get_job_logs, job_id)


def list_jobs(client: JobSubmissionClient) -> list[JobDetails]:
    """All jobs the cluster knows, oldest first."""
    jobs = _call("listing jobs", client.list_jobs)
    return sorted(jobs, key=lambda job: job.start_time or 0)


def stop(client: JobSubmissionClient, job_id: str) -> bool:
    """Ask the job to stop (SIGTERM, then SIGKILL); False when it was not running."""
    return _call(f"stopping job {job_id}", client.stop_job, job_id)


def wait(
    client: JobSubmissionClient, job_id: str, poll_s: float = 1.0, timeout_s: float | None = None
) -> JobDetails:
    """The job's details once its status is terminal (SUCCEEDED, FAILED or STOPPED), or at the timeout."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        info = details(client, job_id)
        if info.status.is_terminal() or (deadline is not None and time.monotonic() > deadline):
            return info
        time.sleep(poll_s)


def follow(client: JobSubmissionClient, job_id: str, write: Callable[[str], None]) -> JobDetails:
    """Stream the job's output to `write` as it comes, until the job ends; returns its final details."""

    async def tail() -> None:
        async for chunk in client.tail_job_logs(job_id):
            write(chunk)

    details(client, job_id)  # an unknown id fails here with the API's message, not as a websocket error
    try:
        asyncio.run(tail())
    except (RuntimeError, OSError, aiohttp.ClientError) as e:
        # the head restarted or the connection dropped: the job may still run, so wait for its end
        log.warning("log stream of job %s ended early (%s); waiting for the job to finish", job_id, e)
    return wait(client, job_id)


def describe(info: JobDetails) -> list[str]:
    """A job's details for people, without its runtime_env (env_vars may hold secrets)."""
    lines = [
        f"job {info.submission_id or info.job_id}: {info.status}",
        f"  message: {info.message or '-'}",
        f"  entrypoint: {redact_uri_credentials(info.entrypoint)}",
        f"  started: {_time(info.start_time)}   ended: {_time(info.end_time)}",
    ]
    if info.driver_exit_code is not None:
        lines.append(f"  driver exit code: {info.driver_exit_code}")
    metadata = info.metadata or {}
    lines += [f"  {key}: {redact_uri_credentials(str(value))}" for key, value in metadata.items()]
    return lines


def summary_row(info: JobDetails) -> tuple[str, str, str, str, str]:
    """(id, status, started, sweep, entrypoint) for `specray jobs list`."""
    sweep = (info.metadata or {}).get("specray.sweep", "-")
    entry = redact_uri_credentials(info.entrypoint)
    return (info.submission_id or info.job_id or "-", str(info.status), _time(info.start_time), sweep, entry)


def _time(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
