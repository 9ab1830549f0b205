"""Who may write where: one run per output folder, one producer per cache entry.

Both use the operating system's advisory file lock (`fcntl.flock`) on a small lock file. The kernel drops
the lock when its holder's process ends, however it ends (exit, crash, `kill -9`), so a lock left behind by
a dead run is never an obstacle: there is no stale-lock cleanup to get wrong. A lock file outlives its
holder and only says who held it last (host, pid, start time, command), for the message a waiting or
refused process prints.

Why not a lease file with a heartbeat: it needs a clock, a renewal thread and a timeout after which a
holder is presumed dead (and a slow holder then loses its lease mid-write); flock needs none of that.
Its limit: on a network filesystem flock works only where the filesystem forwards it to a lock manager
(NFSv4, or NFSv3 with lockd; Lustre and GPFS with their lock options); elsewhere it may lock only per
machine. docs/RELIABILITY.md says so.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

from specray.errors import SpecError

log = logging.getLogger(__name__)

FOLDER_LOCK = ".specray.lock"
WAIT_NOTE_EVERY_S = 30.0  # how often a waiting producer repeats what it waits for


class FolderInUse(SpecError):
    """Another live process holds the output folder; the message names it and what to do."""


def _holder(lock: IO[str]) -> str:
    """Who holds (or last held) the lock, from what its holder wrote into the file."""
    lock.seek(0)
    try:
        info = json.loads(lock.read() or "{}")
    except json.JSONDecodeError:
        info = {}
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} (since {started}: {info.get('command')})"


def _write_holder(path: Path) -> None:
    """Say who holds the lock. Written through its own short-lived handle: the lock itself is held on a
    read-only one, because a file open for writing for a whole run would keep its filesystem from being
    remounted read-only (and a run must then fail cleanly, as on any read-only folder)."""
    info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    info["command"] = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
    path.write_text(json.dumps(info), encoding="utf-8")


def _open_lock(path: Path) -> IO[str]:
    path.touch(exist_ok=True)
    return open(path, encoding="utf-8")  # flock needs no write access


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextmanager
def output_folder(folder: Path) -> Iterator[None]:
    """Hold `folder` for this run, or raise FolderInUse at once if a live process holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    with _open_lock(folder / FOLDER_LOCK) as lock:
        if not _try_lock(lock):
            raise FolderInUse(
                f"{folder} is in use by {_holder(lock)}; wait for that run to end (or stop it), "
                "or give this one another output_dir=PATH"
            )
        _write_holder(folder / FOLDER_LOCK)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def entry_lock_path(entry: Path) -> Path:
    """The lock file of a cache entry: a hidden sibling of the entry's folder or file."""
    return entry.with_name(f".{entry.name}.lock")


@contextmanager
def producing(entries: Sequence[Path], what: str, note: Callable[[str], None] = log.info) -> Iterator[None]:
    """Be the one producer of `entries` (cache entries, by their final paths): wait while another process
    produces any of them, saying on what. The caller then checks again whether each entry exists (the
    other producer may have finished it) before producing it. Locks are taken in path order, so two
    producers that need overlapping entries cannot wait on each other."""
    with ExitStack() as stack:
        for entry in sorted(set(entries)):
            entry.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(_open_lock(entry_lock_path(entry)))
            _wait_for(lock, f"{what} ({entry})", note)
            _write_holder(entry_lock_path(entry))
            stack.callback(fcntl.flock, lock.fileno(), fcntl.LOCK_UN)
        yield


def _wait_for(lock: IO[str], what: str, note: Callable[[str], None]) -> None:
    noted = float("-inf")
    while not _try_lock(lock):
        if time.monotonic() - noted >= WAIT_NOTE_EVERY_S:
            note(f"waiting: {_holder(lock)} is producing {what}; it will be reused when done")
            noted = time.monotonic()
        time.sleep(0.2)
