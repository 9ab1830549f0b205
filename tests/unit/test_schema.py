"""`specray schema`: the committed copy editors read is current, every shipped sweep points at it and passes
it, and it catches what an editor should flag (an unknown setting, a value outside the allowed ones)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from specray.cli import app
from specray.cli.schema import schema_text, sweep_schema
from tests.conftest import REPO

COPY = REPO / "docs" / "schema" / "sweep.schema.json"
SWEEPS = sorted((REPO / "sweeps").glob("*.yaml"))
FIRST_LINE = "# yaml-language-server: $schema=../docs/schema/sweep.schema.json"


def test_the_committed_schema_is_what_the_command_writes() -> None:
    assert COPY.read_text() == schema_text(), "regenerate: specray schema -o docs/schema/sweep.schema.json"
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0 and json.loads(result.output)["title"] == "specray sweep"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_shipped_sweep_points_editors_at_the_schema_and_passes_it(path) -> None:
    assert path.read_text().splitlines()[0] == FIRST_LINE
    jsonschema.validate(yaml.safe_load(path.read_text()), sweep_schema())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s["eval"].update(gama=3), "'gama' was unexpected"),
        (lambda s: s["distill"].update(divergence="kl"), "'kl'"),
        (lambda s: s["teacher"].update(engine="sglang"), "'sglang'"),
    ],
)
def test_the_schema_flags_an_unknown_setting_or_value(edit, message) -> None:
    sweep = yaml.safe_load((REPO / "sweeps" / "tiny.yaml").read_text())
    edit(sweep)
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(sweep, sweep_schema())
