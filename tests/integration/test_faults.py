"""Faults on the smoke sweep, through the real CLI with real Ray and MLflow (docs/RELIABILITY.md lists them).

- killed teacher, eval and Ray Train worker processes (SIGKILL, injected by specray/faults.py): the sweep
  completes, every shard row, cell and child run exactly once; HF_TOKEN appears nowhere it left behind;
- a read-only output folder at start (refused before any work), an MLflow server that is not there at
  start (refused at once);
- both in the middle of one sweep: the output folder turning read-only (a clear error naming the file),
  then, resumed, its MLflow server dying (a clear error), then a resume to completion once it is back.
The killed driver is in test_sweep.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from specray.config import load_spec
from specray.data.shards import MANIFEST_FILE, SHARD_FILE, read_shard, shard_dir
from specray.distill.checkpoints import FINISHED_FILE
from specray.faults import FAULTS_DIR_ENV, FAULTS_ENV
from specray.keys import train_shard_keys
from tests.servers import QUIET, free_port, mlflow_server
from tests.stores import new_store
from tests.sweeps import (
    ALL_DRAFTS,
    COARSE_TIMING,
    SMOKE,
    assert_cells_once,
    assert_tracked_once,
    finished_drafts,
    run_cli,
    smoke_command,
)
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration
SECRET = "hf_specrayFAKEsecret0123456789abcdefXYZ"  # must never be written anywhere
OFFLINE_DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1"]
OFFLINE = ("distill.paradigms=[offline]",)  # fewer drafts where the fault is not in distillation
# what a client of a server killed mid-run sees, depending on where the kill lands
# (specray/tracking/errors.py)
DYING_SERVER = (
    "connection refused",
    "connection reset",
    "connection closed",
    "connection aborted",
    "answer cut short",
)


def _files_containing(folder: Path, needle: bytes) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


def _ray_session_logs(since: float) -> list[Path]:
    """The logs of every local Ray session started after `since`: the run's own and any other begun
    meanwhile (`session_latest` names only the newest), so the check is at least as strict as one over the
    run's own."""
    sessions = [p for p in Path("/tmp/ray").glob("session_2*") if p.is_dir() and p.stat().st_mtime >= since]
    return [p / "logs" for p in sessions if (p / "logs").is_dir()]


def _one_error_and_resume_hint(result: subprocess.CompletedProcess, *needles: str) -> str:
    """The one `error: ` line, after checking that it holds every needle and is followed by the resume
    command."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-3000:]
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert "resume with:" in result.stderr and "specray run" in result.stderr.split("resume with:")[1]
    print(result.stderr[result.stderr.index("error: ") :])  # shown with pytest -s (docs/RELIABILITY.md)
    return errors[0]


def test_killed_teacher_eval_and_train_processes_do_not_stop_the_sweep(tmp_path: Path) -> None:
    faults = tmp_path / "faults"
    overrides = ["teacher.seed=101", COARSE_TIMING]  # shards of their own: the teacher really generates
    uri = new_store(tmp_path)
    env = {
        FAULTS_ENV: "teacher.batch=2,eval.cell=3,train.step=4",
        FAULTS_DIR_ENV: str(faults),
        "HF_TOKEN": SECRET,
    }
    started = time.time()
    result = run_cli(smoke_command(tmp_path, uri, *overrides), tmp_path, **env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in faults.iterdir()) == ["eval.cell", "teacher.batch", "train.step"]

    # every teacher row exactly once, in complete shards (no part or temp file left)
    spec = load_spec(SMOKE, [f"output_dir={tmp_path}", *overrides])
    for key in train_shard_keys(spec).values():
        ids = read_shard(key).column("prompt_id").to_pylist()
        assert len(ids) == len(set(ids)) == spec.data.train_size
        assert sorted(p.name for p in shard_dir(key).iterdir()) == [MANIFEST_FILE, SHARD_FILE]
    # the killed trainer resumed from its step-4 checkpoint; every draft finished once
    drafts = finished_drafts(tmp_path)
    assert len(drafts) == 4
    resumed = [
        json.loads((tmp_path / "smoke" / "drafts" / name / FINISHED_FILE).read_text())["resumed_from"]
        for name in drafts
    ]
    assert sorted(resumed) == [[], [], [], [4]]
    assert_cells_once(tmp_path, ALL_DRAFTS)
    assert_tracked_once(uri, ALL_DRAFTS)

    # the token was in the environment of every process; it is in nothing they wrote
    needle = SECRET.encode()
    assert SECRET not in result.stdout + result.stderr
    assert _files_containing(tmp_path, needle) == []  # outputs, mlflow.db, artifacts (./mlruns)
    cache = Path(os.environ["SPECRAY_CACHE"])
    assert _files_containing(cache, needle) == []
    logs = _ray_session_logs(started)
    assert logs and all(_files_containing(folder, needle) == [] for folder in logs)


# ---------------------------------------------------------------- a read-only output folder


def _read_only_wrapper(folder: Path) -> list[str]:
    """A command prefix under which `folder` is read-only. Root ignores permission bits, so as root the
    command runs in its own user + mount namespace with `folder` bind-mounted read-only."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return []
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root without user namespaces (unshare -rm): cannot make a folder read-only")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    return ["unshare", "-rm", "sh", "-c", script, str(folder)]


def test_read_only_output_dir_is_refused_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    wrapper = _read_only_wrapper(out)
    result = run_cli([*wrapper, *smoke_command(out, f"sqlite:///{tmp_path / 'mlflow.db'}")], tmp_path)
    out.chmod(0o755)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: output_dir: cannot write to {out / 'smoke'} (")
    assert "output_dir=PATH" in result.stderr
    assert not (tmp_path / "mlflow.db").exists()  # refused before MLflow (or Ray) was touched


# ---------------------------------------------------------------- MLflow unreachable


def test_unreachable_tracking_server_is_refused_before_any_work(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_cli(smoke_command(tmp_path, url), tmp_path, **QUIET)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"error: tracking.uri: no MLflow server answers at {url} (connection refused); start it "
        "(e.g. `mlflow server --host 127.0.0.1 --port PORT`) or use tracking.uri=sqlite:///mlflow.db"
    ]
    assert not (tmp_path / "smoke" / "drafts").exists()


# ---------------------------------------------------------------- two faults mid-run, one sweep


def _stopped_when_read_only(
    out: Path, command: list[str], cwd: Path, **env: str
) -> subprocess.CompletedProcess:
    """`command` run until it has finished a draft, then `out` turned read-only under it."""
    marker = f"{out}/smoke/drafts/*/{FINISHED_FILE}"
    if os.geteuid() == 0:
        _read_only_wrapper(out)  # skips without user namespaces
        # in a namespace of its own: run the sweep, and once a draft is finished remount `out` read-only
        script = (
            'mount --bind "$0" "$0" && { "$@" & pid=$!; '
            f"while ! ls {marker} >/dev/null 2>&1 && kill -0 $pid 2>/dev/null; do sleep 0.5; done; "
            # a remount fails (EBUSY) while a file in `out` is open for writing: retry until one succeeds
            'until mount -o remount,bind,ro "$0" 2>/dev/null; do kill -0 $pid 2>/dev/null || break; '
            "sleep 0.1; done; wait $pid; }"
        )
        return run_cli(["unshare", "-rm", "sh", "-c", script, str(out), *command], cwd, **env)
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **env}
    )
    wait_until(lambda: finished_drafts(out) or process.poll() is not None, "a finished draft")
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        folder.chmod(0o555)
    stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    for folder in [out, *(p for p in out.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return subprocess.CompletedProcess(command, process.returncode, stdout.decode(), stderr.decode())


def _saved_work(out: Path) -> set[Path]:
    """The finished drafts' markers and the cell records under `out`."""
    smoke = out / "smoke"
    return {*smoke.glob(f"drafts/*/{FINISHED_FILE}"), *smoke.glob("cells/*.json")}


def test_a_read_only_output_dir_then_a_dying_tracking_server_stop_cleanly_and_resume(tmp_path: Path) -> None:
    """One sweep, tracking to a real MLflow server, stopped twice: its output folder turns read-only once
    a draft is finished; resumed, its server is killed once it has saved work of its own; resumed again
    once the server is back, it finishes with every cell and run exactly once."""
    server = mlflow_server(tmp_path / "server")
    out = tmp_path / "out"
    out.mkdir()
    command = smoke_command(out, server.url, *OFFLINE, COARSE_TIMING)
    # MLflow's client retries a refused connection for minutes by default (riding out short outages);
    # here the outage is permanent, so fail on the first failed request
    fail_fast = {**QUIET, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    try:
        stopped = _stopped_when_read_only(out, command, tmp_path, **fail_fast)
        _one_error_and_resume_hint(stopped, str(out))
        assert any(word in stopped.stderr for word in ("Read-only file system", "Permission denied"))

        saved = _saved_work(out)
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **fail_fast},
        )
        wait_until(lambda: _saved_work(out) - saved or process.poll() is not None, "work saved by the resume")
        server.stop(signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
        stopped = subprocess.CompletedProcess(command, process.returncode, stdout.decode(), stderr.decode())
        # what the client sees depends on where the kill lands: no request in flight (refused), one in
        # flight (reset or closed), an upload in progress (aborted), an answer being written (cut short);
        # each is the same one line
        error = _one_error_and_resume_hint(stopped, f"error: MLflow at {server.url} stopped answering (")
        assert error.split(" stopped answering ")[1] in {f"({reason})" for reason in DYING_SERVER}, error

        server.start()  # same port, same store
        resumed = run_cli(command, tmp_path, **QUIET)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert "(resumed)" in resumed.stdout
        assert_cells_once(out, OFFLINE_DRAFTS)
        assert_tracked_once(server.url, OFFLINE_DRAFTS)
        assert not list(out.rglob(".specray-write-check-*"))
    finally:
        server.stop()
        shutil.rmtree(tmp_path / "server" / "artifacts", ignore_errors=True)


# ---------------------------------------------------------------- Ctrl-C


def test_ctrl_c_mid_run_says_where_the_work_is_and_how_to_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = smoke_command(out, new_store(tmp_path), *OFFLINE)
    # a terminal's Ctrl-C: SIGINT to the whole foreground process group (the driver and the Ray it started).
    # A foreground command takes SIGINT; one started in the background by a shell without job control
    # (`cmd &` in a script, as CI may run this suite) inherits it ignored, and Python then never installs
    # its handler: the driver would run to the end. So the driver starts with SIGINT's default, as in a
    # terminal, whatever this process was started with.
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    drafts = out / "smoke" / "drafts"
    wait_until(lambda: process.poll() is not None or any(drafts.glob(".*.work")), "distillation to start")
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
    text = stderr.decode()
    assert process.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "\ninterrupted\n" in text
    assert f"Finished work is kept under {out / 'smoke'}" in text and "resume with:\n  specray run " in text
