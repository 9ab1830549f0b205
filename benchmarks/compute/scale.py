"""Paper-scale memory at a 32,000-token vocabulary: the streaming analytic estimator's peak memory at 64 vs
1,024 test prompts, and one online KD step's, chunked vs not.

    .venv/bin/python -m benchmarks.compute.scale [--only analytic|kd] [--threads 2]
        analytic: [--analytic-prompts 64 1024] [--new-tokens 128] [--analytic-batch 16]
        kd:       [--batch 8] [--seq 512] [--prompt 64] [--chunk 256]
    .venv/bin/python -m benchmarks.compute.scale --quick  # a smoke check: tiny shapes, a few tokens

Models: random-initialised Llama-shaped models built locally from `transformers.LlamaConfig` (no download),
vocabulary 32,000 (Llama-2's), fp32 on CPU. The student is a draft-sized model whose embedding and LM head
hold most of its weights, as in a real draft (default hidden 512, 4 layers: 45M parameters, 73% of them in
the embedding and the head); the teacher is a somewhat larger one of the same family (hidden 768, 6 layers).

`kd` measurement: one online KD step of `specray.distill.losses.ResponseLoss` (FKL, the loop's loss module)
on a batch of 8 × 512 tokens whose first 64 positions are prompt (not counted) and the rest response:
student forward, teacher forward (no grad), divergence, backward. No optimizer step (its state is the same
in both configurations). Each configuration runs in a fresh subprocess, so the number is that process's own
peak: `VmHWM` of /proc/self/status, the peak resident set size of the whole process — the Python
interpreter, torch and transformers, both models, the student's gradients, the batch and the step. Nothing
is subtracted from the ratio; the RSS just before the step (everything but the step) is printed beside it.
The children run with MALLOC_MMAP_THRESHOLD_=1048576 (see MMAP_THRESHOLD; `--default-malloc` to leave
glibc's defaults), so that RSS follows the memory the tensors really hold.

`analytic` measurement: `specray.specdec.analytic.AnalyticEstimator.betas` — β of one draft along the
target's continuations of N test prompts, the eval actor's analytic pass — with N = 64 and N = 1,024 prompts
of 16 tokens and 128 response tokens each, every one in a fresh subprocess (same `VmHWM` figure). The
models are small (target hidden 256, 2 layers; draft hidden 128, 1 layer: the vocabulary dominates either
way), so 1,024 prompts take minutes on 2 cores. The continuations are random token ids, not samples from the
target: the estimator's memory depends on their number and length, not on how they were made (sampling
them is `sample_continuations`, batch by batch as well). Beside the ratio it prints what the design before
streaming held for a whole (test set, τ_dec): the target's distributions, N × 128 × 32,000 fp32.

Prints, last: `analytic peak RSS N=1024 / N=64: <ratio>` (issue 15's goal: ≤ 1.3) and
`kd step peak memory chunked / unchunked: <ratio>` (goal: ≤ 0.35).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks import REPO

VOCAB = 32_000
# glibc's malloc raises its mmap threshold after the first large free (up to 32 MiB) and then serves smaller
# tensors from its heap, which it seldom gives back: peak RSS would then measure that caching pattern more
# than the tensors alive (measured: 128-token chunks peaked higher than 512-token ones). A fixed threshold
# gives every tensor of 1 MiB or more a mapping of its own, returned when freed, in every configuration.
MMAP_THRESHOLD = 2**20
ANALYTIC_PROMPT = 16  # prompt tokens per test prompt in the analytic measurement


def _peak_rss_gib() -> float:
    """This process's peak resident set size (VmHWM), GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def _llama(hidden: int, layers: int, seed: int):
    """A random-initialised Llama-shaped causal LM with Llama-2's vocabulary size, fp32."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        intermediate_size=hidden * 8 // 3 // 32 * 32 + 32,  # ≈ 8/3 × hidden, as in Llama
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config)


# ---------------------------------------------------------------- analytic: the streaming estimator


def analytic_child(args: argparse.Namespace) -> dict:
    """β of one draft along `args.prompts_n` random continuations in this (fresh) process."""
    import torch

    from specray.specdec.analytic import AnalyticEstimator
    from specray.specdec.continuations import Continuations

    torch.set_num_threads(args.threads)
    target = _llama(args.target_hidden, args.target_layers, seed=1).eval()
    draft = _llama(args.draft_hidden, args.draft_layers, seed=0).eval()
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (args.prompts_n, ANALYTIC_PROMPT + args.new_tokens), generator=generator)
    prompts, responses = ids[:, :ANALYTIC_PROMPT].tolist(), ids[:, ANALYTIC_PROMPT:].tolist()
    # no sampling-time logits: the target's distributions come from a teacher-forced pass per batch, as
    # for continuations read from the disk cache (every eval actor but the one that sampled them)
    estimator = AnalyticEstimator(target, Continuations(1.0, prompts, responses), 0, args.analytic_batch)
    before = _rss_gib()
    started = time.perf_counter()
    (betas,) = estimator.betas([draft])
    return {
        "peak_rss_gib": _peak_rss_gib(),
        "rss_before_gib": before,
        "seconds": time.perf_counter() - started,
        "acceptance_rate": float(betas.beta.double().sum() / betas.mask.sum()),
        "tokens": int(betas.mask.sum()),
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
    }


def analytic_ratio(args: argparse.Namespace) -> str:
    """The estimator at the small and the large test set, each in a fresh process; the ratio line."""
    small, large = args.analytic_prompts
    results = {n: _child("analytic", args, prompts_n=n) for n in (small, large)}
    first = results[small]
    print(
        f"target {first['target_parameters'] / 1e6:.1f}M parameters (hidden {args.target_hidden}, "
        f"{args.target_layers} layers), draft {first['draft_parameters'] / 1e6:.1f}M (hidden "
        f"{args.draft_hidden}, {args.draft_layers} layer(s)), vocab {VOCAB}, fp32, {args.threads} threads; "
        f"{ANALYTIC_PROMPT} prompt + {args.new_tokens} response tokens per prompt, batches of "
        f"{args.analytic_batch}"
    )
    for n, result in results.items():
        held = n * args.new_tokens * VOCAB * 4 / 2**30  # [N, T, vocab] fp32: the target's distributions
        print(
            f"  N={n:>5}: peak RSS {result['peak_rss_gib']:.2f} GiB (RSS before the pass "
            f"{result['rss_before_gib']:.2f} GiB), {result['tokens']} tokens in {result['seconds']:.0f} s, "
            f"acceptance {result['acceptance_rate']:.4f}; before streaming, the target's distributions "
            f"alone: {held:.2f} GiB"
        )
    ratio = results[large]["peak_rss_gib"] / results[small]["peak_rss_gib"]
    return f"analytic peak RSS N={large} / N={small}: {ratio:.3f}"


# ---------------------------------------------------------------- kd: one online KD step


def kd_child(args: argparse.Namespace) -> dict:
    """One KD step in this (fresh) process; returns the memory figures and the step's seconds."""
    import torch

    from specray.distill.losses import IGNORE_INDEX, ResponseLoss

    torch.set_num_threads(args.threads)
    student = _llama(args.student_hidden, args.student_layers, seed=0).train()
    teacher = _llama(args.teacher_hidden, args.teacher_layers, seed=1).eval().requires_grad_(False)
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(0, VOCAB, (args.batch, args.seq), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, args.prompt - 1 : -1] = input_ids[:, args.prompt :]  # the response, aligned with the logits
    loss = ResponseLoss("fkl", chunk_size=args.chunk)
    before = _rss_gib()
    started = time.perf_counter()
    total = loss(student, teacher, input_ids, attention_mask, labels)
    (total / loss.units(labels)).backward()
    return {
        "peak_rss_gib": _peak_rss_gib(),
        "rss_before_step_gib": before,
        "seconds": time.perf_counter() - started,
        "loss": float(total.detach()) / loss.units(labels),
        "student_parameters": sum(p.numel() for p in student.parameters()),
        "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
    }


def kd_ratio(args: argparse.Namespace) -> str:
    """Chunked and unchunked KD steps, each in a fresh process; the ratio line."""
    results = {chunk: _child("kd", args, chunk=chunk) for chunk in (0, args.chunk)}
    first = results[0]
    print(
        f"student {first['student_parameters'] / 1e6:.1f}M parameters (hidden {args.student_hidden}, "
        f"{args.student_layers} layers), teacher {first['teacher_parameters'] / 1e6:.1f}M (hidden "
        f"{args.teacher_hidden}, {args.teacher_layers} layers), vocab {VOCAB}, fp32, {args.threads} threads; "
        f"batch {args.batch} x {args.seq} tokens ({args.seq - args.prompt} counted per row)"
    )
    for chunk, result in results.items():
        name = "unchunked" if chunk == 0 else f"chunked ({chunk} tokens)"
        print(
            f"  {name:>22}: peak RSS {result['peak_rss_gib']:.2f} GiB (RSS before the step "
            f"{result['rss_before_step_gib']:.2f} GiB), step {result['seconds']:.1f} s, "
            f"loss {result['loss']:.6f}"
        )
    ratio = results[args.chunk]["peak_rss_gib"] / results[0]["peak_rss_gib"]
    return f"kd step peak memory chunked / unchunked: {ratio:.3f}"


# ---------------------------------------------------------------- plumbing

# name -> (child: runs in a fresh process and returns figures, ratio: runs the children, returns its line)
MEASUREMENTS: dict[str, tuple[Callable[[argparse.Namespace], dict], Callable[[argparse.Namespace], str]]] = {
    "analytic": (analytic_child, analytic_ratio),
    "kd": (kd_child, kd_ratio),
}


def _child(measurement: str, args: argparse.Namespace, **overrides: object) -> dict:
    """Run `measurement`'s child function in a fresh Python process with `overrides` on the arguments."""
    argv = [arg for key, value in (vars(args) | overrides).items() for arg in _flag(key, value)]
    command = [sys.executable, "-m", "benchmarks.compute.scale", "--child", measurement, *argv]
    env = dict(os.environ)
    if not args.default_malloc:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{measurement} child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


QUICK = {  # tiny shapes and a few tokens: every code path, no measurement
    "threads": 1,
    "batch": 1,
    "seq": 16,
    "prompt": 4,
    "chunk": 4,
    "student_hidden": 64,
    "student_layers": 1,
    "teacher_hidden": 64,
    "teacher_layers": 1,
    "analytic_prompts": [2, 4],
    "new_tokens": 4,
    "analytic_batch": 2,
    "target_hidden": 64,
    "target_layers": 1,
    "draft_hidden": 64,
}


def _flag(key: str, value: object) -> list[str]:
    if key in ("child", "only", "default_malloc", "quick") or value is None:
        return []
    if isinstance(value, list):
        return [f"--{key.replace('_', '-')}", *map(str, value)]
    return [f"--{key.replace('_', '-')}", str(value)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(MEASUREMENTS), help="one measurement (default: all)")
    parser.add_argument("--child", choices=sorted(MEASUREMENTS), help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a few tokens: a smoke check")
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help=f"children keep glibc's default malloc (no MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD})",
    )
    kd = parser.add_argument_group("kd: one online KD step")
    kd.add_argument("--batch", type=int, default=8)
    kd.add_argument("--seq", type=int, default=512, help="tokens per row, prompt included")
    kd.add_argument("--prompt", type=int, default=64, help="prompt tokens per row (not counted)")
    kd.add_argument("--chunk", type=int, default=256, help="distill.loss_chunk_size of the chunked run")
    kd.add_argument("--student-hidden", type=int, default=512)
    kd.add_argument("--student-layers", type=int, default=4)
    kd.add_argument("--teacher-hidden", type=int, default=768)
    kd.add_argument("--teacher-layers", type=int, default=6)
    analytic = parser.add_argument_group("analytic: streaming estimator peak RSS, N=SMALL vs N=LARGE")
    analytic.add_argument(
        "--analytic-prompts", type=int, nargs=2, default=[64, 1024], metavar=("SMALL", "LARGE")
    )
    analytic.add_argument("--prompts-n", type=int, default=64, help=argparse.SUPPRESS)  # one child's N
    analytic.add_argument("--new-tokens", type=int, default=128, help="response tokens per prompt")
    analytic.add_argument(
        "--analytic-batch",
        type=int,
        default=16,
        help="sequences per teacher-forced batch (EvalSettings.batch_size)",
    )
    analytic.add_argument("--target-hidden", type=int, default=256)
    analytic.add_argument("--target-layers", type=int, default=2)
    analytic.add_argument("--draft-hidden", type=int, default=128)
    analytic.add_argument("--draft-layers", type=int, default=1)
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.quick:
        vars(args).update(QUICK)
    if args.child is not None:
        child, _ = MEASUREMENTS[args.child]
        print(json.dumps(child(args)))
        return
    for name in [args.only] if args.only else list(MEASUREMENTS):
        _, ratio = MEASUREMENTS[name]
        print(ratio(args), flush=True)


if __name__ == "__main__":
    main()
