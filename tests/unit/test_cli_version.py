"""`specray --version`: the package version, the commit of the checkout that runs, the format version."""

from __future__ import annotations

import re
import subprocess

from typer.testing import CliRunner

import specray
from specray import keys
from specray.cli import app
from specray.cli.provenance import git_commit
from tests.conftest import REPO


def test_version_names_the_package_the_commit_and_the_format_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    first, formats = result.output.splitlines()
    assert first.startswith(f"specray {specray.__version__} (commit ")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=7", "HEAD"], capture_output=True)
    if head.returncode == 0:  # a checkout: the commit is its own
        assert head.stdout.decode().strip() in first
    assert re.findall(r"FORMAT_VERSION (\d+)", formats) == [str(keys.FORMAT_VERSION)]


def test_outside_a_checkout_the_commit_is_unknown(tmp_path) -> None:
    assert git_commit(tmp_path) is None
