"""What Ray Train adds to one draft: wall and machine CPU seconds of the same offline draft trained by the
plain loop in a fresh process and by `specray.distill.ray_train.distill` (a TorchTrainer run), side by side.

    .venv/bin/python -m benchmarks.distill.train_overhead [--steps 100] [--repeats 2] [--tau-kd 1.0] [--knobs]
        [--data-callback]
    .venv/bin/python -m benchmarks.distill.train_overhead --quick   # a smoke check (benchmarks/quick.py)

Every run trains the same draft (sweeps/tiny.yaml's distill settings, `--steps` offline steps, a curve point
every 10, checkpoints every 100) into a fresh folder, one run at a time, the variants alternating so that a
change in machine load hits each. Ray is started once, before any timed run (the sweep starts it once too).

- `plain`: `python -c 'train_draft(...)'`, a new interpreter that imports torch and transformers and loads
  the models, as a Train worker must — the floor for a draft run in its own process.
- `ray_train`: `distill(...)` on the running Ray: controller, placement group, worker and helper actors,
  checkpoints through `ray.train.report`.
- `ray_train+data` (with `--data-callback`): the same with Train's own callbacks, among them the Ray Data one
  that starts a `DatasetManager` actor per run, which specray's runs leave out
  (`specray.distill.ray_2_60.torch_trainer`). Each run's callbacks are checked as its trainer is made.
- `ray_train+knobs` (with `--knobs`): the same with the Ray Train settings that the local runtime sets
  (`specray.cluster.runtime.LOCAL_TRAIN_ENV`) in the driver's environment, which Ray hands on to the
  controller and the workers as a runtime_env;
- `ray_train+inherited` (with `--knobs`): the same settings, inherited by every process of a Ray started
  with them in its environment, and none in the driver's (nothing handed on).
Each variant's settings are checked at run time by reading them back inside a Train worker.

Columns: wall seconds of the call; machine CPU seconds over the call (all processes: /proc/stat's busy
jiffies, since Ray's actors are not our children); "first point" is the wall seconds from the call to the
first curve point (start-up plus 10 steps); "after last" from the last curve point to the call's return
(the final checkpoint, its report, tear-down and publishing).

Needs the tiny zoo and the τ_kd shard: `specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ray.train.v2._internal import constants as rc

from benchmarks import REPO
from benchmarks.quick import tiny_or_quick
from specray.cluster.runtime import LOCAL_TRAIN_ENV, ray_session, train_env_seen_by_a_worker
from specray.config import SweepSpec

# the installed Ray's own defaults, read where Ray keeps them (not copied: they change between versions)
RAY_DEFAULTS = {
    rc.HEALTH_CHECK_INTERVAL_S_ENV_VAR: str(rc.DEFAULT_HEALTH_CHECK_INTERVAL_S),
    rc.ENABLE_PREEMPTION_WATCHER_ENV_VAR: str(int(rc.DEFAULT_ENABLE_PREEMPTION_WATCHER)),
}
PLAIN = """
import sys, time
from pathlib import Path
from transformers.utils import logging as hf_logging
from specray.config import SweepSpec
from specray.distill.loop import train_draft
from specray.draft import one_draft
hf_logging.disable_progress_bar()
spec = SweepSpec.model_validate_json(Path(sys.argv[1]).read_text())
start = time.perf_counter()
first = []
def report(curve):
    first.append(time.perf_counter() - start) if not first else None
    last[0] = time.perf_counter()
last = [0.0]
train_draft(one_draft(spec, "offline", {float(sys.argv[3]): 1.0}, Path(sys.argv[2])), report)
print(first[0], time.perf_counter() - last[0])
"""


def busy_cpu_s() -> float:
    """Machine-wide busy CPU seconds since boot (user, nice, system, irq, softirq, steal)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def plain_run(spec: SweepSpec, output: Path, tau_kd: float) -> tuple[float, float]:
    spec_file = output.parent / f"{output.name}.json"
    spec_file.write_text(spec.model_dump_json())
    done = subprocess.run(
        [sys.executable, "-c", PLAIN, str(spec_file), str(output), str(tau_kd)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    first, after = (float(x) for x in done.stdout.split()[-2:])
    return first, after


def ray_run(spec: SweepSpec, output: Path, tau_kd: float, data_callback: bool = False) -> tuple[float, float]:
    """`distill` of one draft; `data_callback`: its trainer with Train's own callbacks (the Ray Data one
    too), else specray's. Raises if a trainer was made otherwise."""
    from ray.train.torch import TorchTrainer

    from specray.distill import ray_train
    from specray.draft import one_draft

    lean = ray_train.torch_trainer
    made: list[bool] = []  # per trainer made: whether its callbacks hold the Ray Data one

    def trainer(*args: Any, **kwargs: Any) -> TorchTrainer:
        made_trainer = (TorchTrainer if data_callback else lean)(*args, **kwargs)
        callbacks = made_trainer._create_default_callbacks()  # type: ignore[attr-defined]
        made.append(any(type(c).__name__ == "DatasetsCallback" for c in callbacks))
        return made_trainer

    start = time.perf_counter()
    seen: list[float] = []
    ray_train.torch_trainer = trainer
    try:
        ray_train.distill(
            one_draft(spec, "offline", {tau_kd: 1.0}, output),
            report=lambda curve: seen.append(time.perf_counter()),
        )
    finally:
        ray_train.torch_trainer = lean
    if not made or set(made) != {data_callback}:
        raise RuntimeError(f"the run's trainers had the Ray Data callback {made}, expected {data_callback}")
    return seen[0] - start, time.perf_counter() - seen[-1]


def offline_spec(steps: int, quick: bool = False) -> SweepSpec:
    """sweeps/tiny.yaml's offline drafts at `steps` steps, a curve point every 10, a checkpoint per 100
    (`quick`: on the micro zoo, benchmarks/quick.py)."""
    overrides = [
        f"distill.steps={steps}",
        "distill.paradigms=[offline]",
        f"distill.checkpoint_every={min(100, steps)}",
        "distill.report_every=10",
    ]
    return tiny_or_quick(quick)(overrides)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default 100 (2 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument("--knobs", action="store_true", help="also time ray_train with LOCAL_TRAIN_ENV")
    parser.add_argument(
        "--data-callback", action="store_true", help="also time ray_train with Train's Ray Data callback"
    )
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    args.steps = args.steps or (2 if args.quick else 100)
    args.repeats = args.repeats or (1 if args.quick else 2)
    spec = offline_spec(args.steps, args.quick)
    variants = ["plain", "ray_train"] + (["ray_train+knobs", "ray_train+inherited"] if args.knobs else [])
    variants += ["ray_train+data"] if args.data_callback else []
    rows: dict[str, list[tuple[float, float, float, float]]] = {v: [] for v in variants}
    # Ray starts with the local settings in its environment (every process it starts inherits them); a
    # trainer hands the driver's values of these names on to its controller and workers (a runtime_env),
    # which override the inherited ones: Ray's defaults for `ray_train`, the local values for `+knobs`, and
    # nothing at all for `+inherited`, whose processes read what they inherited
    os.environ.update(LOCAL_TRAIN_ENV)
    with tempfile.TemporaryDirectory() as root, ray_session(spec.ray.model_copy(update={"address": None})):
        for repeat in range(args.repeats):
            for variant in variants:
                output = Path(root) / f"{variant}-{repeat}"
                for name in LOCAL_TRAIN_ENV:
                    os.environ.pop(name, None)
                if variant in ("plain", "ray_train", "ray_train+data"):
                    os.environ.update(RAY_DEFAULTS)
                elif variant.endswith("+knobs"):
                    os.environ.update(LOCAL_TRAIN_ENV)
                # a Train run of its own (quick: left out, tests/integration/test_runtime.py runs it)
                if repeat == 0 and variant != "plain" and not args.quick:
                    seen = train_env_seen_by_a_worker(Path(root) / f"seen-{variant}")
                    print(f"{variant}: a Train worker sees {seen}", flush=True)
                cpu, start = busy_cpu_s(), time.perf_counter()
                if variant == "plain":
                    first, after = plain_run(spec, output, args.tau_kd)
                else:
                    first, after = ray_run(spec, output, args.tau_kd, variant == "ray_train+data")
                wall, used = time.perf_counter() - start, busy_cpu_s() - cpu
                rows[variant].append((wall, used, first, after))
                print(
                    f"pass {repeat + 1} {variant:>19}: {wall:6.1f} s wall, {used:6.1f} CPU s, "
                    f"first point {first:5.1f} s, after last {after:5.1f} s",
                    flush=True,
                )
    print(f"\none offline draft, {args.steps} steps, best of {args.repeats} (by wall):")
    best = {v: min(r) for v, r in rows.items()}
    for variant, (wall, used, first, after) in best.items():
        print(
            f"  {variant:>19}: {wall:6.1f} s wall ({wall / best['plain'][0]:.2f}x plain), "
            f"{used:6.1f} CPU s ({used / best['plain'][1]:.2f}x), first point {first:5.1f} s, "
            f"after last {after:5.1f} s"
        )
    if args.repeats > 1:  # a start's CPU varies by several seconds from pass to pass: the mean too
        print(f"mean of {args.repeats}:")
        for variant, passes in rows.items():
            wall, used = (sum(column) / len(passes) for column in list(zip(*passes, strict=True))[:2])
            print(f"  {variant:>19}: {wall:6.1f} s wall, {used:6.1f} CPU s")


if __name__ == "__main__":
    main()
