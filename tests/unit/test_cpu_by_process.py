"""scripts/cpu_by_process.py: what a process is, from its command line; and the CPU a command's processes
used, summed by kind, with what ran before it left out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_infra import load_script

CPU = load_script("cpu_by_process")
SCRIPT = Path(CPU.__file__)


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (["ray::EvalWorker.evaluate"], "ray::EvalWorker"),
        (["ray::TrainController.run", ""], "ray::TrainController"),
        (["ray::IDLE"], "ray::IDLE"),
        (["/v/bin/python", "/v/lib/ray/_private/workers/default_worker.py", "--node-id=1"], "ray::IDLE"),
        (["/v/lib/ray/core/src/ray/raylet/raylet", "--raylet_socket_name=x"], "raylet"),
        (["/v/bin/python", "-u", "/v/lib/ray/dashboard/agent.py", "--node-id=1"], "dashboard agent"),
        (["/v/bin/python", "/v/bin/specray", "run", "sweeps/smoke.yaml"], "specray run"),
        (["/v/bin/specray", "tune", "sweeps/smoke.yaml"], "specray tune"),
        (["/v/bin/python", "-m", "benchmarks.teacher.pool", "--quick"], "benchmarks.teacher.pool"),
        (["/v/bin/python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"], "pytest worker"),
        (["/v/bin/python", "-m", "mlflow", "server", "--port", "5000"], "mlflow server"),
        (["/v/bin/python", "/v/bin/pytest", "-q", "-m", "integration"], "pytest"),
        (["/v/bin/python", "/tmp/pytest-of-root/pytest-1/test_x0/child.py"], "python"),
        (["/usr/bin/make", "test"], "make"),
        ([], "[kworker/0:1]"),
    ],
)
def test_a_process_is_known_by_what_it_runs(cmdline: list[str], expected: str) -> None:
    assert CPU.kind(cmdline, "kworker/0:1") == expected


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (["ray::IDLE", "ray::EvalWorker", "ray::IDLE"], "ray::EvalWorker"),  # idle again between calls
        (["specray run", "[python]"], "specray run"),  # exited, not yet reaped: no command line
        (["bash", "specray run"], "specray run"),  # exec'd
        (["[kworker/0:1]", "[kworker/0:1]"], "[kworker/0:1]"),
        (["ray::IDLE"], "ray::IDLE"),
    ],
)
def test_a_process_keeps_the_kind_that_tells_most(seen: list[str], expected: str) -> None:
    kind = None
    for now in seen:
        kind = CPU.telling(kind, now)
    assert kind == expected


def test_a_commands_cpu_is_counted_by_kind(tmp_path: Path) -> None:
    """A child that burns 0.5 CPU s, then sleeps (so a sample sees all of it), under a name of its own: its
    kind holds at least that."""
    burn = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(1.0)"
    child = tmp_path / "burner.py"
    child.write_text(burn)
    out = tmp_path / "cpu.json"
    named = ["bash", "-c", f'exec -a burner "{sys.executable}" "{child}"']  # its command line: burner ...
    command = [sys.executable, str(SCRIPT), "--every", "0.1", "--json", str(out), "--", *named]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    table = json.loads(out.read_text())
    assert table["burner"]["cpu_s"] >= 0.4 and table["burner"]["processes"] == 1, table
    assert "exit 0" in result.stdout.splitlines()[0]
    rows = [line.split() for line in result.stdout.splitlines()[2:]]
    assert any(row[1] == "1" and row[3:] == ["burner"] for row in rows), result.stdout


def test_the_commands_exit_status_is_its_own(tmp_path: Path) -> None:
    exits = [sys.executable, "-c", "raise SystemExit(3)"]
    command = [sys.executable, str(SCRIPT), "--every", "0.1", "--", *exits]
    assert subprocess.run(command, capture_output=True, timeout=120).returncode == 3
