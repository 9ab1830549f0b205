"""README.md's table of commands lists exactly the commands `specray --help` shows, subcommands included."""

from __future__ import annotations

import re

import typer

from specray.cli import app
from tests.conftest import REPO

TABLE = (REPO / "README.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]


def cli_commands() -> set[str]:
    """Every command path of the CLI: `run`, `zoo build`, `jobs list`, ..."""
    root = typer.main.get_command(app)
    paths = set()
    for name, command in root.commands.items():  # a group is whatever has commands of its own
        if hasattr(command, "commands"):
            paths |= {f"{name} {sub}" for sub in command.commands}
        else:
            paths.add(name)
    return paths


def table_commands() -> set[str]:
    """The command paths the README's table names; `jobs list\\|status` names two."""
    paths = set()
    for first_cell in re.findall(r"^\| `specray ([^`]*)`", TABLE, flags=re.MULTILINE):
        words = first_cell.replace("\\|", "|").split()
        if len(words) > 1 and re.fullmatch(r"[a-z]+(\|[a-z]+)*", words[1]):
            paths |= {f"{words[0]} {sub}" for sub in words[1].split("|")}
        else:
            paths.add(words[0])
    return paths


def test_the_readme_lists_every_command() -> None:
    assert len(cli_commands()) >= 12
    assert table_commands() == cli_commands()
