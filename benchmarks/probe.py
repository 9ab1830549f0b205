"""The acceptance probe against what it was: its cost in one distillation, its figures beside the old ones.

    .venv/bin/python benchmarks/probe.py [--paradigm offline] [--tau-kd 1.0] [OVERRIDE ...]
    .venv/bin/python benchmarks/probe.py --quick   # a smoke check on a micro zoo (benchmarks/quick.py)

One draft through the plain train loop (`train_draft`, one process, 1 torch thread = a Ray Train worker's
CPU) at sweeps/tiny.yaml's settings and report cadence. Wherever the loop runs the probe
(`specray/distill/probe.py`: every τ_dec from one pass of the draft over cached prompts), the same draft is
also scored by the old probe — an `AnalyticEstimator` per τ_dec over its own `sample_continuations`, the
eval's path, which is what the probe was — so both see the very same weights. Printed:

- per probed step and τ_dec, α old and new, their difference, and the probe's own 95% interval (the
  delta-method half-width over its prompts, `analytic.ratio_ci95`): the new figures must sit well inside it;
- the cost: seconds to build each probe and per report, and the probe's share of the draft's wall time —
  measured for the new probe, and for the old one as it ran (built once, every report scored).

Needs the tiny zoo and the τ_kd shard: `specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch
from quick import tiny_or_quick
from transformers.utils import logging as hf_logging

from specray.distill import probe as probe_module
from specray.distill.curves import CurvePoint
from specray.distill.loop import train_draft
from specray.draft import one_draft
from specray.specdec.analytic import AnalyticEstimator, ratio_ci95
from specray.specdec.continuations import sample_continuations


class OldProbe:
    """The probe as it was: one `AnalyticEstimator` per τ_dec, its target side kept (`keep_target`)."""

    def __init__(self, target, prompts, taus_dec, max_new_tokens, eos_token_id, pad_token_id, seed=0):
        self.estimators = {
            float(tau): AnalyticEstimator(
                target,
                sample_continuations(target, prompts, tau, max_new_tokens, eos_token_id, seed, pad_token_id),
                pad_token_id,
                keep_target=True,
            )
            for tau in taus_dec
        }

    @torch.no_grad()
    def __call__(self, draft) -> dict[float, tuple[float, list[int], list[float]]]:
        """Per τ_dec: α, per-prompt tokens and β sums."""
        was_training = draft.training
        draft.eval()
        out = {}
        for tau, estimator in self.estimators.items():
            betas = estimator.betas([draft])[0]
            tokens, sums = betas.mask.sum(dim=1), (betas.beta.double() * betas.mask).sum(dim=1)
            out[tau] = (float(sums.sum() / tokens.sum()), tokens.tolist(), sums.tolist())
        draft.train(was_training)
        return out


class Recorder:
    """Wraps the loop's probe: times it, and scores every draft it scores with the old probe too."""

    def __init__(self) -> None:
        self.seconds = {"new build": 0.0, "new reports": 0.0, "old build": 0.0, "old reports": 0.0}
        self.old: list[dict] = []
        self.reports = 0
        build, score = probe_module.AcceptanceProbe.__init__, probe_module.AcceptanceProbe.__call__
        recorder = self

        def init(probe, target, *args) -> None:
            started = time.perf_counter()
            build(probe, target, *args)
            recorder.seconds["new build"] += time.perf_counter() - started
            started = time.perf_counter()
            probe.old = OldProbe(target, *args)
            recorder.seconds["old build"] += time.perf_counter() - started

        def call(probe, draft):
            started = time.perf_counter()
            new = score(probe, draft)
            recorder.seconds["new reports"] += time.perf_counter() - started
            started = time.perf_counter()
            recorder.old.append(probe.old(draft))
            recorder.seconds["old reports"] += time.perf_counter() - started
            return new

        probe_module.AcceptanceProbe.__init__ = init  # type: ignore[method-assign]
        probe_module.AcceptanceProbe.__call__ = call  # type: ignore[method-assign]


def side_by_side(curves: list[CurvePoint], old: list[dict]) -> float:
    """Prints old and new α per probed step and τ_dec; returns the largest |Δ| / the probe's interval."""
    probed = [point for point in curves if point.acceptance]
    assert len(probed) == len(old), "one old score per probed report"
    print("| step | τ_dec | α old | α new | |Δ| | probe's 95% interval (±) | tokens equal |")
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    worst = 0.0
    for point, before in zip(probed, old, strict=True):
        for tau, alpha in point.acceptance.items():
            old_alpha, old_tokens, old_sums = before[tau]
            sums = point.per_prompt[tau]
            interval = ratio_ci95(torch.tensor(old_sums), torch.tensor(old_tokens, dtype=torch.float64))
            delta = abs(alpha - old_alpha)
            if delta > 0:  # an interval of 0 (or none, one prompt) leaves no room for any difference
                worst = max(worst, delta / interval if interval > 0 else math.inf)
            same = list(sums.tokens) == old_tokens
            shown = f"{old_alpha:.6f} | {alpha:.6f} | {delta:.1e} | {interval:.4f} | {same}"
            print(f"| {point.step} | {tau:g} | {shown} |")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paradigm", default="offline", choices=["offline", "online"])
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    parser.add_argument("overrides", nargs="*", help="spec overrides, e.g. distill.steps=200")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    quick = ["distill.steps=8", "distill.online_steps=8", "distill.report_every=1"] if args.quick else []
    spec = tiny_or_quick(args.quick)([*quick, "eval.empirical_temperatures=[]", *args.overrides])
    recorder = Recorder()
    with tempfile.TemporaryDirectory() as root:
        started = time.perf_counter()
        curves = train_draft(one_draft(spec, args.paradigm, {args.tau_kd: 1.0}, Path(root) / "draft")).curves
        wall = time.perf_counter() - started
    worst = side_by_side(curves, recorder.old)
    s, probed = recorder.seconds, len(recorder.old)
    new_wall = wall - s["old build"] - s["old reports"]  # the draft as it runs without the old probe
    old_per_report = s["old reports"] / probed
    old_total = s["old build"] + old_per_report * len(curves)  # the old loop scored every report
    print(f"\n{args.paradigm}, τ_kd {args.tau_kd:g}, {spec.distill.steps_for(args.paradigm)} steps:")
    new_per_report = s["new reports"] / probed
    print(f"  new probe: build {s['new build']:.2f} s, {new_per_report * 1000:.1f} ms per report, ", end="")
    print(f"{probed} of {len(curves)} reports")
    print(
        f"  old probe: build {s['old build']:.2f} s, {old_per_report * 1000:.1f} ms per report, every report"
    )
    old_wall = new_wall - s["new build"] - s["new reports"] + old_total
    print(f"the probe's figures: largest |Δα| = {worst:.1e} of the probe's own 95% interval")
    print(
        f"the probe's share of the draft: {(s['new build'] + s['new reports']) / new_wall:.3f} of its wall "
        f"time ({old_total / old_wall:.3f} for the old probe)"
    )


if __name__ == "__main__":
    main()
