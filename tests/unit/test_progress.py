"""Progress in a log: plain lines on start, at every 5% and at a steady pace (a heartbeat), flushed at once;
a terminal keeps the live display. No assertion depends on how fast anything runs."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading

import pytest
from tqdm.auto import tqdm

from specray.progress import (
    INTERVAL_ENV,
    LineMeter,
    SweepDisplay,
    bar,
    interval_s,
    live_display,
)
from tests.waiting import wait_until

NEVER = 1e6  # a heartbeat interval no test reaches: only starts, 5% steps and ends print
LINE = re.compile(r"^progress (?P<label>.+?): (?P<done>\d+)/(?P<total>\d+) (?P<unit>\w+) \(\d+%\) \[")


def _counts(lines: list[str]) -> list[int]:
    return [int(LINE.match(line)["done"]) for line in lines]


@pytest.fixture
def not_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "0")  # rich's own switch: whatever pytest's stderr is


def test_a_line_at_the_start_at_every_5_percent_and_at_the_end() -> None:
    lines: list[str] = []
    with LineMeter("eval", 40, "cell", interval=NEVER, write=lines.append) as meter:
        for _ in range(40):
            meter.update(1)
    assert all(LINE.match(line) for line in lines), lines
    assert _counts(lines) == list(range(0, 40, 2)) + [40]  # 5% of 40 cells = 2
    assert lines[0].startswith("progress eval: 0/40 cells (0%)")
    assert lines[-1].endswith("done")
    assert all("done" not in line for line in lines[:-1])  # the last unit is left to the closing line


def test_big_steps_print_once_and_counts_never_go_back() -> None:
    lines: list[str] = []
    with LineMeter("distill", 23, "draft", interval=NEVER, write=lines.append) as meter:
        meter.update(10, reused=True)
        meter.update(1)  # within the same 5% (2 drafts): no line
        meter.update(1)
        meter.update(11)
    assert _counts(lines) == [0, 10, 12, 23]


def test_reused_units_are_not_a_rate() -> None:
    """Units found done count as done; with nothing computed yet there is no rate and no ETA."""
    lines: list[str] = []
    with LineMeter("eval", 20, "cell", interval=NEVER, write=lines.append) as meter:
        meter.update(10, reused=True)
        assert "10/20 cells (50%)" in lines[-1] and "<?, ?cell/s]" in lines[-1], lines[-1]


def test_the_heartbeat_prints_while_nothing_finishes() -> None:
    lines: list[str] = []
    with LineMeter("distill", 4, "draft", interval=0.01, write=lines.append) as meter:
        meter.set_postfix_str("online/tau_kd=0.6 step 4/8: loss 1.2340")
        wait_until(lambda: len(lines) >= 4, "three heartbeat lines", poll_s=0.01)
    assert set(_counts(lines)) == {0, 4}  # nothing advanced: the same count, again and again
    assert "loss 1.2340" in lines[2]


def test_absolute_counts_from_a_worker() -> None:
    lines: list[str] = []
    with LineMeter("teacher shards", 0, "response", interval=NEVER, write=lines.append) as meter:
        meter.set_counts(64, 256, reused=64)
        meter.set_counts(128, 256, reused=64)
    assert lines[0] == lines[0].split(":")[0] + ": 0 responses [00:00, ?response/s]"  # no total yet
    assert _counts(lines[1:]) == [64, 128, 256]


def test_lines_are_flushed_into_a_pipe_at_once() -> None:
    """A child prints a start line, then waits on us: we must read the line while it waits (a buffered
    line would arrive only when the child exits, and this read would hang until the timeout)."""
    child = textwrap.dedent(
        f"""
        import sys
        from specray.progress import LineMeter
        with LineMeter("eval", 10, "cell", interval={NEVER}):
            sys.stdin.readline()
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", child], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    first: list[str] = []
    threading.Thread(target=lambda: first.append(process.stderr.readline()), daemon=True).start()
    try:
        wait_until(lambda: first, "the child's first line (a buffered line comes only at its exit)")
        assert first[0].startswith("progress eval: 0/10 cells"), first
        assert process.poll() is None  # still running: the line came before the stage ended
        process.stdin.write("go\n")
        process.stdin.flush()
        rest = process.stderr.read()
        assert ", done" in rest, rest
    finally:
        process.kill()
        process.wait(timeout=60)


def test_a_terminal_gets_tqdm_and_a_log_gets_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert live_display()
    with bar(3, "eval", "cell") as terminal:
        assert isinstance(terminal, tqdm)
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    assert not live_display()
    with bar(3, "eval", "cell") as log_bar:
        assert isinstance(log_bar, LineMeter)
    with bar(3, "eval", "cell", enabled=False) as silent:
        assert isinstance(silent, tqdm) and silent.disable


@pytest.mark.parametrize("value", ["", "abc", "0", "-5", "nan", "inf"])
def test_a_bad_interval_falls_back_to_the_default(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(INTERVAL_ENV, value)
    assert interval_s() == 30.0
    monkeypatch.setenv(INTERVAL_ENV, "0.25")
    assert interval_s() == 0.25


def test_the_sweep_display_prints_lines_per_stage(
    not_a_terminal: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with SweepDisplay() as display:
        assert display.lines and not display.live
        with display.stage("eval", 4, "cell"):
            display.advance(2, reused=True)
            display.note("passes of 2 drafts")
            display.advance(2)
        with display.stage("teacher shards", 0, "response"):
            display.set_counts(32, 64)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines] == ["progress eval"] * 3 + ["progress teacher shards"] * 3
    assert _counts(lines[:3]) == [0, 2, 4] and lines[2].endswith("passes of 2 drafts; done")
    assert set(display.summary) == {"eval", "teacher shards"}
