"""Loading a sweep: YAML with `include:` parts, `key=value` overrides, and one line per bad field."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from specray.config.base import LIST_TAG, ONE_TAG
from specray.config.sweep import SweepSpec
from specray.errors import SpecError


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: malformed YAML: {' '.join(str(e).split())}") from None


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _deep_merge(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(over)


def _resolve_includes(node: Any, here: Path, seen: tuple[Path, ...] = ()) -> Any:
    """Replace every `include: PATH` mapping key with the file's content, overridden by the sibling keys."""
    if isinstance(node, list):
        return [_resolve_includes(item, here, seen) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _resolve_includes(value, here, seen) for key, value in node.items()}
    if "include" not in node:
        return node
    include = str(node.pop("include"))
    candidates = [here.parent / include, Path(include)]
    target = next((c.resolve() for c in candidates if c.exists()), None)
    if target is None:
        raise SpecError(f"{here}: include {include!r} not found (looked in {here.parent} and {Path.cwd()})")
    if target in seen:
        raise SpecError(f"{here}: include cycle through {target}")
    part = _resolve_includes(_read_yaml(target), target, (*seen, target))
    if not isinstance(part, dict):
        raise SpecError(f"{target}: an included part must be a mapping, got {type(part).__name__}")
    return _deep_merge(part, node)


def _apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `dotted.key=value` override; the value is parsed as YAML (`3`, `[0.0, 0.5]`, `null`)."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise SpecError(f"override {override!r}: expected KEY=VALUE, e.g. eval.gamma=3")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(f"override {override!r}: {part!r} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError:
        raise SpecError(f"override {override!r}: value is not valid YAML") from None


def _allowed_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str] | None:
    """Field names allowed at `loc` (the parent of an unknown key), for the error message."""
    for part in loc:
        # a list index, or the tag pydantic puts in the path of a tagged union (distill.data_sources):
        # the item's model is already selected
        if isinstance(part, int) or part not in model.model_fields:
            continue
        annotation = model.model_fields[part].annotation
        # union members may be Annotated[Model, Tag(...)]: look inside those too
        candidates = [annotation, *(get_args(a)[0] if get_args(a) else a for a in get_args(annotation))]
        found = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if found is None:
            return None
        model = found
    return sorted(model.model_fields)


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem: `source: field.path: what is wrong (allowed: ...)`."""
    lines = []
    for item in error.errors():
        loc = [str(p) for p in item["loc"] if p not in (ONE_TAG, LIST_TAG)]
        path = ".".join(loc) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            allowed = _allowed_keys(SweepSpec, item["loc"][:-1])
            message = "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        elif "input" in item and not isinstance(item["input"], dict):
            message += f" (got {json.dumps(item['input'], default=str)})"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def load_raw(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The sweep as a plain dict with includes resolved and overrides applied (not yet validated)."""
    path = Path(path)
    raw = _resolve_includes(_read_yaml(path), path)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a sweep must be a YAML mapping, got {type(raw).__name__}")
    for override in overrides:
        _apply_override(raw, override)
    return raw


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Load, resolve and validate a sweep YAML; raises SpecError naming the file and every bad field."""
    raw = load_raw(path, overrides)
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, str(path))) from None


def validate_part(model: type[BaseModel], path: str | Path) -> BaseModel:
    """Validate one reusable part from `configs/` against its section model."""
    path = Path(path)
    raw = _resolve_includes(_read_yaml(path), path)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, str(path))) from None


def dump_spec(spec: SweepSpec) -> str:
    """The resolved spec as YAML (what `specray validate` prints and what runs save beside outputs)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
