"""Progress a person can follow: a live display on a terminal, plain lines at a steady pace in a log.

On a terminal specray keeps rich's live display (the sweep's stages) and tqdm's bars (the pools). Anywhere
else — a file, a pipe, a Ray job's log — neither library has a mode that helps, so `LineMeter` prints the
lines itself:
- rich's `Live` renders only on a terminal: on a file it prints the final state once, when it stops;
- tqdm writes only when `update()` is called, so a stage that finishes nothing for ten minutes prints
  nothing for ten minutes (what a user cannot tell from a hang); it ends its updates with "\\r", not a
  newline; and it writes only when both `mininterval` and `miniters` hold, not when either does.
What the libraries do well is used as is: whether the output is a terminal is rich's `Console.is_terminal`
(which honours FORCE_COLOR and TTY_COMPATIBLE), and each line's text is tqdm's `format_meter` (count,
elapsed < remaining, rate).

A line is printed when a stage starts, every `SPECRAY_PROGRESS_INTERVAL_S` seconds (default 30) from a
heartbeat thread, whenever the count passes another 5% of the total, and when the stage ends; each line is
flushed at once (a Ray job's log is a pipe).

`SweepDisplay` is a driver's one display over its stages (the sweep's, the tune's, the garden's): per
stage, units done, elapsed and ETA — a live bar per stage on a terminal, `LineMeter`'s lines anywhere
else — and the stage's wall time and the machine's peak memory in use (read from /proc/meminfo, so Ray
workers count too). A stage formats its own notes (a distillation's curve: `distill.curves.curve_note`);
this module knows no stage's data.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from tqdm.auto import tqdm

log = logging.getLogger(__name__)

INTERVAL_ENV = "SPECRAY_PROGRESS_INTERVAL_S"
DEFAULT_INTERVAL_S = 30.0
STEP_FRACTION = 0.05  # a line whenever another 5% of the stage is done
PREFIX = "progress"  # every line starts with it: `grep '^progress'` on a job's log
# `unit` is singular (the rate reads 2.1cell/s or 26.3s/draft); counts add the plural s
_FORMAT = (
    "{desc}: {n_fmt}/{total_fmt} {unit}s ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}]{postfix}"
)
_FORMAT_NO_TOTAL = "{desc}: {n_fmt} {unit}s [{elapsed}, {rate_fmt}]{postfix}"
MEMINFO = Path("/proc/meminfo")


def progress_console() -> Console:
    """The console progress goes to: standard error, like logging and tqdm."""
    return Console(stderr=True)


def live_display(console: Console | None = None) -> bool:
    """Whether a live display can work here (rich's own test); if not, progress is printed as lines."""
    console = console or progress_console()
    return console.is_terminal and not console.is_dumb_terminal


def interval_s() -> float:
    """Seconds between heartbeat lines: `SPECRAY_PROGRESS_INTERVAL_S`, default 30."""
    text = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL_S
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        log.warning(
            "%s=%r is not a positive number of seconds; using %g", INTERVAL_ENV, text, DEFAULT_INTERVAL_S
        )
        return DEFAULT_INTERVAL_S
    return value


def _print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # sys.stderr looked up now: whatever it is at this moment


class LineMeter(AbstractContextManager):
    """One stage's progress as plain lines. `update`, `set_postfix_str` and the context manager are tqdm's,
    so a pool takes either. Units marked `reused` (found done) count as done but not towards the rate.
    `unit` is singular: `cell`, `draft`."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str,
        interval: float | None = None,
        write: Callable[[str], None] = _print_line,
    ) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = self.reused = 0
        self.note = ""
        self._interval = interval or interval_s()
        self._write = write
        self._lock = threading.Lock()
        self._started = self._last_time = time.monotonic()
        self._last_done = 0
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name=f"progress-{label}", daemon=True)

    def __enter__(self) -> LineMeter:
        with self._lock:
            self._emit()
        self._heartbeat.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self._stop.set()
        self._heartbeat.join()
        with self._lock:
            if exc_type is None:
                self.done = max(self.done, self.total)
                self.note = f"{self.note}; done" if self.note else "done"
            self._emit()

    def update(self, n: int = 1, reused: bool = False) -> None:
        with self._lock:
            self.done += n
            self.reused += n if reused else 0
            if self._crossed_step():
                self._emit()

    def set_counts(self, done: int, total: int, reused: int = 0) -> None:
        """Absolute counts, for a worker that reports how far it is (the teacher pool); `reused` of `done`
        were found done."""
        with self._lock:
            self.done, self.total, self.reused = done, total, reused
            if self._crossed_step():
                self._emit()

    def set_postfix_str(self, text: str) -> None:
        with self._lock:
            self.note = text

    def line(self) -> str:
        """The current line (tqdm's format_meter: count, elapsed < remaining, rate over computed units)."""
        return tqdm.format_meter(
            self.done,
            self.total or None,
            time.monotonic() - self._started,
            prefix=f"{PREFIX} {self.label}",
            unit=self.unit,
            initial=self.reused,
            bar_format=_FORMAT if self.total else _FORMAT_NO_TOTAL,
            postfix=self.note or None,
        )

    def _crossed_step(self) -> bool:
        """Another 5% done since the last line (the last unit is left to the stage's closing line)."""
        step = max(1, math.ceil(self.total * STEP_FRACTION))
        return self.done // step > self._last_done // step and not (self.total and self.done >= self.total)

    def _emit(self) -> None:  # holds the lock: lines never interleave, counts never go back
        self._write(self.line())
        self._last_time, self._last_done = time.monotonic(), self.done

    def _beat(self) -> None:
        while not self._stop.wait(min(self._interval, 1.0)):
            with self._lock:
                if time.monotonic() - self._last_time >= self._interval:
                    self._emit()


def bar(total: int, label: str, unit: str, enabled: bool = True) -> Any:
    """A pool's progress bar: tqdm on a terminal, a `LineMeter` elsewhere, a silent tqdm if not `enabled`."""
    if enabled and not live_display():
        return LineMeter(label, total, unit)
    return tqdm(total=total, desc=label, unit=unit, disable=not enabled)


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

    def __init__(self, enabled: bool = True, sample_every_s: float = 0.5):
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
        self._interval = sample_every_s  # how often peak memory is read
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
