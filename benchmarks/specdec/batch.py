"""The batch-aware speedup model against measured wall time: modelled / measured at each (B, τ).

    .venv/bin/python -m benchmarks.specdec.batch  # B ∈ {1, 4, 16}, τ ∈ {0, 1}, γ = 4, tiny zoo
    .venv/bin/python -m benchmarks.specdec.batch --draft DIR  # a distilled draft (one of a sweep's drafts)
    .venv/bin/python -m benchmarks.specdec.batch --quick  # a smoke check on a micro zoo

First the step costs are timed as a sweep times them (`specdec.cost.measure_step_costs`: T_t(B, 1),
T_t(B, γ+1), T_d(B) and the prefills, on the un-distilled draft at τ = 1). Then, at every (B, τ), B rows are
decoded side by side both ways for a fixed number of steps with every row busy throughout (no EOS, no length
limit reached: the steady state of a server's batch at load B): speculative decoding (batch 1: `decoder.py`;
B > 1: `batched.py`) and target-only decoding of the same rows with the same seeds. Per round:

    measured = (new tokens per row / speculative wall time) / (steps per row / target-only wall time)
    modelled = the same throughput ratio from the step costs and the round's own counts:
               [L / (S·(T_t(B,1) + d·t_token) + P_t + P_d)] / [M / (M·T_t(B,1) + P_t)]

with L the new tokens per row in S speculative steps, d the drafts per row per step, M the target-only steps,
t_token = T_d(B) + (T_t(B,γ+1) − T_t(B,1))/γ (`records.CostTerms`). The model sees only the costs timed
beforehand and the round's counts (E = L/S, d), never the round's times. Printed per (B, τ): the two
speedups, modelled / measured with its 95% interval over rounds (t-interval), and E. Target: modelled /
measured within [0.9, 1.1] at every point.

`--quick` runs the same code on the micro zoo with B ∈ {1, 2} and a few steps: it checks that the code runs,
its ratios mean nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from benchmarks.quick import tiny_or_quick
from specray.models.loading import load_model, load_tokenizer
from specray.models.zoo import build_zoo
from specray.specdec.batched import batched_autoregressive_decode, batched_speculative_decode
from specray.specdec.cost import mean_interval, measure_step_costs
from specray.specdec.decoder import DecodeStats, autoregressive_decode, speculative_decode
from specray.specdec.records import StepCosts
from specray.sweep.plan import plan_sweep
from specray.sweep.stages import encode


def _decode(target, draft, rows: list[list[int]], tau: float, gamma: int, steps: int, seed: int):
    """(speculative stats per row, target-only stats per row, speculative wall, target-only wall)."""
    limit = 10 * steps * (gamma + 1)  # never reached: both sides run exactly `steps` steps, every row busy
    device = target.device

    def gens() -> list[torch.Generator]:
        return [torch.Generator(device=device).manual_seed(seed * 1000 + i) for i in range(len(rows))]

    started = time.perf_counter()
    if len(rows) == 1:
        spec = [
            speculative_decode(target, draft, rows[0], tau, gamma, limit, None, gens()[0], max_steps=steps)
        ]
    else:
        spec = batched_speculative_decode(target, draft, rows, tau, gamma, limit, None, gens(), steps)
    spec_wall = time.perf_counter() - started
    started = time.perf_counter()
    if len(rows) == 1:
        alone = [autoregressive_decode(target, rows[0], tau, limit, None, gens()[0], max_steps=steps)]
    else:
        alone = batched_autoregressive_decode(target, rows, tau, limit, None, gens(), steps)
    alone_wall = time.perf_counter() - started
    return [d.stats for d in spec], [d.stats for d in alone], spec_wall, alone_wall


def _round(
    costs: StepCosts,
    batch: int,
    gamma: int,
    spec: list[DecodeStats],
    alone: list[DecodeStats],
    spec_wall: float,
    alone_wall: float,
) -> tuple[float, float, float]:
    """(measured, modelled, E) of one round."""
    tokens = statistics.fmean(s.emitted for s in spec)  # L per row
    steps = max(s.target_calls for s in spec)  # S: the batch's steps (every row ran all of them)
    drafted = statistics.fmean(s.drafted for s in spec) / steps  # d per row per step
    plain = max(s.target_calls for s in alone)  # M
    measured = (tokens / spec_wall) / (plain / alone_wall)
    t = costs.terms(gamma, batch)
    spec_time = steps * (t.target_step + drafted * t.per_drafted_token) + t.prefill_target + t.prefill_draft
    alone_time = plain * t.target_step + t.prefill_target
    modelled = (tokens / spec_time) / (plain / alone_time)
    return measured, modelled, tokens / steps


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="micro zoo, a few steps: a smoke check")
    parser.add_argument("--draft", default=None, help="a draft model folder (default: the zoo's draft)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--steps", type=int, default=24, help="verification steps per timed decode")
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per (B, τ)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.quick:
        args.batch_sizes, args.steps, args.rounds = [1, 2], 4, 2
    torch.set_num_threads(args.threads)
    spec = tiny_or_quick(args.quick)(())
    zoo = build_zoo(spec.models.zoo)
    tokenizer = load_tokenizer(str(zoo.target))
    prompts = encode(plan := plan_sweep(spec), plan.prompt_sets["in_domain"], tokenizer, str(zoo.target))
    target, draft = load_model(str(zoo.target)), load_model(args.draft or str(zoo.draft))
    print(
        f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; target {zoo.target}, draft {args.draft or zoo.draft}"
    )
    print(f"load average (1, 5, 15 min) at the start: {os.getloadavg()}")
    widest = max(args.batch_sizes)
    costs = measure_step_costs(
        target,
        draft,
        prompts[:widest],
        args.batch_sizes,
        [args.gamma],
        max_rounds=2 if args.quick else 200,
    )
    print(f"step costs: {costs.describe()}")
    for b in args.batch_sizes:
        by_k = costs.target[b]
        print(
            f"  B={b:3d}: T_t(B,1) {1e3 * by_k[1].seconds:.3f} ms, T_t(B,{args.gamma + 1}) "
            f"{1e3 * by_k[args.gamma + 1].seconds:.3f} ms, T_d(B) {1e3 * costs.draft[b].seconds:.3f} ms, "
            f"P_t {1e3 * costs.prefill_target[b].seconds:.2f} ms, "
            f"P_d {1e3 * costs.prefill_draft[b].seconds:.2f} ms"
        )
    print(f"{'B':>4} {'τ':>4} {'E':>6} {'measured':>9} {'modelled':>9} {'modelled/measured':>18}")
    worst = 0.0
    for b in args.batch_sizes:
        rows = [prompts[i % len(prompts)] for i in range(b)]
        _decode(target, draft, rows, 1.0, args.gamma, 2, seed=99)  # warm-up at this shape
        for tau in args.taus:
            rounds = [
                _round(costs, b, args.gamma, *_decode(target, draft, rows, tau, args.gamma, args.steps, r))
                for r in range(args.rounds)
            ]
            measured = statistics.fmean(m for m, _, _ in rounds)
            modelled = statistics.fmean(m for _, m, _ in rounds)
            ratio = mean_interval([mo / me for me, mo, _ in rounds])
            e = statistics.fmean(x for _, _, x in rounds)
            worst = max(worst, abs(ratio.seconds - 1.0))
            print(
                f"{b:>4} {tau:>4g} {e:>6.2f} {measured:>9.3f} {modelled:>9.3f} "
                f"{ratio.seconds:>10.3f} ± {ratio.ci95:.3f}"
            )
    print(f"load average at the end: {os.getloadavg()}")
    points = len(args.batch_sizes) * len(args.taus)
    print(f"modelled / measured: worst |ratio - 1| = {worst:.3f} over {points} points")


if __name__ == "__main__":
    main()
