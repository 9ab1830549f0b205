"""scripts/fetch_data.sh: every file the shipped sweeps read by relative path lands where they read it,
folders made as needed, a cut download leaves no file behind, and files already there are kept. `curl` is
replaced by a stub on PATH (no network in tests)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "fetch_data.sh"
STUB = """#!/bin/sh
# curl -fsSL --retry 3 -o PATH URL: writes URL into PATH; with FAIL set, GSM8K's download fails
while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done
case "$1" in *grade-school-math*) [ -n "$FAIL" ] && exit 22;; esac
echo "$1" > "$out"
"""


def fetched_paths() -> list[str]:
    """The relative paths the script fetches, from its `fetch PATH URL` lines."""
    return re.findall(r"^fetch (\S+) https://", SCRIPT.read_text(), flags=re.MULTILINE)


def run(dest: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "curl").write_text(STUB)
    (bin_dir / "curl").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", str(SCRIPT), str(dest)],
        env={**os.environ, "PATH": path, **env},
        capture_output=True,
        text=True,
    )


def read_by_sweeps() -> set[str]:
    """Every `data/...` path the shipped sweeps and configs name, relative to data/."""
    files = [*(REPO / "sweeps").glob("*.yaml"), *(REPO / "configs").rglob("*.yaml")]
    return {m for f in files for m in re.findall(r"path: data/(\S+?)[,}\s]", f.read_text())}


def test_every_file_lands_where_the_sweeps_read_it(tmp_path) -> None:
    assert read_by_sweeps() >= {"gsm8k/train.jsonl", "self_instruct/seed_tasks.jsonl"}  # the reader reads
    assert set(fetched_paths()) == read_by_sweeps()
    result = run(tmp_path / "deep" / "data", tmp_path)
    assert result.returncode == 0, result.stderr
    for relative in fetched_paths():
        assert (tmp_path / "deep" / "data" / relative).read_text().startswith("https://")
    again = run(tmp_path / "deep" / "data", tmp_path)
    assert again.stdout.count("already there") == len(fetched_paths())


def test_a_failed_download_leaves_no_file_and_fails(tmp_path) -> None:
    result = run(tmp_path / "data", tmp_path, FAIL="1")
    assert result.returncode != 0
    assert not (tmp_path / "data" / "gsm8k" / "test.jsonl").exists()
