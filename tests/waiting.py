"""Waiting in tests: on a condition, never on a fixed sleep, with a deadline that only a broken run reaches.

The tests run on loaded 2-core CI machines, where a step that takes seconds on an idle laptop can take
minutes; a deadline here is how long to wait before calling the run hung, not a claim about speed.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest

T = TypeVar("T")
HUNG_S = 900.0  # a step of the smoke sweep that has not happened after this long is not coming
CLI_TIMEOUT_S = 1800.0  # one CLI run (a whole smoke sweep at most) that has not ended after this long hung


def wait_until(
    condition: Callable[[], T],
    what: str,
    timeout_s: float = HUNG_S,
    poll_s: float = 0.5,
    *,
    ignore: tuple[type[Exception], ...] = (),
    alive: Sequence[subprocess.Popen] = (),
) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail naming `what` once
    `timeout_s` have passed without it. `ignore`: exceptions of `condition` that mean "not yet" (a server
    still starting); `alive`: processes that must keep running meanwhile — one that exits fails the wait at
    once, with its exit code, rather than at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = condition()
        except ignore:
            found = None
        if found:
            return found
        for process in alive:
            if process.poll() is not None:
                pytest.fail(f"{process.args[:3]} exited with {process.returncode} while waiting for {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:.0f}s for {what}")
        time.sleep(poll_s)
