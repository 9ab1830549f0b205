"""`specray --version`: the package version, the commit of the checkout that runs, every record format."""

from __future__ import annotations

import re
import subprocess

from typer.testing import CliRunner

import specray
from specray import keys
from specray.cli import app
from specray.cli.provenance import git_commit
from tests.conftest import REPO


def test_version_names_the_package_the_commit_and_every_record_format() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    first, formats = result.output.splitlines()
    assert first.startswith(f"specray {specray.__version__} (commit ")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True)
    if head.returncode == 0:  # a checkout: the commit is its own
        assert head.stdout.decode().strip() in first
    named = dict(re.findall(r"(\w+_FORMAT) (\d+)", formats))
    expected = {name: str(value) for name, value in vars(keys).items() if name.endswith("_FORMAT")}
    assert named == expected and len(named) >= 5


def test_outside_a_checkout_the_commit_is_unknown(tmp_path) -> None:
    assert git_commit(tmp_path) is None
