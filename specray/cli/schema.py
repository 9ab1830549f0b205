"""`specray schema`: the sweep spec's JSON Schema, for editors.

The schema is pydantic's own (`SweepSpec.model_json_schema()`), loosened in two ways an editor needs and
`specray validate` does not: every mapping may hold `include:` (a reusable part from `configs/`, merged
before validation), and no field is required (an included part may supply it). It describes the fields,
their types, defaults and allowed values; whether a spec is valid stays `specray validate`'s answer, which
also applies the cross-field checks a schema cannot express. The shipped sweeps point editors at the copy
in docs/ with a `# yaml-language-server: $schema=...` first line; `tests/unit/test_schema.py` keeps that
copy equal to what this command writes.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel

from specray.cli.common import app

INCLUDE = {"type": "string", "description": "A YAML file whose keys this mapping starts from (configs/...)."}


def sweep_schema() -> dict[str, Any]:
    """The JSON Schema of a sweep file as an editor should check it."""
    from specray.config import SweepSpec

    schema = SweepSpec.model_json_schema()
    scalars = _fields_taking_one_value(SweepSpec)
    for name, node in [("SweepSpec", schema), *schema.get("$defs", {}).items()]:
        _loosen(node, scalars.get(name, set()))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "specray sweep"
    return schema


def _loosen(node: dict[str, Any], one_value: set[str]) -> None:
    """`include:` everywhere, nothing required, and a list field that also takes one value says so."""
    properties = node.get("properties", {})
    for field in one_value & set(properties):
        listed = properties[field]
        if listed.get("type") == "array":
            keep = {k: listed.pop(k) for k in ("default", "description", "title") if k in listed}
            properties[field] = {"anyOf": [listed["items"], listed], **keep}
    if "properties" in node:
        properties.setdefault("include", INCLUDE)
    node.pop("required", None)


def _fields_taking_one_value(model: type[BaseModel]) -> dict[str, set[str]]:
    """Per model (by its schema name) the list fields a `mode="before"` validator also fills from one
    value (`eval.gamma: 4`), for every model reachable from `model`."""
    found: dict[str, set[str]] = {}
    todo, seen = [model], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        validators = current.__pydantic_decorators__.field_validators.values()
        found[current.__name__] = {f for v in validators if v.info.mode == "before" for f in v.info.fields}
        for info in current.model_fields.values():
            todo += _models_in(info.annotation)
    return found


def _models_in(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for argument in typing.get_args(annotation) for m in _models_in(argument)]


def schema_text() -> str:
    return json.dumps(sweep_schema(), indent=2, ensure_ascii=False, sort_keys=True) + "\n"


@app.command()
def schema(
    output: Path | None = typer.Option(None, "--output", "-o", help="Write it here instead of stdout."),
) -> None:
    """Print the JSON Schema of a sweep file (for editors: completion, types, allowed values)."""
    if output is None:
        typer.echo(schema_text(), nl=False)
        return
    output.write_text(schema_text())
    typer.echo(f"wrote {output}")
