"""Speculative decoding benchmark: every ratio is measured side by side in one run on the same pair.

    .venv/bin/python -m benchmarks.specdec.decoder     # all three parts on the tiny zoo (cached on first use)
    .venv/bin/python -m benchmarks.specdec.decoder --parts hf  # only [1], ours vs HF at τ ∈ {0, 0.6, 1.0}
    .venv/bin/python -m benchmarks.specdec.decoder --quick     # a smoke check on a micro zoo

1. our exact speculative decoder vs transformers' assisted generation (`generate(assistant_model=...)`) at
   each τ_dec, through benchmarks/specdec/harness.py: the two are first checked to do the same work (γ drafted
   tokens per step, the temperature warper at τ and nothing else on each side, same prompts, seeds and
   length; `specray.specdec.hf_compare` lists the transformers traps this guards against), then timed side by
   side: wall time per emitted token, acceptance counted both ways, and the limit the measured forward-pass
   times and block efficiency allow. The last lines print `ours / HF` and `ours / limit` per τ;
2. analytic vs empirical estimator: time to reach a 95% half-width of 0.01 on `acceptance_rate` for one
   (draft, τ_dec) cell, projected from the measured variance (half-width ∝ 1/√n, time ∝ n);
3. seconds per grid cell when 22 drafts × 6 τ_dec are evaluated analytically with shared target passes.

`--quick` runs all three on the micro zoo with a few prompts, drafts and tokens: it checks that the code runs,
its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from benchmarks.quick import tiny_or_quick
from benchmarks.specdec.harness import Result, compare, profile_sides, report, summary
from specray.models.loading import load_model, load_tokenizer
from specray.models.zoo import build_zoo
from specray.specdec.analytic import AnalyticEstimator
from specray.specdec.continuations import Continuations, sample_continuations
from specray.specdec.cost import measure_step_costs
from specray.specdec.empirical import run_empirical
from specray.specdec.evaluator import EvalJob, EvalSettings, Evaluator
from specray.specdec.hf_compare import Comparison
from specray.specdec.records import StepCosts
from specray.sweep.plan import plan_sweep
from specray.sweep.stages import encode

TARGET_HALF_WIDTH = 0.01


def versus_hf_assisted(target, draft, tokenizer, prompts, args: argparse.Namespace) -> list[Result]:
    """[1] at each τ: checked like for like first (harness.compare refuses otherwise), then timed."""
    eos = tokenizer.eos_token_id if args.eos else None
    print(
        f"[1] ours vs HF generate(assistant_model=...): γ={args.gamma}, max_new_tokens={args.max_new_tokens} "
        f"({'stopping at EOS' if args.eos else 'EOS ignored: every decode is that long'}), {len(prompts)} "
        f"in-domain prompts with seeds 0..{len(prompts) - 1}, {args.rounds} rounds (the order of the two "
        f"decoders alternates), {torch.get_num_threads()} torch thread(s), "
        f"transformers {transformers.__version__}; HF generate() under "
        f"{'inference_mode' if args.hf_inference_mode else 'its own no_grad'}"
    )
    results = []
    for tau in args.taus:
        comparison = Comparison(
            tau,
            args.gamma,
            args.max_new_tokens,
            eos,
            tuple(tuple(p) for p in prompts),
            tuple(range(len(prompts))),
            tokenizer.pad_token_id,
        )
        # our decoder always runs under inference_mode; HF's generate() under no_grad unless asked
        with torch.inference_mode() if args.hf_inference_mode else contextlib.nullcontext():
            results.append(compare(target, draft, comparison, args.rounds))
        report(results[-1])
        if args.profile:
            profile_sides(target, draft, comparison, args.profile)
    return results


def analytic_vs_empirical(
    target,
    draft,
    tokenizer,
    prompts: list[list[int]],
    tau: float,
    n_empirical: int,
    max_new_tokens: int,
    costs: StepCosts,
) -> None:
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    started = time.perf_counter()
    continuations = sample_continuations(target, prompts, tau, max_new_tokens, eos, seed=3, pad_token_id=pad)
    sampling = time.perf_counter() - started
    started = time.perf_counter()
    estimator = AnalyticEstimator(target, continuations, pad)  # the logits kept while sampling
    target_pass = time.perf_counter() - started
    started = time.perf_counter()
    cached = Continuations(tau, continuations.prompts, continuations.responses)
    AnalyticEstimator(target, cached, pad)  # for reference: continuations read back from the disk cache
    forced_pass = time.perf_counter() - started
    started = time.perf_counter()
    analytic = asdict(estimator.evaluate(draft, 4, costs))
    draft_pass = time.perf_counter() - started
    started = time.perf_counter()
    empirical = asdict(
        run_empirical(target, draft, prompts[:n_empirical], tau, 4, max_new_tokens, eos, repeats=5, seed=3)
    )
    empirical_time = time.perf_counter() - started

    def projected(seconds: float, half_width: float) -> float:
        return seconds * (half_width / TARGET_HALF_WIDTH) ** 2

    analytic_full = projected(sampling + target_pass + draft_pass, analytic["acceptance_rate_ci95"])
    analytic_draft_only = projected(draft_pass, analytic["acceptance_rate_ci95"])
    empirical_full = projected(empirical_time, empirical["acceptance_rate_ci95"])
    a_ci, e_ci = analytic["acceptance_rate_ci95"], empirical["acceptance_rate_ci95"]
    print(
        f"[2] τ_dec={tau}: analytic α={analytic['acceptance_rate']:.3f} ±{a_ci:.3f} on {len(prompts)} prompts"
    )
    print(
        f"    (sample {sampling:.2f}s + target distributions kept from sampling {target_pass:.3f}s "
        f"+ draft pass {draft_pass:.3f}s; a teacher-forced target pass instead, as for cached "
        f"continuations, would take {forced_pass:.2f}s)"
    )
    print(
        f"    empirical α={empirical['acceptance_rate']:.3f} ±{e_ci:.3f} from {empirical['decodes']} decodes"
    )
    print(f"    ({empirical_time:.1f}s including the target-only baseline decodes)")
    print(
        f"    projected time to ±{TARGET_HALF_WIDTH}: analytic {analytic_full:.1f}s "
        f"(draft pass only, target work shared: {analytic_draft_only:.1f}s), empirical {empirical_full:.1f}s"
    )
    grid_share = projected((sampling + target_pass) / 23 + draft_pass, a_ci)
    print(f"    analytic with the target work shared by the 23 drafts of the tiny grid: {grid_share:.1f}s")
    print(
        f"    ratio analytic/empirical: {analytic_full / empirical_full:.4f} "
        f"(shared by 23 drafts: {grid_share / empirical_full:.4f}; draft pass only: "
        f"{analytic_draft_only / empirical_full:.4f})   (target ≤ 0.05)"
    )


def grid_seconds_per_cell(
    zoo, prompts: list[list[int]], n_drafts: int, taus: list[float], max_new_tokens: int
) -> None:
    """22 drafts (perturbed copies of the zoo draft, as distillation would produce) × 6 τ_dec."""
    settings = EvalSettings(
        repeats=1, max_new_tokens=max_new_tokens, empirical_prompts=1, step_costs=StepCosts.fixed(0.3)
    )
    tokenizer = load_tokenizer(str(zoo.draft))
    with tempfile.TemporaryDirectory() as tmp:
        # a fresh continuations cache: the target really samples once per τ_dec
        evaluator = Evaluator(str(zoo.target), {"test": prompts}, settings, continuations_dir=Path(tmp))
        paths = []
        for i in range(n_drafts):
            draft = load_model(str(zoo.draft))
            with torch.no_grad():
                for p in draft.parameters():
                    p.add_(torch.randn_like(p) * 0.01, alpha=float(i > 0))
            paths.append(str(Path(tmp) / f"draft{i}"))
            draft.save_pretrained(paths[-1])
            tokenizer.save_pretrained(paths[-1])
        first = rest = 0.0
        for tau in taus:  # grouped by τ_dec, as the eval pool orders cells
            for i, path in enumerate(paths):
                started = time.perf_counter()
                evaluator.evaluate([EvalJob(path, path, tau, "test", "analytic", gamma=4)])
                if i == 0:
                    first += time.perf_counter() - started  # samples the target at this τ_dec
                else:
                    rest += time.perf_counter() - started
        cells = n_drafts * len(taus)
    print(f"[3] {n_drafts} drafts × {len(taus)} τ_dec = {cells} cells on {len(prompts)} prompts")
    print(
        f"    first cell of each τ_dec (samples the target once) {first:.1f}s in all; "
        f"the other {cells - len(taus)} cells {rest:.1f}s"
    )
    print(
        f"    seconds per cell: {(first + rest) / cells:.3f} all-in, "
        f"{rest / (cells - len(taus)):.3f} per later cell"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a micro zoo, few prompts, drafts and rounds: a smoke check"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--parts", nargs="+", choices=["estimators", "grid", "hf"], default=["estimators", "grid", "hf"]
    )
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.6, 1.0], help="τ_dec for [1]")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=32, help="in-domain test prompts for [1]")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of [1] per τ")
    parser.add_argument("--eos", action="store_true", help="[1] stops at EOS (default: decode to the limit)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="[1] also profiles both sides: top N functions"
    )
    parser.add_argument(
        "--hf-inference-mode",
        action="store_true",
        help="[1] runs HF's generate() inside torch.inference_mode() too, as our decoder runs",
    )
    parser.add_argument(
        "--decode-threads",
        type=int,
        default=1,
        help="torch threads for [1]: batch-1 steps of a 5M model gain nothing from a second thread, and with "
        "one thread the process's CPU time is a measure that other engineers' load disturbs little",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    spec = tiny_or_quick(args.quick)(())
    zoo = build_zoo(spec.models.zoo)
    tokenizer = load_tokenizer(str(zoo.target))
    prompts = encode(plan := plan_sweep(spec), plan.prompt_sets["in_domain"], tokenizer, str(zoo.target))
    target, draft = load_model(str(zoo.target)), load_model(str(zoo.draft))
    machine = platform.processor() or platform.machine()
    print(f"machine: {machine}, torch {torch.__version__}, {torch.get_num_threads()} threads; zoo {zoo.root}")
    print(f"load average (1, 5, 15 min) at the start: {os.getloadavg()}")
    # quick: a few step pairs, whatever their interval (the full run measures to ±2%)
    cost = measure_step_costs(target, draft, prompts[:4], max_rounds=2 if args.quick else 200)
    print(f"step costs (measured): {cost.describe()}")
    n, tokens = (4, 8) if args.quick else (32, 48)
    if "estimators" in args.parts:
        analytic_vs_empirical(target, draft, tokenizer, prompts, 1.0, n // 2, tokens, cost)
    if "grid" in args.parts:
        if args.quick:
            grid_seconds_per_cell(zoo, prompts[:4], 3, [0.0, 1.0], tokens)
        else:
            grid_seconds_per_cell(zoo, prompts[:128], 22, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], tokens)
    if "hf" in args.parts:  # last, so that its summary lines end the output
        if args.quick:
            args.prompts, args.rounds = min(args.prompts, 2), 1
            args.taus, args.max_new_tokens = args.taus[-1:], min(args.max_new_tokens, 8)
        torch.set_num_threads(args.decode_threads)
        summary(versus_hf_assisted(target, draft, tokenizer, prompts[: args.prompts], args))


if __name__ == "__main__":
    main()
