"""The real `specray` CLI, run as a subprocess the way a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specray.config import load_raw
from tests.conftest import REPO
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
SPECRAY = str(Path(sys.executable).parent / "specray")


def specray(*args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache is not None:
        env["SPECRAY_CACHE"] = str(cache)
    return subprocess.run(
        [SPECRAY, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def test_help_lists_only_implemented_commands() -> None:
    """Every listed command has help text and its own --help works (no placeholders)."""
    import re

    from specray.cli import app

    result = specray("--help")
    assert result.returncode == 0
    listed = set(re.findall(r"^│ ([a-z][a-z-]*)\s{2,}\S", result.stdout, flags=re.M))
    commands = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    registered = commands | {g.name for g in app.registered_groups}
    assert listed == registered
    assert {"validate", "zoo", "data", "generate", "distill", "evaluate", "run", "report"} <= listed
    for command in listed:
        assert specray(command, "--help").returncode == 0, command


def test_validate_prints_the_resolved_spec() -> None:
    result = specray("validate", "sweeps/tiny.yaml", "eval.gamma=6")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    assert resolved["name"] == "tiny"
    assert resolved["eval"]["gamma"] == [6]  # one γ or a list: resolved as a list
    assert resolved["models"]["zoo"]["target"]["num_layers"] == 6  # defaults filled in
    assert len(resolved["teacher"]["temperatures"]) == 11


def test_validate_bad_field_exits_nonzero_with_the_field_path(tmp_path: Path) -> None:
    raw = load_raw(REPO / "sweeps" / "smoke.yaml")
    raw["eval"]["gamma"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    result = specray("validate", str(bad))
    assert result.returncode == 2
    assert "eval.gamma" in result.stderr and "greater than or equal to 1" in result.stderr
    assert "Traceback" not in result.stderr

    result = specray("validate", "sweeps/smoke.yaml", "distill.divergence=kl")
    assert result.returncode == 2
    assert "distill.divergence: Input should be 'fkl', 'rkl', 'jsd' or 'tvd'" in result.stderr


def test_zoo_build_then_cache_hit(tmp_path: Path) -> None:
    first = specray("zoo", "build", "--spec", "sweeps/smoke.yaml", "--samples", "1", cache=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "zoo built" in first.stdout and "target samples at τ=1.0" in first.stdout
    second = specray("zoo", "build", "--spec", "sweeps/smoke.yaml", "--samples", "0", cache=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "zoo cache hit" in second.stdout
    assert len([p for p in (tmp_path / "zoo").iterdir() if not p.name.endswith(".lock")]) == 1  # one zoo


def test_data_show_and_missing_data_file(tmp_path: Path) -> None:
    result = specray("data", "show", "sweeps/smoke.yaml")
    assert result.returncode == 0, result.stderr
    assert "out_of_domain_test: 16 examples; families: {'word_problem': 16}" in result.stdout
    missing = specray(
        "data", "show", "sweeps/smoke.yaml", "data.out_of_domain={kind: gsm8k, path: /nonexistent/test.jsonl}"
    )
    assert missing.returncode == 2
    assert "/nonexistent/test.jsonl" in missing.stderr and "Traceback" not in missing.stderr
