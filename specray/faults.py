"""Fault injection for the reliability suite (docs/RELIABILITY.md): hard kills at chosen points of a run.

    SPECRAY_FAULTS="teacher.batch=2,eval.cell=3,train.step=4" SPECRAY_FAULTS_DIR=/tmp/faults specray run ...

arms three faults. The process that reaches a point for the n-th time (`train.step`: reports a step ≥ n)
sends itself SIGKILL, the way the OOM killer or a lost node ends a process: no exception, no cleanup, no
`finally`. Each fault fires once per SPECRAY_FAULTS_DIR, where it leaves a marker file named after the point,
so the actor Ray restarts in its place does not die again, and a test can check that the fault really fired.

The driver reads the environment once (`Faults.from_env`) and hands the result to the actors it creates, so
faults reach Ray workers whatever environment those start with. Unset, every check is a dictionary lookup.

Points: `teacher.batch` (a teacher replica, after generating a batch and before returning it), `eval.cell`
(an eval replica, after evaluating a cell and before returning its record), `train.step` (rank 0 of a Ray
Train worker group, right after reporting a step and its checkpoint).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specray.errors import SpecError

log = logging.getLogger(__name__)

FAULTS_ENV = "SPECRAY_FAULTS"
FAULTS_DIR_ENV = "SPECRAY_FAULTS_DIR"
POINTS = ("teacher.batch", "eval.cell", "train.step")


@dataclass(frozen=True)
class Faults:
    """Armed faults: point -> the count at which it fires; `marker_dir` records the ones that fired."""

    armed: dict[str, int] = field(default_factory=dict)
    marker_dir: str | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Faults:
        environ = dict(os.environ if environ is None else environ)
        text = environ.get(FAULTS_ENV, "").strip()
        if not text:
            return cls()
        armed = {}
        for item in text.split(","):
            point, sep, count = item.strip().partition("=")
            if point not in POINTS or not sep or not count.isdigit() or int(count) < 1:
                raise SpecError(
                    f"{FAULTS_ENV}: {item.strip()!r} is not POINT=N with N >= 1; points: {', '.join(POINTS)}"
                )
            armed[point] = int(count)
        marker_dir = environ.get(FAULTS_DIR_ENV)
        if not marker_dir:
            raise SpecError(f"{FAULTS_ENV} needs {FAULTS_DIR_ENV}: a folder where fired faults are recorded")
        Path(marker_dir).mkdir(parents=True, exist_ok=True)
        return cls(armed, marker_dir)

    def due(self, point: str, count: int) -> bool:
        """Whether `point` reached for the `count`-th time should fire (armed, reached, not fired yet)."""
        if point not in self.armed or count < self.armed[point]:
            return False
        return not self.fired(point)

    def fired(self, point: str) -> bool:
        return self.marker_dir is not None and (Path(self.marker_dir) / point).exists()

    def fire(self, point: str) -> None:
        """Record the fault, then SIGKILL this process. Only the first process to claim it dies."""
        assert self.marker_dir is not None
        try:
            fd = os.open(Path(self.marker_dir) / point, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        log.warning("fault injection: %s kills process %d", point, os.getpid())
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def check(self, point: str, count: int) -> None:
        """`fire` if due: the one call sites make."""
        if self.due(point, count):
            self.fire(point)
