"""One progress display for a whole sweep: per stage, units done, elapsed and ETA — a live bar per stage on
a terminal (rich), plain lines at a steady pace anywhere else (`specray.progress.LineMeter`: a log, a pipe,
a Ray job) — and, per stage, its wall time and the machine's peak memory in use (read from /proc/meminfo,
so Ray workers count too)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from specray.distill.progress import curve_note
from specray.progress import LineMeter, live_display, progress_console

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.distill.curves import CurvePoint

MEMINFO = Path("/proc/meminfo")


def memory_in_use_gib() -> float:
    """MemTotal − MemAvailable, in GiB (0 where /proc/meminfo does not exist)."""
    if not MEMINFO.exists():
        return 0.0
    fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
    kib = int(fields["MemTotal"].split()[0]) - int(fields["MemAvailable"].split()[0])
    return kib / 2**20


class SweepDisplay:
    """`with display.stage(name, total, unit): ... display.advance()`; `summary` has seconds and peak GiB.
    `enabled=False` shows nothing; otherwise a terminal gets the live display and anything else lines."""

    def __init__(self, enabled: bool = True, interval_s: float = 0.5):
        console = progress_console()
        self.live = enabled and live_display(console)
        self.lines = enabled and not self.live
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
            disable=not self.live,
        )
        self.summary: dict[str, dict[str, float]] = {}
        self._task: TaskID | None = None
        self._meter: LineMeter | None = None
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
    def stage(self, name: str, total: int, unit: str = "unit") -> Iterator[None]:
        """A stage of `total` units (`unit` singular: `cell`, `draft`)."""
        self._task = task = self.progress.add_task(name, total=max(total, 1), note="")
        self._meter = LineMeter(name, total, unit) if self.lines else None
        self._peak = memory_in_use_gib()
        started = time.perf_counter()
        with self._meter if self._meter is not None else nullcontext():
            yield
        self.progress.update(task, completed=max(total, 1))
        self._meter = None
        self.summary[name] = {
            "seconds": round(time.perf_counter() - started, 1),
            "peak_gib": round(self._peak, 2),
        }

    def advance(self, units: int = 1, reused: bool = False) -> None:
        """`units` more done; `reused` ones were found done (they do not count towards the rate)."""
        if self._task is not None:
            self.progress.advance(self._task, units)
        if self._meter is not None:
            self._meter.update(units, reused=reused)

    def set_counts(self, done: int, total: int, reused: int = 0) -> None:
        """Absolute counts, from a worker that reports how far it is (`reused` of `done` were found done)."""
        if self._task is not None:
            self.progress.update(self._task, completed=done, total=max(total, 1))
        if self._meter is not None:
            self._meter.set_counts(done, total, reused)

    def note(self, text: str) -> None:
        """What the stage is doing right now (thread-safe: distillations report from their own threads)."""
        if self._task is not None:
            self.progress.update(self._task, note=text)
        if self._meter is not None:
            self._meter.set_postfix_str(text)

    def note_curve(self, draft: str, curve: CurvePoint, spec: SweepSpec) -> None:
        """A distillation's latest step, loss and acceptance as the note (`spec`: the one it trains under)."""
        self.note(curve_note(draft, curve, spec.distill.steps, spec.eval.temperatures))
