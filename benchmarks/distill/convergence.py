"""One draft's acceptance-vs-KD-step curve on the tiny zoo: its last-quarter slope and its CPU time.

    .venv/bin/python -m benchmarks.distill.convergence [--paradigm online] [--tau-kd 1.0] [--steps 400]
                                                       [OVERRIDE ...]
    .venv/bin/python -m benchmarks.distill.convergence --quick   # a smoke check on a micro zoo

Runs the plain train loop (`specray.distill.loop.train_draft`, one process, no Ray, 1 torch thread = one Ray
Train worker's CPU) with sweeps/tiny.yaml's settings and any spec overrides (`distill.lr=1e-3`,
`distill.teacher_cache_mb=0`, ...), a curve point every steps/20 steps; prints the probe's mean acceptance
per point where the loop probes (every point of the last quarter, a few before: `convergence.probe_due`),
the convergence verdict (`specray/distill/convergence.py`) and the run's wall and CPU seconds (process CPU
time: on a shared machine it is what a quiet machine would take, give or take cache effects).
Setup (model loading, the probe's target side, kept teacher states) and the probes are included.

Needs the tiny zoo and the τ_kd shard: `specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from benchmarks.quick import tiny_or_quick
from specray.distill.convergence import convergence, mean_acceptance
from specray.distill.inputs import prepare_inputs
from specray.distill.loop import train_draft
from specray.draft import one_draft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paradigm", default="online", choices=["offline", "online"])
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=None, help="default 400 (8 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    parser.add_argument("overrides", nargs="*", help="spec overrides, e.g. distill.lr=1e-3")
    args = parser.parse_args()
    args.steps = args.steps or (8 if args.quick else 400)
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    every = max(1, args.steps // 20)
    steps = [
        f"distill.steps={args.steps}",
        f"distill.online_steps={args.steps}",  # tiny.yaml trains online drafts longer
        f"distill.report_every={every}",
        f"distill.checkpoint_every={args.steps}",
    ]
    spec = tiny_or_quick(args.quick)([*steps, *args.overrides])
    mixture = {args.tau_kd: 1.0}
    inputs = prepare_inputs(one_draft(spec, args.paradigm, mixture, Path("draft")))
    wall, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as root:
        curves = train_draft(
            one_draft(spec, args.paradigm, mixture, Path(root) / "draft"), inputs=inputs
        ).curves
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    for point in curves:
        loss = f"{point.loss:.3f}" if point.loss is not None else "  -  "
        alpha = mean_acceptance(point)  # None where the loop did not probe (`convergence.probe_due`)
        shown = f"{alpha:.4f}" if alpha is not None else "  -  "
        print(f"step {point.step:5d}  loss {loss}  mean probe acceptance {shown}")
    found = convergence(curves)
    setting = f"{args.paradigm}, τ_kd={args.tau_kd:g}, lr={spec.distill.lr:g}, {' '.join(args.overrides)}"
    print(f"\n{setting}: {found.describe() if found else 'too few points for a slope'}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s ({cpu / args.steps:.3f} CPU s per step, all-in)")


if __name__ == "__main__":
    main()
