"""`specray submit` and `specray jobs` against a real Ray head started with `ray start --head` on 127.0.0.1,
with Ray's token auth on (its default once a token exists): the smoke sweep runs as a Ray job, its logs
stream to SUCCEEDED, its runs land in MLflow, and a second job is stopped. The head (and only it) is stopped
afterwards, by the processes of its own temp dir."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from specray.cluster.loopback import free_ports
from specray.tracking.names import PARENT, ROLE
from tests.conftest import REPO
from tests.servers import listening_addresses
from tests.stores import new_store
from tests.sweeps import COARSE_TIMING
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
SPECRAY, RAY = str(BIN / "specray"), str(BIN / "ray")
FAKE_TOKEN = "hf_FAKEtokenFAKEtoken0123456789"  # passed to the job as HF_TOKEN; must never be printed
# every port the head opens, so it never collides with another Ray on the machine (other tests' included)
PORT_FLAGS = (
    "port",
    "dashboard-port",
    "ray-client-server-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "node-manager-port",
    "object-manager-port",
)
DASHBOARD_MODULES = ("aiohttp_cors", "opencensus", "prometheus_client")  # what ray[default] adds
# the submitted sweep trains the offline drafts only: the job's path, not the paradigms, is under test here
OFFLINE = "distill.paradigms=[offline]"
DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1"]


def _processes_of(temp_dir: Path) -> list[int]:
    """Pids of the Ray processes started for this head: every one names its temp/session dir."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:  # exited meanwhile
                continue
            if str(temp_dir).encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def _stop_head(temp_dir: Path) -> None:
    """Stop this head only (`ray stop` would stop every Ray on the machine, other tests' included)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 60.0)):  # gcs_server & raylet linger on TERM
        for pid in _processes_of(temp_dir):
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, sig)
        deadline = time.monotonic() + grace  # a killed process can take a while to go on a loaded machine
        while _processes_of(temp_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
    shutil.rmtree(temp_dir, ignore_errors=True)


@dataclass(frozen=True)
class RayHead:
    address: str  # the Jobs API (dashboard) address
    env: dict[str, str]  # what a client of this head runs with: its auth token, specray on PATH


def _start_head(temp_dir: Path, specray_on_path: bool = True) -> RayHead:
    """`ray start --head` on loopback with free ports and a token of its own; without `specray_on_path`,
    as from a virtualenv that was not activated (`.venv/bin/ray start`): Ray runs, `specray` is not found."""
    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    command = [
        RAY,
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        "--num-cpus=2",
        "--num-gpus=0",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        *(f"--{flag}={port}" for flag, port in ports.items()),
    ]
    # the job's shell finds `specray` on the PATH the head was started with, like on a cluster node
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and Path(p) != BIN]
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(BIN), *path] if specray_on_path else path),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return RayHead(f"http://127.0.0.1:{ports['dashboard-port']}", env)


def _jobs_api_answers(head: RayHead) -> bool:
    request = urllib.request.Request(
        f"{head.address}/api/jobs/", headers={"Authorization": f"Bearer {head.env['RAY_AUTH_TOKEN']}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status == 200
    except OSError:  # the dashboard is still starting
        return False


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    yield from _head(specray_on_path=True)


def _head(specray_on_path: bool) -> Iterator[RayHead]:
    missing = [m for m in DASHBOARD_MODULES if not importlib.util.find_spec(m)]
    if missing:
        pytest.skip(f"the Ray Jobs API needs the dashboard of ray[default] (missing {', '.join(missing)})")
    # short: Ray's unix socket paths under the temp dir must stay below 108 characters
    temp_dir = Path(tempfile.mkdtemp(prefix="sr-", dir="/tmp"))
    try:
        head = _start_head(temp_dir, specray_on_path)
        wait_until(lambda: _jobs_api_answers(head), f"the Jobs API at {head.address}", poll_s=1.0)
        yield head
    finally:
        _stop_head(temp_dir)
    assert not _processes_of(temp_dir), "Ray processes of the test head survived"


def _specray(head: RayHead, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """The real CLI against the head: `--address` and the head's token come with every call."""
    command = [SPECRAY, *args, "--address", head.address]
    env = {**head.env, **env}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def test_submitted_smoke_sweep_succeeds_streams_its_logs_and_tracks_to_mlflow(
    ray_head: RayHead, tmp_path: Path
) -> None:
    uri = new_store(tmp_path)
    job_id = f"specray-smoke-test-{os.getpid()}"
    args = [
        "sweeps/smoke.yaml",
        f"tracking.uri={uri}",
        f"output_dir={tmp_path / 'out'}",
        COARSE_TIMING,
        OFFLINE,
    ]
    submitted = _specray(
        ray_head, "submit", *args, "--submission-id", job_id, timeout=CLI_TIMEOUT_S, HF_TOKEN=FAKE_TOKEN
    )
    output = submitted.stdout + submitted.stderr
    assert submitted.returncode == 0, output[-4000:]
    assert f"job {job_id} SUCCEEDED" in submitted.stderr
    assert "specray run sweeps/smoke.yaml" in submitted.stderr and "ray.address=auto" in submitted.stderr
    assert "HF_TOKEN (secret, hidden)" in submitted.stderr
    assert FAKE_TOKEN not in output and ray_head.env["RAY_AUTH_TOKEN"] not in output
    # the job's own output, streamed while it ran: the sweep joined this cluster instead of starting a Ray
    assert "sweep smoke: " in submitted.stdout and "MLflow run" in submitted.stdout
    assert "Connecting to existing Ray cluster" in submitted.stdout
    assert "Started a local Ray instance" not in submitted.stdout
    assert "progress distill: " in submitted.stdout and "progress eval: " in submitted.stdout  # a job's log

    logs = _specray(ray_head, "jobs", "logs", job_id)
    assert logs.returncode == 0 and "sweep smoke: " in logs.stdout
    followed = _specray(ray_head, "jobs", "logs", job_id, "--follow")
    assert followed.returncode == 0 and "sweep smoke: " in followed.stdout, followed.stderr[-2000:]
    status = _specray(ray_head, "jobs", "status", job_id)
    assert status.returncode == 0 and f"job {job_id}: SUCCEEDED" in status.stdout
    assert "specray.sweep: smoke" in status.stdout and FAKE_TOKEN not in status.stdout
    listing = _specray(ray_head, "jobs", "list")
    assert any(job_id in line and "SUCCEEDED" in line for line in listing.stdout.splitlines()), listing.stdout

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["ray.address"] == "auto"
    children = [r for r in runs if r.data.tags.get(PARENT) == parents[0].info.run_id]
    assert sorted(r.data.tags["draft"] for r in children) == DRAFTS
    assert (tmp_path / "out" / "smoke" / "report" / "report.md").exists()


def _started(head: RayHead, job_id: str) -> str:
    """The job's status line once it is running or has ended, else ""."""
    line = _specray(head, "jobs", "status", job_id).stdout.split("\n", 1)[0]
    return line if any(state in line for state in ("RUNNING", "SUCCEEDED", "FAILED", "STOPPED")) else ""


def test_jobs_stop_ends_a_running_job(ray_head: RayHead, tmp_path: Path) -> None:
    job_id = f"specray-smoke-stop-{os.getpid()}"
    args = [f"tracking.uri={new_store(tmp_path)}", f"output_dir={tmp_path / 'out'}"]
    # its own cache (via --env), so the killed job leaves nothing half-built in the session's cache
    options = ["--env", f"SPECRAY_CACHE={tmp_path / 'cache'}", "--no-wait", "--submission-id", job_id]
    submitted = _specray(ray_head, "submit", "sweeps/smoke.yaml", *args, *options)
    assert submitted.returncode == 0, submitted.stderr[-2000:]
    assert f"specray jobs logs {job_id} --follow" in submitted.stderr
    started = wait_until(lambda: _started(ray_head, job_id), f"job {job_id} to start", poll_s=1.0)
    assert "RUNNING" in started, started

    # progress lines reach the job's log while it runs (the job is stopped below, so it had not ended)
    def logged_progress() -> bool:
        return "progress zoo: " in _specray(ray_head, "jobs", "logs", job_id).stdout

    wait_until(logged_progress, f"a progress line in the logs of job {job_id}", poll_s=1.0)

    stopped = _specray(ray_head, "jobs", "stop", job_id)
    assert stopped.returncode == 0 and "stop requested; now STOPPED" in stopped.stdout, stopped.stderr
    followed = _specray(ray_head, "jobs", "logs", job_id, "--follow")
    assert followed.returncode == 1 and f"job {job_id} STOPPED" in followed.stderr


def test_the_dashboard_listens_on_loopback_only(ray_head: RayHead) -> None:
    """The dashboard (Jobs API) serves HTTP; started with --dashboard-host=127.0.0.1 it is not reachable
    from other machines. (Ray's internal gRPC ports bind every interface and rely on token auth.)"""
    port = int(ray_head.address.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_errors_are_one_line(ray_head: RayHead) -> None:
    unknown = _specray(ray_head, "jobs", "status", "no-such-job")
    assert unknown.returncode == 2 and "error: job no-such-job:" in unknown.stderr
    no_token = _specray(ray_head, "jobs", "list", RAY_AUTH_MODE="disabled")
    assert no_token.returncode == 2 and "RAY_AUTH_MODE=token" in no_token.stderr, no_token.stderr
    assert "Traceback" not in unknown.stderr + no_token.stderr


def test_a_cluster_that_cannot_run_specray_is_refused_before_the_upload(tmp_path: Path) -> None:
    head = next(heads := _head(specray_on_path=False))
    try:
        result = _specray(head, "submit", "sweeps/smoke.yaml", f"tracking.uri=sqlite:///{tmp_path}/m.db")
        assert result.returncode == 2, result.stderr[-3000:]
        error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(error) == 1 and "cannot run specray" in error[0] and "specray: not found" in error[0]
        assert "activate the virtualenv before `ray start`" in error[0]
        assert "submitted" not in result.stderr and "Traceback" not in result.stderr
        jobs = _specray(head, "jobs", "list")
        assert "specray run" not in jobs.stdout, jobs.stdout  # only the probe ran there
    finally:
        heads.close()  # stops this head
