"""Several drafts in one Ray Train run against one run per draft: wall and machine CPU seconds, side by side.

    .venv/bin/python -m benchmarks.distill.train_runs [--drafts 4] [--steps 100] [--repeats 2]
    .venv/bin/python -m benchmarks.distill.train_runs --quick   # a smoke check on a micro zoo

Both variants train the same `--drafts` offline drafts, one per τ_kd from the highest of tiny.yaml's
teacher temperatures down (distinct drafts: a run would publish a second draft of the same key from the
first one's checkpoint without training it), with sweeps/tiny.yaml's distill settings (`--steps` steps,
a curve point every 10, one checkpoint per 100 steps) on one Ray started before any timed run, with the local
Ray Train settings the sweep uses (`specray.cluster.runtime.LOCAL_TRAIN_ENV`), one variant at a time and
alternating, each into fresh folders:

- `a run per draft`: `distill(...)` once per draft, one after another — what the sweep did per slot before
  `distill_drafts`;
- `one run`: `distill_drafts(...)` with all the drafts — what each of the sweep's slots does now.

Columns: wall seconds, machine CPU seconds over the call (/proc/stat's busy jiffies: Ray's actors are not our
children), and the drafts' own seconds as their completion markers record them (the loop's time in the
worker, from a draft's setup to its publication). The difference is what Ray Train's start costs per run.

Needs the tiny zoo and the τ_kd shards: `specray generate sweeps/tiny.yaml` (`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.distill.train_overhead import busy_cpu_s, offline_spec
from specray.cluster.runtime import ray_session
from specray.distill.checkpoints import FINISHED_FILE
from specray.distill.ray_train import distill, distill_drafts
from specray.draft import one_draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafts", type=int, default=None, help="default 4 (2 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="default 100 (2 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    args.drafts = args.drafts or (2 if args.quick else 4)
    args.steps = args.steps or (2 if args.quick else 100)
    args.repeats = args.repeats or (1 if args.quick else 2)
    spec = offline_spec(args.steps, args.quick)
    taus = sorted(spec.teacher.temperatures, reverse=True)[: args.drafts]
    variants = ("a run per draft", "one run")
    rows: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as root, ray_session(spec.ray.model_copy(update={"address": None})):
        for repeat in range(args.repeats):
            for variant in variants:
                folder = Path(root) / f"{variant.replace(' ', '-')}-{repeat}"
                jobs = [one_draft(spec, "offline", {tau: 1.0}, folder / f"tau_kd={tau:g}") for tau in taus]
                cpu, start = busy_cpu_s(), time.perf_counter()
                if variant == "one run":
                    distill_drafts(spec, jobs)
                else:
                    for job in jobs:
                        distill(job)
                wall, used = time.perf_counter() - start, busy_cpu_s() - cpu
                own = sum(json.loads((j.folder / FINISHED_FILE).read_text())["seconds"] for j in jobs)
                rows[variant].append((wall, used, own))
                print(
                    f"pass {repeat + 1} {variant:>15}: {wall:6.1f} s wall, {used:6.1f} CPU s, "
                    f"drafts' own {own:6.1f} s",
                    flush=True,
                )
    print(f"\n{args.drafts} offline drafts, {args.steps} steps each, best of {args.repeats} (by wall):")
    best = {v: min(r) for v, r in rows.items()}
    base_wall, base_cpu, _ = best["a run per draft"]
    for variant, (wall, used, own) in best.items():
        print(
            f"  {variant:>15}: {wall:6.1f} s wall ({wall / base_wall:.2f}x), {used:6.1f} CPU s "
            f"({used / base_cpu:.2f}x), drafts' own {own:6.1f} s; "
            f"{(wall - own) / args.drafts:5.1f} s wall per draft outside its own work"
        )


if __name__ == "__main__":
    main()
