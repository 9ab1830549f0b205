"""One progress display for a whole sweep: a bar per stage (units done, elapsed, ETA) and, per stage,
its wall time and the machine's peak memory in use (read from /proc/meminfo, so Ray workers count too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

MEMINFO = Path("/proc/meminfo")


def memory_in_use_gib() -> float:
    """MemTotal − MemAvailable, in GiB (0 where /proc/meminfo does not exist)."""
    if not MEMINFO.exists():
        return 0.0
    fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
    kib = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
    return kib / 2**20


class SweepDisplay:
    """`with display.stage(name, total): ... display.advance()`; `summary` has seconds and peak GiB."""

    def __init__(self, enabled: bool = True, interval_s: float = 0.5):
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.summary: dict[str, dict[str, float]] = {}
        self._task = None
        self._peak = 0.0
        self._interval = interval_s
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self._interval):
            self._peak = max(self._peak, memory_in_use_gib())

    def __enter__(self) -> SweepDisplay:
        self.progress.start()
        self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.progress.stop()

    @contextmanager
    def stage(self, name: str, total: int) -> Iterator[None]:
        self._task = self.progress.add_task(name, total=max(total, 1))
        self._peak = memory_in_use_gib()
        started = time.perf_counter()
        yield
        self.progress.update(self._task, completed=max(total, 1))
        self.summary[name] = {
            "seconds": round(time.perf_counter() - started, 1),
            "peak_gib": round(self._peak, 2),
        }

    def advance(self, units: int = 1) -> None:
        if self._task is not None:
            self.progress.advance(self._task, units)
