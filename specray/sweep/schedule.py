"""How a sweep's distillations share the cluster: how many Train runs fit side by side, and which drafts each
run trains, in order."""

from __future__ import annotations

from collections.abc import Sequence

import ray

from specray.config import SweepSpec
from specray.sweep.plan import DraftPlan

# an online step's cost in offline steps: it also samples from the student and runs the teacher
# (benchmarks/README.md has the tiny sweep's timings and the command that measures them)
ONLINE_STEP_COST = 2.0


def concurrent_runs(spec: SweepSpec) -> int:
    """How many distillations fit side by side on the cluster (Ray still decides where each goes)."""
    d = spec.distill
    cpus = ray.cluster_resources().get("CPU", 1.0)
    per_run = max(d.workers * d.num_cpus_per_worker, 1e-9)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    by_gpu = gpus / (d.workers * d.num_gpus_per_worker) if d.num_gpus_per_worker else float("inf")
    return max(1, int(min(cpus / per_run, by_gpu)))


def split_runs(spec: SweepSpec, plans: Sequence[DraftPlan], runs: int) -> list[list[DraftPlan]]:
    """The drafts shared out among `runs` Train runs, each list in the order its run trains them.

    Longest first onto the least loaded run (LPT: the last draft to end is a short one, and the runs end
    close together), a draft's cost estimated as its steps, an online step counting ONLINE_STEP_COST
    offline ones (it also samples from the student and runs the teacher). The same plans and run count
    always give the same runs, which is what lets a re-run after the driver died find each run's folder
    and resume it (`ray_train.distill_drafts`); drafts that are finished are skipped inside their run."""

    def cost(plan: DraftPlan) -> float:
        steps = spec.distill.steps_for(plan.paradigm or "")
        return steps * (ONLINE_STEP_COST if plan.paradigm == "online" else 1.0)

    lanes: list[list[DraftPlan]] = [[] for _ in range(max(1, min(runs, len(plans))))]
    loads = [0.0] * len(lanes)
    for plan in sorted(plans, key=lambda p: (-cost(p), p.name)):
        lightest = loads.index(min(loads))
        lanes[lightest].append(plan)
        loads[lightest] += cost(plan)
    return [lane for lane in lanes if lane]
