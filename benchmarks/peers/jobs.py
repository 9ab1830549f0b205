"""The measurements of benchmarks/peers/compare.py, one per fresh process (`compare.py --job`): a draft
trained by specray's `train_draft` or by TRL (trl_side.py), and the teacher engine against `model.generate`
(evaluation.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from specray.config import SweepSpec
from specray.draft import one_draft


def _timed_probe() -> dict[str, float]:
    """Wall and CPU seconds spent in the acceptance probe (building it and every report), from now on."""
    from specray.distill.probe import AcceptanceProbe

    spent = {"wall": 0.0, "cpu": 0.0}

    def timed(method):
        def wrapper(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                spent["wall"] += time.perf_counter() - wall
                spent["cpu"] += time.process_time() - cpu

        return wrapper

    AcceptanceProbe.__init__ = timed(AcceptanceProbe.__init__)  # type: ignore[method-assign]
    AcceptanceProbe.__call__ = timed(AcceptanceProbe.__call__)  # type: ignore[method-assign]
    return spent


def specray_job(spec: SweepSpec, paradigm: str, tau_kd: float, output: Path) -> dict:
    """One draft through `train_draft`, end to end (reading the shard, setup, training, probes, checkpoints,
    publishing); s/step and tokens from its curve points, which time the optimizer steps alone; the probe's
    share of the draft's wall and CPU time."""
    from specray.distill.loop import train_draft

    probe = _timed_probe()
    started, cpu = time.perf_counter(), time.process_time()
    result = train_draft(one_draft(spec, paradigm, {tau_kd: 1.0}, output))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    points, previous = [], 0
    for point in result.curves:
        if point.seconds_per_step is not None and point.tokens_per_s is not None:
            steps = point.step - previous
            points.append(
                (steps, point.seconds_per_step * steps, point.tokens_per_s * point.seconds_per_step)
            )
        previous = point.step
    step_seconds = sum(p[1] for p in points)
    tokens = sum(p[0] * p[2] for p in points)
    probed = sum(1 for point in result.curves if point.acceptance)
    return {
        "seconds": seconds,
        "steps": result.steps,
        "step_seconds_total": step_seconds,
        "tokens": tokens,
        "probe share": probe["wall"] / seconds,
        "probe share (CPU)": probe["cpu"] / cpu,
        "probes": probed,
    }


def trl_job(spec: SweepSpec, paradigm: str, tau_kd: float, output: Path) -> dict:
    from benchmarks.peers.trl_side import run_trl
    from specray.models.sources import resolve_model_path

    draft = resolve_model_path(spec.models.draft, spec.models)
    target = resolve_model_path(spec.models.target, spec.models)
    return run_trl(spec, paradigm, tau_kd, output, draft, target)


def teacher_job(spec: SweepSpec, batch: int, prompts: int, tau: float, hf_first: bool) -> dict:
    from benchmarks.peers.evaluation import compare_generate

    return compare_generate(spec, batch, prompts, tau, hf_first)
