"""The chaos supervisor's loop (benchmarks/chaos/run.py runs it): the command, the schedule's faults as its
phases come, the command again after each driver or Ray death, until it exits 0.

Phases are seen from the outside: a phase's actors are up (`ray::TeacherActor`, `ray::RayTrainWorker`,
`ray::EvalWorker` processes of the cluster), or every cell record is on disk and no actor is (the driver
writes the report and MLflow's records). A run that fails with no fault to explain it is recorded (the
audit reports it) and the command runs again, as a user would, up to MAX_FAILED_RUNS times.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.chaos.schedule import PHASES, RESTARTS, STAGE, Fault
from benchmarks.chaos.targets import actors, groups, kill_all, live_worker
from specray.cluster.loopback import LoopbackCluster

NAME = "smoke"  # the sweep's name: its output folder is out/<NAME>
ACTOR = {"teacher": "TeacherActor", "distill": "RayTrainWorker", "eval": "EvalWorker"}  # by phase
POLL_S = 0.2
DRIVER_EXIT_S = 600.0  # a driver whose Ray is gone and that has not exited after this long is hung
MAX_FAILED_RUNS = 3  # runs that fail without a fault to explain it, before the supervisor gives up


@dataclass
class Struck:
    """A fault as it happened: when (seconds since the chaos run began), on what, in which run."""

    kind: str
    phase: str
    at_s: float
    target: str
    run: int


@dataclass
class Chaos:
    """The chaos run's state: the cluster, the driver of the current run (`runs` counts them), what struck."""

    command: list[str]
    cwd: Path
    env: dict[str, str]
    cluster: LoopbackCluster
    expected_cells: int
    logs: Path
    timeout_s: float
    rejoin_s: float  # how long after a node is lost its replacement joins (an autoscaler's delay)
    started: float = field(default_factory=time.monotonic)
    driver: subprocess.Popen | None = None
    runs: int = 0
    seen: set[str] = field(default_factory=set)  # phases whose actors this run's driver has had up
    struck: list[Struck] = field(default_factory=list)
    skipped: list[Fault] = field(default_factory=list)
    failed_runs: list[str] = field(default_factory=list)  # runs that failed with no fault to explain it
    code: int = -1  # the exit code of the last run (0: the sweep finished)
    rejoin_at: float | None = None  # when a lost node's replacement joins (monotonic clock)
    unplanned: list[str] = field(default_factory=list)  # nodes that ended without a fault of this run

    @property
    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        print(f"[{self.now:7.1f}s] {text}", flush=True)

    def run(self, schedule: list[Fault]) -> int:
        """Run the command, strike each fault of `schedule` in turn, re-run the command after each driver or
        Ray death and after a failure no fault explains; returns the exit code of the last run (0: done)."""
        self.launch()
        for fault in schedule:
            outcome = "exited"
            while outcome == "exited" and self.driver is not None:
                if self.driver.poll() is not None and not self.rerun_after_failure():
                    break
                outcome = self.inject(fault)
            if outcome == "exited":
                self.skipped.append(fault)
                self.say(f"skipped: {fault.line()} (the sweep is done)")
        while self.driver is not None:
            while self.driver.poll() is None:
                self.check_time()
                time.sleep(POLL_S)
            if not self.rerun_after_failure():
                break
        return 1 if self.driver is None else self.driver.returncode

    def launch(self) -> None:
        self.runs += 1
        self.seen = set()
        with (self.logs / f"run-{self.runs}.log").open("w") as log:
            self.driver = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a group of its own: the driver and whatever it started
            )
        self.say(f"run {self.runs}: {'the command again' if self.runs > 1 else 'specray run'}")

    def rerun_after_failure(self) -> bool:
        """The driver ended by itself: done (False) on exit 0; otherwise the failure is recorded and, unless
        too many have failed, the command runs again (True)."""
        assert self.driver is not None
        code = self.driver.returncode
        if code == 0:
            return False
        tail = (self.logs / f"run-{self.runs}.log").read_text()[-2000:]
        self.failed_runs.append(f"run {self.runs} exited {code} with no fault to explain it:\n{tail}")
        self.say(f"run {self.runs} FAILED (exit {code}) with no fault to explain it")
        if len(self.failed_runs) >= MAX_FAILED_RUNS:
            self.driver = None
            return False
        self.launch()
        return True

    # ------------------------------------------------------------ phases, seen from the outside

    def alive(self) -> set[str]:
        return {phase for phase, name in ACTOR.items() if actors(self.cluster, name)}

    def cells_done(self) -> bool:
        return len(list((self.cwd / "out" / NAME / "cells").glob("*.json"))) >= self.expected_cells

    def reached(self, phase: str) -> str:
        """Wait until `phase` is reached ("ready"), is over ("over"), or the driver ended ("exited")."""
        order = PHASES.index(phase)
        while self.driver is not None and self.driver.poll() is None:
            self.check_time()
            self.rejoin()
            self.heal()
            alive = self.alive()
            self.seen |= alive
            reporting = not alive and self.cells_done()
            if phase == "start" or phase in alive or (phase == "report" and reporting):
                return "ready"
            if any(PHASES.index(p) > order for p in self.seen) or (reporting and phase != "report"):
                return "over"
            time.sleep(POLL_S)
        return "exited"

    def sleep(self, seconds: float) -> bool:
        """Sleep while the driver runs; False if it ended meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.driver is None or self.driver.poll() is not None:
                return False
            self.rejoin()
            self.heal()
            time.sleep(POLL_S)
        return True

    def rejoin(self, now: bool = False) -> None:
        """A replacement for a lost worker node joins once its time has come (or `now`)."""
        if self.rejoin_at is not None and (now or time.monotonic() >= self.rejoin_at):
            self.rejoin_at = None
            self.say(f"{self.cluster.start_worker()} joined the cluster")

    def check_time(self) -> None:
        if self.now > self.timeout_s:
            raise TimeoutError(f"the chaos run took more than {self.timeout_s:.0f}s: hung?")

    # ------------------------------------------------------------ faults

    def inject(self, fault: Fault) -> str:
        """Strike `fault` once its phase is reached and its delay passed: "struck", "skipped" (its stage is
        over, or no target) or "exited" (the driver ended first)."""
        state = self.reached(fault.phase)
        if state == "exited":
            return state
        if state == "over" and fault.kind in (*STAGE, "node"):  # restarts strike whatever the phase
            self.skipped.append(fault)
            self.say(f"skipped: {fault.line()} (its phase is over)")
            return "skipped"
        if not self.sleep(fault.delay_s):
            return "exited"
        kill = {"node": self._kill_node, "driver": self._kill_driver, "ray": self._kill_ray}
        target = kill.get(fault.kind, self._kill_actor)(fault)
        # a stage's processes can come up after its phase began (Ray Train starts its workers seconds after
        # its controller): wait for one while the phase lasts, rather than skip by how fast they started
        while target is None and fault.kind in STAGE and self.reached(fault.phase) == "ready":
            time.sleep(POLL_S)
            target = self._kill_actor(fault)
        if target is None:
            self.skipped.append(fault)
            self.say(f"skipped: {fault.line()} (no target)")
            return "skipped"
        self.struck.append(Struck(fault.kind, fault.phase, round(self.now, 1), target, self.runs))
        self.say(f"{fault.kind} ({fault.phase}): killed {target}")
        if fault.kind in RESTARTS and self.driver is not None and self.driver.returncode != 0:
            self.launch()  # as a user would; a run that ended by itself before the kill needs none
        return "struck"

    def _kill_actor(self, fault: Fault) -> str | None:
        name = ACTOR[STAGE[fault.kind]]
        targets = actors(self.cluster, name)
        if not targets:
            return None
        pid, node = targets[fault.pick % len(targets)]
        os.kill(pid, signal.SIGKILL)
        return f"{name} pid {pid} on {node}"

    def _kill_node(self, fault: Fault) -> str | None:
        self.rejoin(now=True)  # the node to lose must be there
        node = live_worker(self.cluster)
        if node is None:
            return None
        self.cluster.kill_node(node)
        self.rejoin_at = time.monotonic() + self.rejoin_s
        return f"{node}, every process (a replacement joins in {self.rejoin_s:.0f}s)"

    def _kill_driver(self, fault: Fault) -> str | None:
        assert self.driver is not None
        if self.driver.poll() is not None:  # it ended meanwhile
            return None
        pid = self.driver.pid
        os.killpg(pid, signal.SIGKILL)
        self.driver.wait()
        return f"specray run pid {pid}"

    def _kill_ray(self, fault: Fault) -> str:
        assert self.driver is not None
        nodes = ", ".join(groups(self.cluster).values())
        kill_all(self.cluster)
        self.say(f"ray ({fault.phase}): killed every process of {nodes}; waiting for the driver to exit")
        began = time.monotonic()
        try:
            code = self.driver.wait(timeout=DRIVER_EXIT_S)
            after = f"the driver exited {code} {time.monotonic() - began:.0f}s later"
        except subprocess.TimeoutExpired:
            self.failed_runs.append(
                f"run {self.runs}: the driver did not exit in {DRIVER_EXIT_S:.0f}s once Ray died"
            )
            os.killpg(self.driver.pid, signal.SIGKILL)
            self.driver.wait()
            after = "the driver hung and was killed"
        self.rejoin_at = None  # the cluster starts whole
        self.cluster.start()
        return f"every process of {nodes} ({after}; the cluster started again)"

    def heal(self) -> None:
        """A node whose `ray start` ended without this supervisor killing it (it stops its node when one of
        the node's processes dies) is recorded, not counted as a fault, and started again: the head with
        the whole cluster, a worker node by a replacement."""
        dead = [name for name, node in self.cluster.nodes.items() if node.poll() is not None]
        if not dead:
            return
        self.unplanned.append(f"{self.now:.1f}s: {', '.join(dead)} ended without a fault")
        self.say(f"{', '.join(dead)} ended without a fault; starting it again")
        if "head" in dead:
            kill_all(self.cluster)
            self.rejoin_at = None
            self.cluster.start()
            return
        for name in dead:
            self.cluster.kill_node(name)
        self.rejoin(now=True)
        if live_worker(self.cluster) is None:
            self.say(f"{self.cluster.start_worker()} joined the cluster")
