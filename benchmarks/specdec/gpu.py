"""Our speculative decoder vs transformers' assisted generation on a GPU, through the same checked harness.

    python3 -m benchmarks.specdec.gpu  # CUDA: 1.1B target, 68M draft, bf16 (< 5 min on an H100)
    python3 -m benchmarks.specdec.gpu --device cpu --small  # the same code on CPU, tiny shapes
    python3 -m benchmarks.specdec.gpu --quick  # the smallest smoke run, on CUDA if there is one

The pair is built here from random weights (no download): a Llama-shaped target with TinyLlama-1.1B's shapes
(22 layers, hidden 2048, GQA 32/4 heads) and a draft with llama-68m's (2 layers, hidden 768), both with a
32,000-token vocabulary, in bf16 (what a GPU serves in; our warp and HF's verification both compute the
softmax in fp32). Random weights make the acceptance rates arbitrary, but the harness measures what they
are, and the cost-model limit uses the measured block efficiency. Prompts are random token ids, with EOS
ignored so every decode is `--max-new-tokens` long.

For each τ_dec in {0, 0.6, 1.0}: the comparison is checked first (benchmarks/specdec/harness.py: γ drafted
tokens per step, only the temperature warper at τ on each side, same prompts/seeds/length), then timed side
by side; then the target alone decodes the same prompts (tokens/s of plain autoregressive decoding, for the
speedup).
It prints tokens/s of each, the measured cost ratio c, acceptance both ways, and on the last lines
`ours / HF` and `ours / limit` per τ.

Runs from the repository root on a bare machine with torch and transformers (specray need not be
installed): imports no ray, mlflow or pydantic (specray.config).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.specdec.harness import Result, compare, report, summary
from specray.specdec.decoder import autoregressive_decode
from specray.specdec.hf_compare import Comparison

VOCAB = 32_000
FIELDS = (  # LlamaConfig's names for the numbers of a shape below
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
)
SHAPES = {  # (layers, hidden, intermediate, heads, kv heads)
    "target": (22, 2048, 5632, 32, 4),  # TinyLlama-1.1B
    "draft": (2, 768, 3072, 12, 12),  # JackFram/llama-68m
    "small_target": (2, 128, 256, 4, 2),
    "small_draft": (1, 64, 128, 2, 2),
}


def build(name: str, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A random-init Llama built directly on the device (a 1.1B init on CPU would take minutes)."""
    shape = dict(zip(FIELDS, SHAPES[name], strict=True))
    config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=2048, tie_word_embeddings=False, **shape)
    torch.manual_seed(seed)
    with device:
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=None, help="cuda (default) or cpu (only with --small)")
    parser.add_argument("--small", action="store_true", help="tiny shapes and few tokens: a smoke run")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="--small with one τ, one prompt and 6 tokens, on CUDA if torch sees it, else on CPU",
    )
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default=None, help="default bf16 on CUDA")
    parser.add_argument("--taus", type=float, nargs="+", default=[0.0, 0.6, 1.0])
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=None, help="default 4 (2 with --small)")
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (12 with --small)")
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (1 with --small)")
    args = parser.parse_args()
    if args.quick:
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        args.small, args.taus = True, args.taus[1:2]
        args.prompts, args.max_new_tokens, args.rounds = args.prompts or 1, args.max_new_tokens or 6, 1
    args.device = args.device or "cuda"
    # the defaults keep an H100 run under 5 minutes: HF's eager 1.1B forward is ~20 ms a token at batch 1
    args.prompts = args.prompts or (2 if args.small else 4)
    args.max_new_tokens = args.max_new_tokens or (12 if args.small else 64)
    args.rounds = args.rounds or (1 if args.small else 2)
    return args


def target_only(target, comparison: Comparison) -> float:
    """Tokens/s of the target decoding alone: same prompts, seeds, τ and length, our decoder's loop."""
    started, tokens = time.perf_counter(), 0
    for prompt, seed in zip(comparison.prompts, comparison.seeds, strict=True):
        generator = torch.Generator(device=target.device).manual_seed(seed)
        decoded = autoregressive_decode(
            target, list(prompt), comparison.tau, comparison.max_new_tokens, None, generator
        )
        tokens += len(decoded.tokens)
    return tokens / (time.perf_counter() - started)


def print_throughput(result: Result, baseline_tokens_per_s: float) -> None:
    last = result.rounds[-1].wall
    ours, hf = 1000 / last.ours_ms, 1000 / last.hf_ms
    print(
        f"    tokens/s (last round): ours {ours:.1f}, HF {hf:.1f}, target alone {baseline_tokens_per_s:.1f} "
        f"(speedup ours {ours / baseline_tokens_per_s:.2f}x, HF {hf / baseline_tokens_per_s:.2f}x); "
        f"c = {last.steps.cost_ratio:.3f}"
    )


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "benchmarks/specdec/gpu.py needs a CUDA GPU and torch.cuda.is_available() is False here.\n"
            "For a CPU smoke run of the same code: python -m benchmarks.specdec.gpu --device cpu --small"
        )
    if device.type == "cpu" and not args.small:
        sys.exit("on CPU the 1.1B pair would take hours: add --small for the smoke run")
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny shapes; two threads on a shared 2-core machine spin at barriers
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    prefix = "small_" if args.small else ""
    started = time.perf_counter()
    target = build(prefix + "target", device, dtype, seed=0)
    draft = build(prefix + "draft", device, dtype, seed=1)
    sizes = [sum(p.numel() for p in m.parameters()) / 1e6 for m in (target, draft)]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"device: {name}; torch {torch.__version__}, transformers {transformers.__version__}; {dtype}; "
        f"target {sizes[0]:.1f}M and draft {sizes[1]:.1f}M parameters, vocab {VOCAB}, random init "
        f"(built in {time.perf_counter() - started:.1f}s); load average {os.getloadavg()[0]:.2f}"
    )
    generator = torch.Generator().manual_seed(1234)
    prompts = tuple(
        tuple(torch.randint(3, VOCAB, (args.prompt_length,), generator=generator).tolist())
        for _ in range(args.prompts)
    )
    print(
        f"γ={args.gamma}, {args.prompts} random prompts of {args.prompt_length} tokens, "
        f"max_new_tokens={args.max_new_tokens} (EOS ignored), {args.rounds} timed rounds per τ"
    )
    results = []
    for tau in args.taus:
        comparison = Comparison(
            tau, args.gamma, args.max_new_tokens, None, prompts, tuple(range(len(prompts))), 0
        )
        results.append(compare(target, draft, comparison, args.rounds))
        report(results[-1])
        print_throughput(results[-1], target_only(target, comparison))
    summary(results)


if __name__ == "__main__":
    main()
