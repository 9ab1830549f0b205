"""Fault injection itself (specray/faults.py): parsing, firing once, and a real SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specray.errors import SpecError
from specray.faults import FAULTS_DIR_ENV, FAULTS_ENV, Faults


def test_unset_means_nothing_is_armed() -> None:
    faults = Faults.from_env({})
    assert faults.armed == {} and not faults.due("teacher.batch", 10**6)


def test_parsing(tmp_path: Path) -> None:
    env = {FAULTS_ENV: "teacher.batch=2, train.step=4", FAULTS_DIR_ENV: str(tmp_path / "f")}
    faults = Faults.from_env(env)
    assert faults.armed == {"teacher.batch": 2, "train.step": 4} and (tmp_path / "f").is_dir()
    assert [faults.due("teacher.batch", n) for n in (1, 2, 3)] == [False, True, True]
    assert not faults.due("eval.cell", 100)


@pytest.mark.parametrize("value", ["teacher.batch", "teacher.batch=0", "nowhere=1", "eval.cell=x"])
def test_bad_values_are_refused_naming_the_variable(tmp_path: Path, value: str) -> None:
    with pytest.raises(SpecError, match=rf"{FAULTS_ENV}: .* is not POINT=N with N >= 1; points: teacher"):
        Faults.from_env({FAULTS_ENV: value, FAULTS_DIR_ENV: str(tmp_path)})


def test_a_marker_folder_is_required() -> None:
    with pytest.raises(SpecError, match=FAULTS_DIR_ENV):
        Faults.from_env({FAULTS_ENV: "eval.cell=1"})


def test_a_fault_kills_its_process_once(tmp_path: Path) -> None:
    script = (
        "from specray.faults import Faults\n"
        f"faults = Faults({{'eval.cell': 2}}, {str(tmp_path)!r})\n"
        "for n in range(1, 4):\n"
        "    faults.check('eval.cell', n)\n"
        "    print(n, flush=True)\n"
    )
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert first.returncode == -signal.SIGKILL and first.stdout.split() == ["1"]
    assert (tmp_path / "eval.cell").read_text().strip().isdigit()  # the pid of the killed process
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.split() == ["1", "2", "3"]  # fired already: a restart lives
