"""The one way specray writes a file it may read back: a temporary name beside the target, fsync, rename.

A crash at any point leaves either the old file or the new one under the real name, never half of one;
temporaries start with "." so globs for results never see them.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on a temporary path beside `path`, fsync it, then rename it to `path` (what
    `write` returns, such as `Path.write_text`'s count, is ignored)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        write(tmp)
        with open(tmp, "rb+") as f:  # the data must be on disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, payload: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(payload, indent=indent, sort_keys=True))
