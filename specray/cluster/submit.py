"""What `specray submit` sends to a Ray cluster: the files, the environment, the command and its resources.

Pure construction (no Ray import), so every rule here is unit-tested without a cluster; `specray.cluster.jobs`
hands the result to Ray's Jobs SDK. The job runs `specray run|tune|garden SWEEP OVERRIDES` in a copy of the
working dir, which Ray puts first on PYTHONPATH: the cluster runs this checkout's code with its own
dependencies.
"""

from __future__ import annotations

import getpass
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from specray.config import SweepSpec, load_spec
from specray.errors import SpecError

# Never uploaded: environments, VCS data, run outputs, local MLflow stores and caches. Ray also honours
# .gitignore, but that can be switched off (RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1), so this list stands alone.
# gitignore syntax, relative to the working dir: "/x" only at the top, "x" at any depth.
WORKING_DIR_EXCLUDES = (
    ".venv",
    "venv",
    ".git",
    "/outputs",
    "/reports",
    "/build",
    "/dist",
    "mlruns",
    "mlartifacts",
    "mlflow.db",
    ".specray-cache",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    ".pytest_cache",
    ".ruff_cache",
    ".mypy_cache",
    ".hypothesis",
    ".env",  # settings files with passwords (infra/mlflow/.env)
)
# Passed when set here: they describe the user, not this machine.
PASSED_ENV = ("MLFLOW_TRACKING_USERNAME", "SPECRAY_RAY_LOGS")
# Passed when set here, never printed, logged or put in job metadata. Any Jobs API client can read a job's
# env_vars (the dashboard masks them only for browsers): `--no-secrets` leaves them to the cluster's secrets.
SECRET_ENV = ("HF_TOKEN", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN")
# Paths on this machine: passing them would point the cluster at folders it does not have. The cluster's
# image or manifest sets them (infra/); `--env NAME` passes this machine's value on purpose.
LOCAL_PATH_ENV = ("SPECRAY_CACHE", "HF_HOME")
# Masked wherever specray shows text, though never sent: the cluster's own Ray token (token auth).
MASKED_ENV = (*SECRET_ENV, "RAY_AUTH_TOKEN")
_URI_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s]+@")


def redact_uri_credentials(text: str) -> str:
    """`postgresql://user:pw@host/db` -> `postgresql://***@host/db`, anywhere in `text`."""
    return _URI_CREDENTIALS.sub(r"\g<scheme>***@", text)


@dataclass(frozen=True)
class Redactor:
    """Masks secret values and URI credentials in text shown to the user (job logs, job details)."""

    secret_values: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> Redactor:
        return cls(tuple(environ[name] for name in MASKED_ENV if environ.get(name)))

    def __call__(self, text: str) -> str:
        for value in self.secret_values:
            if len(value) >= 4:  # masking "1" or "" would mangle ordinary output
                text = text.replace(value, "***")
        return redact_uri_credentials(text)


@dataclass(frozen=True)
class JobRequest:
    """Everything `JobSubmissionClient.submit_job` gets. Secret values live only in `runtime_env`."""

    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any] = field(repr=False)
    entrypoint_num_cpus: float
    entrypoint_num_gpus: float
    metadata: dict[str, str]
    notes: tuple[str, ...] = ()  # warnings for the user, e.g. outputs that would be lost on the cluster

    def submit_kwargs(self) -> dict[str, Any]:
        return {
            "entrypoint": self.entrypoint,
            "submission_id": self.submission_id,
            "runtime_env": self.runtime_env,
            "entrypoint_num_cpus": self.entrypoint_num_cpus,
            "entrypoint_num_gpus": self.entrypoint_num_gpus,
            "metadata": self.metadata,
        }

    def describe(self) -> list[str]:
        """What the CLI prints before submitting: env var names only, never their values."""
        env = self.runtime_env.get("env_vars", {})
        names = [f"{n} (secret, hidden)" if n in SECRET_ENV else n for n in sorted(env)]
        return [
            f"job {self.submission_id}: {self.entrypoint}",
            f"  working dir {self.runtime_env['working_dir']} "
            f"(excluding {', '.join(self.runtime_env['excludes'])})",
            f"  driver resources: {self.entrypoint_num_cpus:g} CPU, {self.entrypoint_num_gpus:g} GPU",
            f"  env vars: {', '.join(names) or 'none'}",
            *(f"  note: {note}" for note in self.notes),
        ]


def build_job_request(
    sweep: Path,
    overrides: Sequence[str] = (),
    *,
    working_dir: Path = Path("."),
    command: str = "run",
    env: Sequence[str] = (),
    pass_secrets: bool = True,
    driver_cpus: float | None = None,
    driver_gpus: float = 0.0,
    submission_id: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> JobRequest:
    """Validate the sweep here (a bad spec never reaches the cluster) and build the job that runs it there."""
    working_dir = working_dir.resolve()
    sweep_rel = sweep_in_working_dir(sweep, working_dir)
    spec = load_spec(sweep, overrides)
    overrides = [*overrides, *cluster_overrides(spec)]
    spec = load_spec(sweep, overrides)  # what the job will resolve, cluster overrides included
    check_no_credentials(spec)
    if spec.models.garden and command == "run":
        command = "garden"  # a garden spec runs whole, as `specray garden` (`specray tune` refuses it there)
    env_vars, notes = job_env(env, pass_secrets, environ)
    return JobRequest(
        submission_id=submission_id or new_submission_id(spec.name),
        entrypoint=entrypoint(command, sweep_rel, overrides),
        runtime_env={
            "working_dir": str(working_dir),
            "excludes": list(WORKING_DIR_EXCLUDES),
            "env_vars": env_vars,
        },
        entrypoint_num_cpus=driver_num_cpus(spec) if driver_cpus is None else driver_cpus,
        entrypoint_num_gpus=driver_gpus,  # the driver never needs one: a GPU reserved for it would idle
        metadata=job_metadata(spec, sweep_rel, overrides, command, working_dir),
        notes=(*notes, *placement_notes(spec), *data_notes(spec, working_dir)),
    )


def sweep_in_working_dir(sweep: Path, working_dir: Path) -> str:
    """The sweep's path inside the uploaded working dir, as the job will see it (POSIX, relative)."""
    resolved = sweep.resolve()
    if not resolved.is_file():
        raise SpecError(f"{sweep}: file not found")
    try:
        relative = PurePosixPath(resolved.relative_to(working_dir).as_posix())
    except ValueError:
        raise SpecError(
            f"{sweep}: outside the working dir {working_dir}, which is what the cluster receives; "
            "run from the repository root or pass --working-dir"
        ) from None
    part = excluded_part(relative)
    if part:
        raise SpecError(f"{sweep}: inside {part}, which is never uploaded; move the sweep")
    if _git_ignored(working_dir, relative):
        raise SpecError(f"{sweep}: git-ignored, so Ray does not upload it; move the sweep")
    return str(relative)


def excluded_part(relative: PurePosixPath) -> str | None:
    """The first part of a working-dir path that WORKING_DIR_EXCLUDES matches ("/x" rules only at the top)."""
    for depth, part in enumerate(relative.parts):
        for pattern in WORKING_DIR_EXCLUDES:
            if (depth == 0 or not pattern.startswith("/")) and PurePosixPath(part).match(pattern.lstrip("/")):
                return part
    return None


def _git_ignored(working_dir: Path, relative: PurePosixPath) -> bool:
    """Ray skips what .gitignore lists, so such a sweep would be missing on the cluster."""
    try:
        command = ["git", "-C", str(working_dir), "check-ignore", "-q", str(relative)]
        check = subprocess.run(command, capture_output=True)
    except OSError:  # git not installed: nothing to ask
        return False
    return check.returncode == 0


def cluster_overrides(spec: SweepSpec) -> list[str]:
    """`ray.address: null` means "start a local Ray": inside a job that would ignore the cluster, so the
    job joins it instead (Ray sets RAY_ADDRESS for job drivers, which `auto` finds)."""
    return ["ray.address=auto"] if spec.ray.address is None else []


def check_no_credentials(spec: SweepSpec) -> None:
    """A password in tracking.uri would travel in the job's command line, which the Jobs API shows."""
    if redact_uri_credentials(spec.tracking.uri) != spec.tracking.uri:
        raise SpecError(
            f"tracking.uri: {redact_uri_credentials(spec.tracking.uri)} carries credentials; "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD instead (passed as secrets)"
        )


def job_env(
    env: Sequence[str], pass_secrets: bool, environ: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The job's env vars: PASSED_ENV and (unless told not to) SECRET_ENV that are set here, then `--env`
    items (`NAME` passes this machine's value, `NAME=VALUE` sets one). Also notes for the user."""
    names = PASSED_ENV + (SECRET_ENV if pass_secrets else ())
    env_vars = {name: environ[name] for name in names if environ.get(name)}
    for item in env:
        name, sep, value = item.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise SpecError(f"--env {item!r}: expected NAME or NAME=VALUE")
        if not sep and name not in environ:
            raise SpecError(f"--env {name}: not set here; give a value with --env {name}=VALUE")
        env_vars[name] = value if sep else environ[name]
    notes = [
        f"{name} is set here but not passed (a path on this machine); pass it with --env {name}"
        for name in LOCAL_PATH_ENV
        if environ.get(name) and name not in env_vars
    ]
    return env_vars, notes


def driver_num_cpus(spec: SweepSpec) -> float:
    """CPUs reserved for the job's driver, which orchestrates actors, tokenizes prompts and writes the report.

    On a GPU sweep CPUs are plentiful and one keeps the driver off nodes that advertise none; on a CPU-only
    sweep any reservation would take a core from the actors the driver waits for, so a small cluster could
    never place the whole teacher pool."""
    uses_gpus = max(spec.teacher.num_gpus, spec.distill.num_gpus_per_worker, spec.eval.num_gpus) > 0
    return 1.0 if uses_gpus else 0.0


def entrypoint(command: str, sweep_rel: str, overrides: Sequence[str]) -> str:
    """The shell command the job runs (overrides quoted: `teacher.temperatures=[0.0, 0.5]` has a space)."""
    if command not in ("run", "tune", "garden"):
        raise SpecError(f"command {command!r}: expected run, tune or garden")
    return shlex.join(["specray", command, sweep_rel, *overrides])


def new_submission_id(sweep_name: str, now: float | None = None) -> str:
    """`specray-smoke-20260121-030405-1a2b`: readable in `ray job list`, unique per submission."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    name = re.sub(r"[^a-z0-9_-]+", "-", sweep_name.lower()).strip("-")
    return f"specray-{name}-{stamp}-{secrets.token_hex(2)}"


def job_metadata(
    spec: SweepSpec, sweep_rel: str, overrides: Sequence[str], command: str, working_dir: Path
) -> dict[str, str]:
    """Shown by `specray jobs list/status` and the Ray dashboard; only strings, never a secret."""
    return {
        "specray.sweep": spec.name,
        "specray.command": f"{command} {sweep_rel}",
        "specray.overrides": redact_uri_credentials(shlex.join(overrides)),
        "specray.submitted_by": _user(),
        "specray.git": _git_revision(working_dir),
    }


def placement_notes(spec: SweepSpec) -> list[str]:
    """Relative paths resolve inside the job's unpacked working dir, which is private to the driver's node
    and deleted with the job: results there are lost, and other nodes cannot read drafts written there."""
    notes = []
    if not Path(spec.output_dir).is_absolute():
        notes.append(
            f"output_dir {spec.output_dir!r} is relative: on the cluster it lands in the job's temporary "
            "working dir; pass output_dir=/a/shared/path (every node must see it)"
        )
    uri = spec.tracking.uri
    if not uri.startswith(("http://", "https://", "databricks")):
        relative = uri.startswith("sqlite:///") and not uri.startswith("sqlite:////")
        lost = "its runs and artifacts" if relative else "its artifacts (report, drafts)"
        notes.append(
            f"tracking.uri {uri} is not an MLflow server: the job would write {lost} into its temporary "
            "working dir, deleted when it ends; pass tracking.uri=http://MLFLOW_HOST:5000 (see infra/mlflow)"
        )
    return notes


def data_notes(spec: SweepSpec, working_dir: Path) -> list[str]:
    """The job reads a relative data path from its working dir, so the file must be uploaded with it."""
    notes = []
    named = [(f"data.test_sets.{name}.source", t.source) for name, t in spec.data.test_sets.items()]
    sources = [("data.train", spec.data.train), ("data.out_of_domain", spec.data.out_of_domain), *named]
    for name, source in sources:
        if source.path is None or Path(source.path).is_absolute():
            continue  # synthetic, or a path read as it is on the cluster
        local = (working_dir / source.path).resolve()
        if source.kind == "alpaca" and not source.path.startswith(".") and not local.exists():
            continue  # a hub dataset name such as tatsu-lab/alpaca: downloaded on the cluster
        if not (local.is_file() and local.is_relative_to(working_dir)):
            notes.append(
                f"{name}.path {source.path!r} is not a file inside the working dir, so the job will not "
                "find it; put it there (it is uploaded) or give a path that exists on the cluster"
            )
    return notes


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "unknown"


def _git_revision(working_dir: Path) -> str:
    """`<short sha>` or `<short sha>-dirty`, so a job can be traced to the code it ran; '' outside git."""

    def git(*args: str) -> str:
        result = subprocess.run(["git", "-C", str(working_dir), *args], capture_output=True, text=True)
        return result.stdout.strip() if result.returncode == 0 else ""

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except OSError:  # git not installed
        return ""
    return f"{sha}-dirty" if sha and dirty else sha
