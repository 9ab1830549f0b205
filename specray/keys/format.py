"""The one format version of every key and record, and the hash that keys are made with.

`FORMAT_VERSION` is in every key (`digest`) and in every record and marker a sweep writes (cell records,
drafts' `finished.json`, draft records): a change to what any key holds or to what any record holds bumps
this one number, and everything written under another number is recomputed, never read with fields
guessed. A reader that meets such a file says so in one line (`older_format_line`) and recomputes it; the
road not taken was one number per kind of record with readers that default what older writers lacked —
nobody could tell what a key held without reading every branch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

FORMAT_VERSION = 2  # bump when a key's recipe or a record's fields change: nothing older is reused
FORMAT = "format"  # the field of a record or marker that names the format it was written in


class OlderFormat(ValueError):
    """A record, marker or draft written by another format of specray: it is recomputed, not read."""


def check_format(payload: Mapping[str, Any], cls: type) -> dict[str, Any]:
    """`payload`'s fields of the dataclass `cls`, when it was written in this format with every field;
    OlderFormat otherwise (a missing field means an older writer, never a default)."""
    if payload.get(FORMAT) != FORMAT_VERSION:
        raise OlderFormat(f"format {payload.get(FORMAT, '(none)')}, not {FORMAT_VERSION}")
    names = {f.name for f in fields(cls)}
    missing = sorted(names - payload.keys())
    if missing:
        raise OlderFormat(f"lacks {', '.join(missing)}")
    return {k: v for k, v in payload.items() if k in names}


def older_format_line(path: Path | str, what: str = "recomputed") -> str:
    """The one line a user reads when a cached result or output of an older format is met."""
    return f"{path}: written by an older specray format (this one writes format {FORMAT_VERSION}); {what}"


def digest(inputs: Mapping[str, Any], length: int = 20) -> str:
    """Stable hash of key inputs (sorted JSON; floats as Python prints them)."""
    payload = json.dumps({**inputs, FORMAT: FORMAT_VERSION}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 3) -> str:
    """`eval.gamma 3 → 6, distill.divergence fkl → tvd` for the inputs that differ ("new" if no old)."""
    if not old:
        return "new"
    changed = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    parts = [f"{key} {_short(old.get(key))} → {_short(new.get(key))}" for key in changed[:limit]]
    parts += [f"{len(changed) - limit} more"] if len(changed) > limit else []
    return ", ".join(parts) or "unchanged"


def _short(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str) and len(value) == 20 and all(c in "0123456789abcdef" for c in value):
        return value[:8]  # another key: its first characters are enough to see that it changed
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."
