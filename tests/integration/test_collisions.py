"""Two `specray run` on one output folder, through the real CLI with real Ray and MLflow: the second is
refused before any work, naming the holder; the first completes alone; a holder killed with SIGKILL leaves
no lock behind. Then damaged files in the folder: a draft whose weights were cut short is trained again (the
damaged folder kept aside) and a cell record cut mid-write is computed again, each with its reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from specray.locks import FOLDER_LOCK
from tests.sweeps import ALL_DRAFTS, assert_tracked_once, run_cli, smoke_command
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    # its own session, so the whole tree (the driver and the Ray it starts) can be killed at once
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _held_by(lock: Path, process: subprocess.Popen) -> bool:
    """Whether `process` holds the folder by now (or has ended, which the caller then sees)."""
    if process.poll() is not None:
        return True
    try:
        return json.loads(lock.read_text())["pid"] == process.pid
    except (OSError, ValueError, KeyError):
        return False


def test_a_second_run_on_a_held_folder_is_refused_and_a_killed_holder_frees_it(tmp_path: Path) -> None:
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    lock = out / "smoke" / FOLDER_LOCK
    first = _start(smoke_command(out, uri), tmp_path)
    wait_until(lambda: _held_by(lock, first), "the first run to hold its output folder")
    assert first.poll() is None, first.communicate()[1][-3000:]

    second = run_cli(smoke_command(out, uri), tmp_path)
    assert second.returncode == 2, second.stderr[-3000:]
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"is in use by pid {first.pid} on " in lines[0], second.stderr[-3000:]
    assert "Traceback" not in second.stderr

    _, stderr = first.communicate(timeout=CLI_TIMEOUT_S)
    assert first.returncode == 0, stderr[-3000:]
    assert len(list((out / "smoke" / "cells").glob("*.json"))) == 30
    assert_tracked_once(uri, ALL_DRAFTS)  # one parent run, each draft's child once

    third = _start(smoke_command(out, uri), tmp_path)
    wait_until(lambda: _held_by(lock, third), "the third run to hold its output folder")
    if third.poll() is None:
        os.killpg(third.pid, signal.SIGKILL)
    third.wait()

    # damaged files: a draft's weights cut short after it was published, a cell record cut mid-write
    draft = out / "smoke" / "drafts" / "offline__tau_kd=0"
    weights = draft / "model.safetensors"
    half = weights.stat().st_size // 2
    weights.write_bytes(weights.read_bytes()[:half])
    cell = sorted((out / "smoke" / "cells").glob("*.json"))[0]
    cell.write_text(cell.read_text()[:40])

    fourth = run_cli(smoke_command(out, uri), tmp_path)  # the dead holder's lock went with it
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "is in use by" not in fourth.stderr
    plan = fourth.stdout + fourth.stderr
    assert "1 to compute (retrain (weights differ from finished.json))" in plan, plan[-3000:]
    assert "1 to compute (unreadable (truncated or corrupt))" in plan, plan[-3000:]
    aside = list(draft.parent.glob("offline__tau_kd=0.damaged-*"))
    assert len(aside) == 1 and (aside[0] / "model.safetensors").stat().st_size == half
    assert (draft / "finished.json").exists() and len(list((out / "smoke" / "cells").glob("*.json"))) == 30
