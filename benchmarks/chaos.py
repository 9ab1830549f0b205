"""A whole sweep under repeated, random faults finishes exactly once: the chaos supervisor.

    .venv/bin/python benchmarks/chaos.py --quick [--seed 0]   # >= 5 faults on a micro sweep (make test)
    .venv/bin/python benchmarks/chaos.py [--seed 0]           # the long run: >= 30 faults, each kind >= 3x

What it does, in a folder of its own (`--out`, default a temp folder; each run its own output folder,
MLflow store and SPECRAY_CACHE):
1. a fault-free `specray run` of the sweep (sweeps/smoke.yaml widened by the mode's overrides: more drafts
   than Train slots), on the local Ray the driver starts itself, as a user runs it: the reference;
2. a two-node Ray on 127.0.0.1 (`chaos_cluster.py`: a head and a worker node of 1 CPU each) and the same
   `specray run` against it, with the zoo copied from the reference's cache (the zoo is not under test);
   from a schedule drawn from `--seed` (`chaos_schedule.py`) it kills, at random moments of the stage the
   schedule names, a teacher replica, a Ray Train worker, an eval actor, the worker node (a replacement
   joins, as an autoscaler's would), the driver (SIGKILL), or the whole cluster (every process of it, as
   `ray stop --force` would, then started again on the same ports). After a driver or Ray death it runs
   the same command again, as a user would, until the command exits 0;
3. the audit (`chaos_audit.py`): the finished tree against the reference's — keys, shard rows, draft
   weights, cells, report, MLflow — and exactly-once everywhere.

It prints the schedule, each fault as it strikes (kind, time, target), the resumes, the audit's findings
and a summary line, writes `chaos.json` in its folder, and exits 1 when the audit finds a problem or a run
failed without a fault that explains it. `--source DIR` runs the driver and the cluster from another copy
of the repository (a planted bug: tests/integration/test_chaos.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.chaos_audit import Tree, audit  # noqa: E402
from benchmarks.chaos_cluster import Cluster  # noqa: E402
from benchmarks.chaos_schedule import PHASES, RESTARTS, STAGE, Fault, draw_schedule  # noqa: E402
from benchmarks.quick import MICRO_ZOO  # noqa: E402

SPECRAY = str(Path(sys.executable).parent / "specray")
SWEEP = REPO / "sweeps" / "smoke.yaml"
NAME = "smoke"
ACTOR = {"teacher": "TeacherActor", "distill": "RayTrainWorker", "eval": "EvalWorker"}  # by phase
POLL_S = 0.2
DRIVER_EXIT_S = 600.0  # a driver whose Ray is gone and that has not exited after this long is hung
MAX_FAILED_RUNS = 3  # runs that fail without a fault to explain it, before the supervisor gives up

# Both modes: a fixed c, so the analytic cells' keys do not depend on a timing (timed step costs would key
# every cell of one run differently from the reference's); two teacher replicas and two eval actors, one
# per node. The long mode widens the smoke sweep to 6 τ_kd and 2 training replicates (24 drafts + the
# baseline on 2 Train slots); the quick mode keeps its 4 drafts on a micro zoo with a few steps.
COMMON = ("eval.draft_cost_ratio=0.5", "teacher.replicas=2", "eval.replicas=2")
LONG = (
    "teacher.temperatures=[0.0,0.2,0.4,0.6,0.8,1.0]",
    "distill.replicates=2",
    "data.train_size=96",
    "teacher.batch_size=8",
)
QUICK = (
    f"models.zoo={json.dumps(MICRO_ZOO)}",
    "data.train={kind: synthetic, size: 200, seed: 7}",
    "data.out_of_domain={kind: synthetic, families: [word_problem], size: 40, seed: 8}",
    "data.train_size=32",
    "data.validation_size=8",
    "data.in_domain_test_size=8",
    "data.out_of_domain_test_size=8",
    "teacher.batch_size=4",
    "teacher.max_new_tokens=12",
    "distill.steps=4",
    "distill.checkpoint_every=2",
    "distill.report_every=2",
    "distill.batch_size=4",
    "distill.max_new_tokens=8",
    "distill.warmup_steps=1",
    "eval.max_new_tokens=8",
    "eval.empirical_prompts=2",
    "eval.repeats=1",
)
COUNTS = {
    "quick": {"teacher": 1, "train": 1, "eval": 1, "node": 1, "driver": 1, "ray": 1},
    "long": {"teacher": 5, "train": 6, "eval": 6, "node": 6, "driver": 6, "ray": 4},
}
REJOIN_S = {"quick": 5.0, "long": 30.0}  # a lost node's replacement joins this long after (an autoscaler)
MAX_DELAY_S = {
    "quick": {"start": 6.0, "teacher": 2.0, "distill": 6.0, "eval": 4.0, "report": 2.0},
    "long": {"start": 10.0, "teacher": 4.0, "distill": 15.0, "eval": 10.0, "report": 3.0},
}


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
    cluster: Cluster
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
        return {phase for phase, name in ACTOR.items() if self.cluster.actors(name)}

    def cells_done(self) -> bool:
        return len(list((self.cwd / "out" / NAME / "cells").glob("*.json"))) >= self.expected_cells

    def reached(self, phase: str) -> str:
        """Wait until `phase` is reached ("ready"), is over ("over"), or the driver ended ("exited")."""
        order = PHASES.index(phase)
        while self.driver is not None and self.driver.poll() is None:
            self.check_time()
            self.rejoin()
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
        targets = self.cluster.actors(name)
        if not targets:
            return None
        pid, node = targets[fault.pick % len(targets)]
        os.kill(pid, signal.SIGKILL)
        return f"{name} pid {pid} on {node}"

    def _kill_node(self, fault: Fault) -> str | None:
        self.rejoin(now=True)  # the node to lose must be there
        node = self.cluster.worker
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
        nodes = ", ".join(self.cluster.groups().values())
        self.cluster.kill_all()
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


# ---------------------------------------------------------------- the two runs and the verdict


def environment(source: Path, cache: Path) -> dict[str, str]:
    """What the driver (and, for the chaos run, every node) runs with: specray from `source`, its own
    cache, no telemetry, no hub; the Ray Train settings a local Ray gets (`cluster.runtime`)."""
    from specray.cluster.runtime import LOCAL_TRAIN_ENV  # imports Ray: not needed for --schedule-only

    path = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    quiet = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true", "HF_HUB_OFFLINE": "1"}
    return os.environ | quiet | LOCAL_TRAIN_ENV | {"PYTHONPATH": path, "SPECRAY_CACHE": str(cache)}


def command(folder: Path, overrides: list[str]) -> list[str]:
    uri = f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"
    return [SPECRAY, "run", str(SWEEP), *overrides, f"output_dir={folder / 'out'}", uri]


def reference_run(folder: Path, overrides: list[str], source: Path) -> float:
    """The fault-free run, on the local Ray its driver starts; its wall time (saved beside it, so a later
    chaos run can reuse the folder with --reference)."""
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    with (folder / "run.log").open("w") as log:
        result = subprocess.run(
            command(folder, overrides),
            cwd=folder,
            env=environment(source, folder / "cache"),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    if result.returncode != 0:
        raise SystemExit(f"the fault-free run failed (exit {result.returncode}): see {folder / 'run.log'}")
    wall = time.monotonic() - began
    (folder / "wall_s.txt").write_text(f"{wall:.1f}\n")
    return wall


def chaos_run(folder: Path, reference: Path, overrides: list[str], schedule: list[Fault], args) -> Chaos:  # noqa: ANN001
    """The same command under the schedule's faults, on a two-node cluster of its own."""
    (folder / "logs").mkdir(parents=True)
    shutil.copytree(reference / "cache" / "zoo", folder / "cache" / "zoo")  # the zoo is not under test
    cluster = Cluster(environment(args.source, folder / "cache"))
    expected = len(list((reference / "out" / NAME / "cells").glob("*.json")))
    cluster.start()
    chaos = Chaos(
        [*command(folder, overrides), f"ray.address={cluster.address}"],
        folder,
        cluster.env,
        cluster,
        expected,
        folder / "logs",
        args.timeout,
        REJOIN_S[args.mode],
    )
    try:
        chaos.code = chaos.run(schedule)
    finally:
        if chaos.driver is not None and chaos.driver.poll() is None:
            os.killpg(chaos.driver.pid, signal.SIGKILL)
        cluster.close()
    return chaos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a micro sweep and 6 faults (make test)")
    parser.add_argument("--seed", type=int, default=0, help="draws the fault schedule")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp folder)")
    parser.add_argument("--reference", type=Path, default=None, help="reuse this finished fault-free run")
    parser.add_argument("--source", type=Path, default=REPO, help="the specray checkout the runs use")
    parser.add_argument("--schedule-only", action="store_true", help="print the schedule and stop")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the chaos run is hung")
    args = parser.parse_args()
    mode = args.mode = "quick" if args.quick else "long"
    args.timeout = args.timeout or (3600.0 if args.quick else 6 * 3600.0)
    schedule = draw_schedule(args.seed, COUNTS[mode], MAX_DELAY_S[mode])
    print(f"schedule (seed {args.seed}, {mode}): {len(schedule)} faults")
    for i, fault in enumerate(schedule, 1):
        print(f"  {i:2d}. {fault.line()}")
    if args.schedule_only:
        return 0
    root = args.out or Path(tempfile.mkdtemp(prefix="specray-chaos-"))
    overrides = [*COMMON, *(QUICK if args.quick else LONG)]
    reference = args.reference or root / "reference"
    if args.reference is None:
        print(f"fault-free run in {reference} ...", flush=True)
        reference_run(reference, overrides, args.source)
    reference_s = float((reference / "wall_s.txt").read_text())
    print(f"fault-free run: {reference_s:.0f}s; chaos run in {root / 'chaos'}", flush=True)
    began = time.monotonic()
    chaos = chaos_run(root / "chaos", reference, overrides, schedule, args)
    chaos_s = time.monotonic() - began
    problems = (
        audit(Tree(reference), Tree(root / "chaos")) if chaos.code == 0 else ["the sweep never finished"]
    )
    problems = chaos.failed_runs + problems
    summary = verdict(chaos, problems, reference_s, chaos_s, args.seed, mode)
    (root / "chaos.json").write_text(json.dumps(summary, indent=1))
    return 0 if not problems else 1


def verdict(
    chaos: Chaos, problems: list[str], reference_s: float, chaos_s: float, seed: int, mode: str
) -> dict:
    """Print what struck, what was skipped, the resumes and the audit; the same as a JSON summary."""
    counts = {kind: sum(s.kind == kind for s in chaos.struck) for kind in COUNTS[mode]}
    print(f"\nfaults injected: {len(chaos.struck)} ({', '.join(f'{k} {n}' for k, n in counts.items())})")
    for s in chaos.struck:
        print(f"  {s.at_s:7.1f}s  run {s.run:2d}  {s.kind:8s} {s.phase:8s} {s.target}")
    print(f"skipped: {len(chaos.skipped)}; resumes: {chaos.runs - 1} (runs of the command: {chaos.runs})")
    print(f"wall time: chaos {chaos_s:.0f}s, fault-free {reference_s:.0f}s ({chaos_s / reference_s:.2f}x)")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    print(
        f"chaos {mode} seed {seed}: {'PASSED' if not problems else f'FAILED ({len(problems)} problems)'}: "
        f"{len(chaos.struck)} faults, {chaos.runs - 1} resumes"
    )
    return {
        "mode": mode,
        "seed": seed,
        "struck": [asdict(s) for s in chaos.struck],
        "skipped": [asdict(f) for f in chaos.skipped],
        "counts": counts,
        "resumes": chaos.runs - 1,
        "chaos_s": round(chaos_s, 1),
        "reference_s": round(reference_s, 1),
        "problems": problems,
    }


if __name__ == "__main__":
    sys.exit(main())
