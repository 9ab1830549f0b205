"""Where specray keeps files, and the one way it writes a file it may read back.

`cache_dir()` is the root of every cache (the zoo, teacher shards, target continuations), so a module that
needs a cached path imports this one and nothing heavier. Writes go to a temporary name beside the target,
are fsynced, then renamed: a crash at any point leaves either the old file or the new one under the real
name, never half of one; temporaries start with "." so globs for results never see them.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specray.errors import SpecError, describe_os_error

TMP_HEX = 8  # random hex digits in a temporary's name: `.<name>.<hex>.tmp`


def cache_dir() -> Path:
    """Root of specray's caches: $SPECRAY_CACHE, else $XDG_CACHE_HOME/specray, else ~/.cache/specray."""
    if os.environ.get("SPECRAY_CACHE"):
        return Path(os.environ["SPECRAY_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specray"


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on a temporary path beside `path`, fsync it, then rename it to `path` (what
    `write` returns, such as `Path.write_text`'s count, is ignored). A temporary of `path` that a writer
    killed before its rename left behind (SIGKILL runs no `finally`) is removed first: a file has one
    writer at a time (`specray/locks.py`: one run per output folder, one producer per cache entry), so
    no other writer's temporary of it can be in flight."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.{'?' * TMP_HEX}.tmp"):
        stale.unlink(missing_ok=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:TMP_HEX]}.tmp"
    try:
        write(tmp)
        with open(tmp, "rb+") as f:  # the data must be on disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def publish_folder(final: Path, write: Callable[[Path], object]) -> None:
    """Make the folder `final` whole or not at all: `write(tmp)` fills a temporary sibling, which then
    replaces `final` (a folder left there without its completion marker is removed first). Temporaries a
    killed writer left (`.<name>-*`) are removed before: call it as the entry's one producer
    (`locks.producing`), so no other writer's temporary can be in flight."""
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{glob.escape(final.name)}-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json(path: Path, payload: Any, indent: int | None = 1) -> None:
    write_text(path, json.dumps(payload, indent=indent, sort_keys=True))


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Create `folder` if needed and write (then remove) a probe file in it; a SpecError if that fails."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".specray-write-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"{what}: cannot write to {folder} ({describe_os_error(e)}); {fix}") from None
