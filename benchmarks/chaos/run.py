"""A whole sweep under repeated, random faults finishes exactly once: the chaos supervisor.

    .venv/bin/python -m benchmarks.chaos.run --quick [--seed 0]   # >= 5 faults on a micro sweep (make test)
    .venv/bin/python -m benchmarks.chaos.run [--seed 0]          # the long run: >= 30 faults, each kind >= 3x

What it does, in a folder of its own (`--out`, default a temp folder; each run its own output folder,
MLflow store and SPECRAY_CACHE):
1. a fault-free `specray run` of the sweep (sweeps/smoke.yaml widened by the mode's overrides: more drafts
   than Train slots), on the local Ray the driver starts itself, as a user runs it: the reference;
2. a two-node Ray on 127.0.0.1 (`specray.cluster.loopback`: a head and a worker node of 1 CPU each) and
   the same `specray run` against it, with the zoo copied from the reference's cache (the zoo is not under
   test); from a schedule drawn from `--seed` (`schedule.py`) it kills, at random moments of the stage the
   schedule names, a teacher replica, a Ray Train worker, an eval actor, the worker node (a replacement
   joins, as an autoscaler's would), the driver (SIGKILL), or the whole cluster (every process of it, as
   `ray stop --force` would, then started again on the same ports). After a driver or Ray death it runs
   the same command again, as a user would, until the command exits 0;
3. the audit (`audit.py`): the finished tree against the reference's — keys, shard rows, draft
   weights, cells, report, MLflow — and exactly-once everywhere.

It prints the schedule, each fault as it strikes (kind, time, target), the resumes, the audit's findings
and a summary line, writes `chaos.json` in its folder, and exits 1 when the audit finds a problem or a run
failed without a fault that explains it. `--source DIR` runs the driver and the cluster from another copy
of the repository (a planted bug: tests/integration/test_chaos.py); `--only KINDS` and `--phase PHASE` keep
some of the schedule's faults and move them into one phase (that test's single driver kill mid-distillation).
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
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks import REPO
from benchmarks.chaos.audit import Tree, audit
from benchmarks.chaos.schedule import PHASES, Fault, draw_schedule
from benchmarks.chaos.supervisor import NAME, Chaos
from benchmarks.chaos.targets import kill_all
from benchmarks.quick import QUICK_OVERRIDES
from specray.cluster.loopback import LoopbackCluster

SPECRAY = str(Path(sys.executable).parent / "specray")
SWEEP = REPO / "sweeps" / "smoke.yaml"

# Both modes: a fixed c, so the analytic cells' keys do not depend on a timing (timed step costs would key
# every cell of one run differently from the reference's); two teacher replicas and two eval actors, one
# per node. The long mode widens the smoke sweep to 6 τ_kd and 2 training replicates (24 drafts + the
# baseline on 2 Train slots); the quick mode keeps its 4 drafts on a micro zoo with a few steps.
COMMON = ("eval.draft_cost_ratio=0.5", "teacher.replicas=2", "eval.replicas=2")
LONG = (
    "teacher.temperatures=[0.0,0.2,0.4,0.6,0.8,1.0]",
    "distill.replicates=2",
    "data.train_size=96",
    "data.in_domain_test_size=48",  # an eval stage long enough for its faults to land in it
    "data.out_of_domain_test_size=48",
    "teacher.batch_size=8",
)
QUICK = (  # benchmarks/quick.py's micro sweep (its τ lists are the smoke sweep's own), a few steps
    *QUICK_OVERRIDES,
    "teacher.batch_size=4",
    "distill.steps=4",
    "distill.checkpoint_every=2",
    "distill.report_every=2",
)
COUNTS = {
    "quick": {"teacher": 1, "train": 1, "eval": 1, "node": 1, "driver": 1, "ray": 1},
    "long": {"teacher": 5, "train": 6, "eval": 7, "node": 6, "driver": 6, "ray": 4},
}
REJOIN_S = {"quick": 5.0, "long": 30.0}  # a lost node's replacement joins this long after (an autoscaler)
MAX_DELAY_S = {
    "quick": {"start": 6.0, "teacher": 2.0, "distill": 6.0, "eval": 4.0, "report": 2.0},
    "long": {"start": 10.0, "teacher": 4.0, "distill": 15.0, "eval": 6.0, "report": 3.0},
}


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
    cluster = LoopbackCluster(environment(args.source, folder / "cache"))
    expected = len(list((reference / "out" / NAME / "cells").glob("*.json")))
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
    signal.signal(signal.SIGTERM, _interrupted)  # `kill PID` stops the cluster and the driver too
    try:
        cluster.start()
        chaos.started = time.monotonic()
        chaos.code = chaos.run(schedule)
    finally:
        if chaos.driver is not None and chaos.driver.poll() is None:
            os.killpg(chaos.driver.pid, signal.SIGKILL)
        kill_all(cluster)  # SIGKILL at once: the run is over, nothing needs a clean exit
        cluster.stop()
    return chaos


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a micro sweep and 6 faults (make test)")
    parser.add_argument("--seed", type=int, default=0, help="draws the fault schedule")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temp folder)")
    parser.add_argument("--reference", type=Path, default=None, help="reuse this finished fault-free run")
    parser.add_argument("--source", type=Path, default=REPO, help="the specray checkout the runs use")
    parser.add_argument("--schedule-only", action="store_true", help="print the schedule and stop")
    parser.add_argument(
        "--only", default="", help="strike only these kinds of the schedule (comma-separated)"
    )
    parser.add_argument(
        "--phase",
        choices=PHASES,
        default=None,
        help="move every fault of the schedule into this phase (with --only: one fault, placed by a test)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds before the chaos run is hung")
    parser.add_argument(
        "--record", type=Path, default=None, help="write a results file (docs/results/chaos.json)"
    )
    args = parser.parse_args()
    mode = args.mode = "quick" if args.quick else "long"
    args.timeout = args.timeout or (3600.0 if args.quick else 6 * 3600.0)
    schedule = draw_schedule(args.seed, COUNTS[mode], MAX_DELAY_S[mode])
    if args.only:
        schedule = [fault for fault in schedule if fault.kind in args.only.split(",")]
    if args.phase:
        schedule = [replace(fault, phase=args.phase) for fault in schedule]
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
    if args.record is not None:
        record(summary, args.record, " ".join(["python", "-m", "benchmarks.chaos.run", *sys.argv[1:]]))
    return 0 if not problems else 1


def record(summary: dict, path: Path, command: str) -> None:
    """The run's figures as a results file (`specray/cli/results.py`): what docs/RELIABILITY.md quotes."""
    from specray.cli.results import write_results

    figures = {
        "faults": len(summary["struck"]),
        "struck": summary["counts"],
        "skipped": len(summary["skipped"]),
        "resumes": summary["resumes"],
        "problems": len(summary["problems"]),
        "wall_seconds": summary["chaos_s"],
        "reference_wall_seconds": summary["reference_s"],
        "wall_ratio": round(summary["chaos_s"] / summary["reference_s"], 2),
    }
    rows = [
        {
            "at": f"{s['at_s']:.1f} s",
            "run": str(s["run"]),
            "kind": s["kind"],
            "phase": s["phase"],
            "target": s["target"],
        }
        for s in summary["struck"]
    ]
    tables = {
        "Faults injected": rows,
        "Problems the audit found": [{"problem": p} for p in summary["problems"]],
    }
    by = "recorded by `benchmarks/chaos/run.py --record`"
    write_results(path, command, figures, tables, recorded_by=by, seed=summary["seed"], mode=summary["mode"])


def verdict(
    chaos: Chaos, problems: list[str], reference_s: float, chaos_s: float, seed: int, mode: str
) -> dict:
    """Print what struck, what was skipped, the resumes and the audit; the same as a JSON summary."""
    counts = {kind: sum(s.kind == kind for s in chaos.struck) for kind in COUNTS[mode]}
    print(f"\nfaults injected: {len(chaos.struck)} ({', '.join(f'{k} {n}' for k, n in counts.items())})")
    for s in chaos.struck:
        print(f"  {s.at_s:7.1f}s  run {s.run:2d}  {s.kind:8s} {s.phase:8s} {s.target}")
    print(f"skipped: {len(chaos.skipped)}; resumes: {chaos.runs - 1} (runs of the command: {chaos.runs})")
    for line in chaos.unplanned:
        print(f"not a fault of this run: {line}")
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
        "unplanned": chaos.unplanned,
        "chaos_s": round(chaos_s, 1),
        "reference_s": round(reference_s, 1),
        "problems": problems,
    }


if __name__ == "__main__":
    sys.exit(main())
