"""Distillation throughput: training tokens/s of offline (SeqKD) and online KD on the tiny zoo, and the ratio.

    .venv/bin/python -m benchmarks.distill.throughput [--steps 30] [--repeats 2] [--threads 1] [--tau-kd 1.0]
    .venv/bin/python -m benchmarks.distill.throughput --quick   # a smoke check on a micro zoo

Both paradigms run the plain train loop (`specray.distill.loop.train_draft`, one process, no Ray) for
`--steps` steps each (online too, whatever tiny.yaml's online_steps) on the same spec — sweeps/tiny.yaml's
distill settings (batch 16, λ = 0.5, max_new_tokens 48, FKL) — the same τ_kd shard and the same rows (the
row plan depends only on the seed), alternating offline/online `--repeats` times so
that a change in machine load hits both; the best run of each is reported. tokens/s counts every non-padding
token the student trains on (prompt + response) per second of training steps; for online KD a step also
pays for sampling the on-policy half from the student and for the teacher's forward pass, which is the cost
the ratio measures. The acceptance probe and checkpoint writing are excluded from the timed steps.

With `--heads`, it compares instead the two ways the loss applies the LM heads, offline, alternating:
`distill.loss_chunk_size=0` (the full [batch, seq, vocab] logits, prompt positions included: what every
micro-batch under the chunk size got before) against the default (the heads on response positions only).

Needs the tiny zoo and the τ_kd shard: `specray generate sweeps/tiny.yaml teacher.temperatures=[1.0]`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from benchmarks.quick import tiny_or_quick
from specray.config import SweepSpec
from specray.distill.inputs import DistillInputs, prepare_inputs
from specray.distill.loop import train_draft
from specray.draft import one_draft

PARADIGMS = ("offline", "online")


def run_once(spec: SweepSpec, paradigm: str, tau_kd: float, inputs: DistillInputs, root: Path) -> dict:
    """One run; its last curve point covers every step (report_every = steps)."""
    output = root / f"{paradigm}-{len(list(root.iterdir()))}"
    return train_draft(one_draft(spec, paradigm, {tau_kd: 1.0}, output), inputs=inputs).curves[-1].to_json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default 30 (3 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 = one Ray worker's CPU)")
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument("--heads", action="store_true", help="offline: full logits vs response positions")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    args.steps = args.steps or (3 if args.quick else 30)
    args.repeats = args.repeats or (1 if args.quick else 2)
    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    overrides = [
        f"distill.steps={args.steps}",
        f"distill.online_steps={args.steps}",  # tiny.yaml trains online drafts longer: same steps here
        f"distill.report_every={args.steps}",
        f"distill.checkpoint_every={args.steps}",
        "eval.temperatures=[1.0]",  # the probe is not timed; one τ_dec keeps the run short
        "eval.empirical_temperatures=[]",
    ]
    spec = tiny_or_quick(args.quick)(overrides)
    if args.heads:
        compare_heads(spec, args)
        return
    inputs = {p: prepare_inputs(one_draft(spec, p, {args.tau_kd: 1.0}, Path("draft"))) for p in PARADIGMS}
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for paradigm in PARADIGMS:
                curve = run_once(spec, paradigm, args.tau_kd, inputs[paradigm], Path(root))
                rate = curve["tokens_per_s"]
                print(f"pass {repeat + 1} {paradigm:>7}: {rate:8.0f} tokens/s, loss {curve['loss']:.3f}")
                if rate > best.get(paradigm, {}).get("tokens_per_s", 0.0):
                    best[paradigm] = curve
    d = spec.distill
    setting = (
        f"{args.steps} steps x batch {d.batch_size}, λ={d.onpolicy_fraction:g}, {args.threads} thread(s)"
    )
    print(f"\ntiny zoo, τ_kd={args.tau_kd:g}, {setting}, best of {args.repeats}:")
    for paradigm in PARADIGMS:
        curve = best[paradigm]
        print(
            f"  {paradigm:>7}: {curve['tokens_per_s']:8.0f} tokens/s, {curve['seconds_per_step']:.3f} s/step"
        )
    per_token = best["offline"]["tokens_per_s"] / best["online"]["tokens_per_s"]
    per_step = best["online"]["seconds_per_step"] / best["offline"]["seconds_per_step"]
    print(f"online/offline cost ratio: {per_token:.2f}x per trained token ({per_step:.2f}x per step)")


def compare_heads(spec: SweepSpec, args: argparse.Namespace) -> None:
    """Offline s/step with the full logits (loss_chunk_size 0) and with the heads on responses only."""
    full = spec.distill.model_copy(update={"loss_chunk_size": 0})
    variants = {"full logits": spec.model_copy(update={"distill": full}), "response positions": spec}
    inputs = prepare_inputs(one_draft(spec, "offline", {args.tau_kd: 1.0}, Path("draft")))
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(args.repeats):
            for name, variant in variants.items():
                curve = run_once(variant, "offline", args.tau_kd, inputs, Path(root))
                step, loss = curve["seconds_per_step"], curve["loss"]
                print(f"pass {repeat + 1} {name:>18}: {step:.4f} s/step, loss {loss:.6f}")
                if step < best.get(name, {}).get("seconds_per_step", float("inf")):
                    best[name] = curve
    base = best["full logits"]["seconds_per_step"]
    setting = f"{args.steps} steps, {args.threads} thread(s), best of {args.repeats}"
    print(f"\noffline, τ_kd={args.tau_kd:g}, {setting}:")
    for name, curve in best.items():
        step, loss = curve["seconds_per_step"], curve["loss"]
        print(f"  {name:>18}: {step:.4f} s/step ({step / base:.2f}x), loss {loss:.6f}")


if __name__ == "__main__":
    main()
