"""docs/sweeps.md's spec reference names every field of a sweep spec, at every depth, so a new setting
cannot go undocumented. Run `specray validate SWEEP` to see each field's value; config.py has its limits."""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator

from pydantic import BaseModel

from specray.config import SweepSpec
from tests.conftest import REPO

REFERENCE = (REPO / "docs" / "sweeps.md").read_text().split("## The spec reference", 1)[1]


def _models_in(annotation: object) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def field_paths(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field of `model` and of the models its fields hold, as dotted paths."""
    for name, info in model.model_fields.items():
        yield prefix + name
        for inner in _models_in(info.annotation):
            yield from field_paths(inner, f"{prefix}{name}.")


def test_the_spec_reference_names_every_field() -> None:
    named = set(re.findall(r"`([a-z_0-9]+)`", REFERENCE))
    paths = list(field_paths(SweepSpec))
    assert len(paths) > 100
    assert [path for path in paths if path.rsplit(".", 1)[-1] not in named] == []
