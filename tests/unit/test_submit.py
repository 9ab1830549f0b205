"""`specray submit` without a cluster: what is uploaded, the job's env, command and resources, and secrets."""

from __future__ import annotations

import json
import re
import shlex
import socket
from pathlib import Path, PurePosixPath

import pytest
import yaml
from ray._private.thirdparty.pathspec import PathSpec  # the matcher Ray applies to runtime_env excludes
from ray.job_submission import JobDetails
from typer.testing import CliRunner

from specray.cli import app
from specray.cluster.jobs import describe, failed_before_entrypoint
from specray.cluster.submit import (
    WORKING_DIR_EXCLUDES,
    JobRequest,
    Redactor,
    build_job_request,
    excluded_part,
    new_submission_id,
)
from specray.config import load_raw, load_spec
from specray.errors import SpecError
from tests.conftest import REPO

SMOKE = REPO / "sweeps" / "smoke.yaml"
SECRET = "hf_FAKEtokenFAKEtoken0123456789"
ABSOLUTE = ("output_dir=/mnt/shared/outputs", "tracking.uri=http://mlflow:5000")


def _request(*overrides: str, **kwargs) -> JobRequest:
    kwargs.setdefault("environ", {})
    return build_job_request(SMOKE, list(overrides), working_dir=REPO, **kwargs)


def test_the_job_runs_the_validated_sweep_from_the_working_dir_and_joins_the_cluster() -> None:
    request = _request("eval.gamma=5", "teacher.temperatures=[0.0, 0.5]")
    argv = shlex.split(request.entrypoint)
    assert argv[:3] == ["specray", "run", "sweeps/smoke.yaml"]
    # a value with a space stays one argument; ray.address=auto because smoke.yaml says `null` (local Ray)
    assert argv[3:] == ["eval.gamma=5", "teacher.temperatures=[0.0, 0.5]", "ray.address=auto"]
    assert request.runtime_env["working_dir"] == str(REPO)
    spec = load_spec(REPO / argv[2], argv[3:])  # what the job will resolve, from its working dir
    assert spec.eval.gamma == [5] and spec.ray.address == "auto"


def test_an_explicit_ray_address_is_kept_and_tune_runs_specray_tune() -> None:
    request = _request("ray.address=ray://head:10001", command="tune")
    assert shlex.split(request.entrypoint) == [
        "specray",
        "tune",
        "sweeps/smoke.yaml",
        "ray.address=ray://head:10001",
    ]


def test_a_garden_spec_runs_specray_garden_on_the_cluster() -> None:
    garden = REPO / "sweeps" / "garden_tiny.yaml"
    request = build_job_request(garden, [], working_dir=REPO, environ={})
    assert shlex.split(request.entrypoint)[:3] == ["specray", "garden", "sweeps/garden_tiny.yaml"]
    assert request.metadata["specray.command"] == "garden sweeps/garden_tiny.yaml"


def test_a_bad_spec_fails_here_with_its_field_path() -> None:
    with pytest.raises(
        SpecError, match=r"smoke\.yaml: eval\.gamma\.0: Input should be greater than or equal"
    ):
        _request("eval.gamma=0")


def test_the_sweep_must_be_uploaded_with_the_working_dir(tmp_path: Path) -> None:
    outside = tmp_path / "mine.yaml"
    outside.write_text("name: mine\n")
    with pytest.raises(SpecError, match="outside the working dir .* pass --working-dir"):
        build_job_request(outside, working_dir=REPO, environ={})
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "mine.yaml").write_text("name: mine\n")
    with pytest.raises(SpecError, match="inside outputs, which is never uploaded"):
        build_job_request(tmp_path / "outputs" / "mine.yaml", working_dir=tmp_path, environ={})


EXCLUDED = [
    ".venv",
    ".venv/lib/python3.11/site-packages/torch/__init__.py",
    ".git/HEAD",
    "outputs",
    "outputs/smoke/report/report.md",
    "reports/abc/report.md",
    "mlflow.db",
    "mlruns/0/meta.yaml",
    "mlartifacts/1/a.png",
    "specray.egg-info/PKG-INFO",
    "specray/__pycache__/cli.cpython-311.pyc",
    ".specray-cache/zoo/x/model.safetensors",
    ".pytest_cache/v/cache/nodeids",
    "infra/mlflow/.env",
]
UPLOADED = [
    "specray/cli.py",
    "specray/report/build.py",
    "sweeps/smoke.yaml",
    "configs/models/tiny_zoo.yaml",
    "data/gsm8k/test.jsonl",
    "infra/mlflow/.env.example",
    "pyproject.toml",
]


def test_excludes_keep_environments_outputs_and_caches_out_and_the_code_in() -> None:
    rays_matcher = PathSpec.from_lines("gitwildmatch", WORKING_DIR_EXCLUDES)
    for path in EXCLUDED:
        assert rays_matcher.match_file(path) and excluded_part(PurePosixPath(path)), path
    for path in UPLOADED:
        assert not rays_matcher.match_file(path) and excluded_part(PurePosixPath(path)) is None, path
    assert _request().runtime_env["excludes"] == list(WORKING_DIR_EXCLUDES)


def test_secrets_reach_the_job_but_are_never_shown() -> None:
    environ = {
        "HF_TOKEN": SECRET,
        "MLFLOW_TRACKING_USERNAME": "ada",
        "MLFLOW_TRACKING_PASSWORD": SECRET[::-1],
        "SPECRAY_CACHE": "/home/ada/.cache/specray",
        "HOME": "/home/ada",
    }
    request = _request(environ=environ)
    assert request.runtime_env["env_vars"] == {
        "HF_TOKEN": SECRET,
        "MLFLOW_TRACKING_USERNAME": "ada",
        "MLFLOW_TRACKING_PASSWORD": SECRET[::-1],
    }
    shown = "\n".join([*request.describe(), repr(request), json.dumps(request.metadata), request.entrypoint])
    assert SECRET not in shown and SECRET[::-1] not in shown
    assert "HF_TOKEN (secret, hidden)" in shown and "MLFLOW_TRACKING_USERNAME" in shown
    # a path of this machine is not sent, but the user hears about it
    assert any("SPECRAY_CACHE is set here but not passed" in note for note in request.notes)
    assert "HF_TOKEN" not in _request(environ=environ, pass_secrets=False).runtime_env["env_vars"]


def test_env_option_passes_a_local_value_or_sets_one() -> None:
    environ = {"SPECRAY_CACHE": "/mnt/shared/cache"}
    request = _request(environ=environ, env=["SPECRAY_CACHE", "SPECRAY_THREADS=8"])
    assert request.runtime_env["env_vars"] == {"SPECRAY_CACHE": "/mnt/shared/cache", "SPECRAY_THREADS": "8"}
    assert not any("SPECRAY_CACHE" in note for note in request.notes)
    with pytest.raises(SpecError, match="--env NOPE: not set here"):
        _request(env=["NOPE"])
    with pytest.raises(SpecError, match="expected NAME or NAME=VALUE"):
        _request(env=["1BAD=x"])


def test_credentials_in_the_tracking_uri_are_refused_without_echoing_them() -> None:
    with pytest.raises(SpecError) as info:
        _request("tracking.uri=http://ada:s3cr3t-pw@mlflow:5000")
    assert "s3cr3t-pw" not in str(info.value)
    assert "MLFLOW_TRACKING_PASSWORD" in str(info.value)


def test_redactor_masks_secret_values_and_uri_credentials() -> None:
    redact = Redactor((SECRET, "x"))
    text = f"token={SECRET} db=postgresql://mlflow:pw@postgres:5432/mlflow x"
    assert redact(text) == "token=*** db=postgresql://***@postgres:5432/mlflow x"  # "x" is too short to mask
    environ = {"HF_TOKEN": SECRET, "RAY_AUTH_TOKEN": SECRET[::-1], "HOME": "/root"}
    assert Redactor.from_environ(environ).secret_values == (SECRET, SECRET[::-1])


def test_driver_reserves_a_cpu_only_on_gpu_sweeps_and_never_a_gpu() -> None:
    cpu = _request()
    assert (cpu.entrypoint_num_cpus, cpu.entrypoint_num_gpus) == (0.0, 0.0)
    gpu = build_job_request(REPO / "sweeps" / "paper_grid.yaml", list(ABSOLUTE), working_dir=REPO, environ={})
    assert (gpu.entrypoint_num_cpus, gpu.entrypoint_num_gpus) == (1.0, 0.0)
    assert _request(driver_cpus=2.5).entrypoint_num_cpus == 2.5


def test_submission_ids_are_readable_and_unique() -> None:
    first = new_submission_id("Paper.Grid", now=0)
    assert re.fullmatch(r"specray-paper-grid-19700101-000000-[0-9a-f]{4}", first)
    assert len({new_submission_id("smoke") for _ in range(20)}) > 1
    assert _request(submission_id="mine-1").submission_id == "mine-1"


def test_metadata_are_strings_that_name_the_sweep() -> None:
    request = _request(*ABSOLUTE)
    assert all(isinstance(value, str) for value in request.metadata.values())
    assert request.metadata["specray.sweep"] == "smoke"
    assert request.metadata["specray.command"] == "run sweeps/smoke.yaml"
    assert "ray.address=auto" in request.metadata["specray.overrides"]


def test_notes_warn_about_results_that_would_stay_in_the_jobs_temporary_dir() -> None:
    notes = " ".join(_request().notes)
    assert "output_dir 'outputs' is relative" in notes
    assert "sqlite:///mlflow.db is not an MLflow server: the job would write its runs and artifacts" in notes
    absolute_sqlite = " ".join(_request("tracking.uri=sqlite:////tmp/m.db").notes)
    assert "would write its artifacts (report, drafts) into its temporary working dir" in absolute_sqlite
    assert _request(*ABSOLUTE).notes == ()


def test_notes_name_data_files_the_job_would_not_find(tmp_path: Path) -> None:
    raw = load_raw(SMOKE)
    raw["data"]["train"] = {"kind": "jsonl", "path": "data/train.jsonl"}  # uploaded with the working dir
    raw["data"]["out_of_domain"] = {"kind": "gsm8k", "path": "../gsm8k.jsonl"}  # outside it: not uploaded
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "gsm8k.jsonl").write_text("{}\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(raw))
    notes = build_job_request(sweep, list(ABSOLUTE), working_dir=tmp_path, environ={}).notes
    assert notes == (
        "data.out_of_domain.path '../gsm8k.jsonl' is not a file inside the working dir, so the job will not "
        "find it; put it there (it is uploaded) or give a path that exists on the cluster",
    )


def test_job_details_are_shown_without_env_vars_or_credentials() -> None:
    info = JobDetails(
        type="SUBMISSION",
        job_id="01000000",
        submission_id="specray-smoke-x",
        status="FAILED",
        entrypoint="specray run sweeps/smoke.yaml tracking.uri=http://ada:pw@mlflow:5000",
        message="Job entrypoint command failed with exit code 1",
        runtime_env={"env_vars": {"HF_TOKEN": SECRET}},
        metadata={"specray.sweep": "smoke"},
        driver_exit_code=1,
    )
    text = "\n".join(describe(info))
    assert SECRET not in text and "ada:pw" not in text
    assert "job specray-smoke-x: FAILED" in text and "specray.sweep: smoke" in text


def test_cli_reports_an_unreachable_cluster_in_one_line() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}"
    args = ["submit", str(SMOKE), *ABSOLUTE, "--address", address, "--working-dir", str(REPO)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"error: cannot reach the Ray Jobs API at {address}" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("status", "error_type", "retried"),
    [
        ("FAILED", "RUNTIME_ENV_SETUP_FAILURE", True),  # Ray could not set the job up: the probe says nothing
        ("FAILED", "JOB_SUPERVISOR_ACTOR_START_TIMEOUT", True),
        ("FAILED", "JOB_SUPERVISOR_ACTOR_DIED", True),
        ("FAILED", "JOB_ENTRYPOINT_COMMAND_ERROR", False),  # the shell ran it: `specray: not found`
        ("FAILED", None, False),  # an older Ray gives no error type: the shell's answer, as before
        ("SUCCEEDED", None, False),
        ("STOPPED", None, False),
    ],
)
def test_a_probe_that_ray_failed_to_start_is_tried_again(
    status: str, error_type: str | None, retried: bool
) -> None:
    info = JobDetails(type="SUBMISSION", entrypoint="specray --help", status=status, error_type=error_type)
    assert failed_before_entrypoint(info) == retried
