"""bf16 on a CPU: does it speed the real model, and does it move acceptance?

On a CPU with bf16 matmul units (avx512_bf16 or AMX; `lscpu` lists them) torch runs bf16 matrix products
through oneDNN's bf16 kernels. This script measures, on the real pair (SmolLM2-135M-Instruct and a draft
for it), side by side in one run and in this process with one torch thread (a teacher replica's, a Train
worker's and an evaluator's setting):

- speed: the target's teacher-forced pass (8 rows of 232 tokens, the head on the last 48: the analytic
  estimator's and online KD's pass), batched sampling (8 rows, the teacher shards' and continuations'),
  one decoding step at batch 1 (speculative decoding's), and one training step of the draft — each in fp32,
  with bf16 weights (`models.target.dtype: bfloat16`), and for training under bf16 autocast with fp32
  master weights (`distill.cpu_autocast`);
- acceptance: the analytic acceptance rate α of the draft at τ_dec 0 and 1 on held-out GSM8K questions, once
  with both models in fp32 and once in bf16 (each pipeline samples its own continuations from its own
  target, same prompts and seeds), with the 95% bootstrap interval of α and of the paired difference
  (prompts resampled). bf16 is worth using when it is faster and the difference's interval lies inside α's.

    .venv/bin/python -m benchmarks.compute.bf16 [--draft DIR] [--prompts 48] [--quick]

The draft is a distilled draft folder, or by default the 2-layer cut of the target (un-distilled). Needs
the model fetched (`specray models fetch smollm2-135m-instruct`) and `data/gsm8k/test.jsonl`
(`scripts/fetch_data.sh`). `--quick` runs the same code on the tests' micro zoo and synthetic prompts.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from benchmarks import REPO
from specray.bootstrap import bootstrap_interval
from specray.ops import token_acceptance
from specray.specdec.continuations import forced_batches, response_probs, sample_continuations

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # as load_model names them


def best_seconds(work: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` runs after one warm-up (the least disturbed by anything else)."""
    work()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def forward_seconds(model, ids: torch.Tensor, keep: int, repeats: int) -> float:
    with torch.no_grad():
        return best_seconds(lambda: model(input_ids=ids, logits_to_keep=keep), repeats)


def sampling_tokens_per_s(model, ids: torch.Tensor, new_tokens: int, eos: int, repeats: int) -> float:
    mask = torch.ones_like(ids)

    def sample() -> None:
        with torch.no_grad():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                pad_token_id=eos,
            )

    return ids.shape[0] * new_tokens / best_seconds(sample, repeats)


def decode_ms(model, prompt: torch.Tensor, steps: int) -> float:
    """One token at batch 1 over a cached prompt, median of `steps` steps, in ms."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        cache, token, times = out.past_key_values, prompt[:, -1:], []
        for _ in range(steps):
            started = time.perf_counter()
            out = model(input_ids=token, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - started)
            cache = out.past_key_values
    return 1000 * statistics.median(times)


def train_step_seconds(draft, ids: torch.Tensor, keep: int, autocast: bool, repeats: int) -> float:
    """One optimizer step of the draft on the cross-entropy of its last `keep` positions."""
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-6)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = draft(input_ids=ids, logits_to_keep=keep).logits.float()
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, -keep:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return best_seconds(step, repeats)


def acceptance_per_prompt(target, draft, prompts, tau, new_tokens, eos, pad) -> np.ndarray:
    """α of each prompt: the mean of β_t over its response, its continuation sampled from `target`."""
    continuations = sample_continuations(target, prompts, tau, new_tokens, eos, seed=0, pad_token_id=pad)
    sums, counts = np.zeros(len(prompts)), np.zeros(len(prompts))
    with torch.no_grad():
        for batch in forced_batches(continuations, 8, pad):
            p, q = response_probs(target, batch, tau), response_probs(draft, batch, tau)
            beta = token_acceptance(p, q) * batch.valid  # [batch, T]
            for row, index in enumerate(batch.rows):
                sums[index] += float(beta[row].sum())
                counts[index] += float(batch.valid[row].sum())
    return sums / np.maximum(counts, 1)


def load_pair(args: argparse.Namespace):
    """(target folder, draft folder or a cut, tokenizer, prompts as token ids)."""
    from specray.models.loading import load_model, load_tokenizer

    if args.quick:
        return _quick_pair(args)
    from specray.data.chat import render_chat
    from specray.data.loaders import load_gsm8k
    from specray.models.derived import cut
    from specray.models.gguf import dequantised

    folder = str(dequantised("smollm2-135m-instruct"))
    tokenizer = load_tokenizer(folder)
    if args.draft:
        make_draft = lambda name: load_model(args.draft, DTYPES[name])  # noqa: E731
    else:
        make_draft = lambda name: cut(load_model(folder, "float32"), 2).to(getattr(torch, DTYPES[name]))  # noqa: E731
    questions = load_gsm8k(str(REPO / "data" / "gsm8k" / "test.jsonl"))[: args.prompts]
    texts = [render_chat(tokenizer, [q.instruction]) for q in questions]
    prompts = [ids for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return (lambda name: load_model(folder, DTYPES[name])), make_draft, tokenizer, prompts


def _quick_pair(args: argparse.Namespace):
    from benchmarks.quick import MICRO_ZOO
    from specray.config import ZooSpec
    from specray.data.synthetic import synthetic_corpus
    from specray.data.templates import format_prompt
    from specray.models.loading import load_model, load_tokenizer
    from specray.models.zoo import build_zoo

    zoo = build_zoo(ZooSpec(**MICRO_ZOO))
    tokenizer = load_tokenizer(str(zoo.target))
    texts = [format_prompt(e.instruction, e.input) for e in synthetic_corpus(args.prompts, seed=3)]
    prompts = tokenizer(texts)["input_ids"]
    target, draft = str(zoo.target), str(zoo.draft)
    return (
        (lambda n: load_model(target, DTYPES[n])),
        (lambda n: load_model(draft, DTYPES[n])),
        tokenizer,
        prompts,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft", help="a draft folder (default: the target's 2-layer cut)")
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.new_tokens, args.repeats = 6, 8, 1
    torch.set_num_threads(1)
    torch.manual_seed(0)
    target_of, draft_of, tokenizer, prompts = load_pair(args)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    models = {name: (target_of(name), draft_of(name)) for name in DTYPES}
    vocab = models["fp32"][0].config.vocab_size
    rows, keep = (8, 48) if not args.quick else (2, 4)
    ids = torch.randint(0, vocab, (rows, 232 if not args.quick else 32))
    print(f"one torch thread; {len(prompts)} prompts, {args.new_tokens} new tokens; best of {args.repeats}")
    speed: dict[str, dict[str, float]] = {}
    for name, (target, draft) in models.items():
        speed[name] = {
            "forward_s": forward_seconds(target, ids, keep, args.repeats),
            "sampling_tok_s": sampling_tokens_per_s(target, ids[:, :100], keep, eos, args.repeats),
            "target_decode_ms": decode_ms(target, ids[:1], 20),
            "draft_decode_ms": decode_ms(draft, ids[:1], 20),
        }
    train_fp32 = draft_of("fp32").train()
    speed["fp32"]["train_step_s"] = train_step_seconds(train_fp32, ids, keep, False, args.repeats)
    speed["bf16"]["train_step_s"] = train_step_seconds(train_fp32, ids, keep, True, args.repeats)
    for what in speed["fp32"]:
        fp32, bf16 = speed["fp32"][what], speed["bf16"][what]
        faster = bf16 / fp32 if what == "sampling_tok_s" else fp32 / bf16
        print(f"  {what:18s} fp32 {fp32:9.3f}  bf16 {bf16:9.3f}  bf16 {faster:.2f}x as fast")
    for tau in (0.0, 1.0):
        alphas = {
            name: acceptance_per_prompt(target, draft, prompts, tau, args.new_tokens, eos, pad)
            for name, (target, draft) in models.items()
        }
        n, a32, a16 = len(prompts), alphas["fp32"], alphas["bf16"]
        fp32 = bootstrap_interval(lambda i, a=a32: a[i].mean(axis=-1), n)
        bf16 = bootstrap_interval(lambda i, a=a16: a[i].mean(axis=-1), n)
        diff = bootstrap_interval(lambda i, a=a32, b=a16: (b[i] - a[i]).mean(axis=-1), n)
        half = (fp32[2] - fp32[1]) / 2
        inside = "inside" if max(abs(diff[1]), abs(diff[2])) <= half else "NOT inside"
        print(
            f"τ_dec={tau:g}: α fp32 {fp32[0]:.4f} [{fp32[1]:.4f}, {fp32[2]:.4f}]  bf16 {bf16[0]:.4f} "
            f"[{bf16[1]:.4f}, {bf16[2]:.4f}]  bf16 - fp32 {diff[0]:+.4f} [{diff[1]:+.4f}, {diff[2]:+.4f}] "
            f"({inside} ±{half:.4f}, α's own half-width)"
        )
    f = speed
    print(
        f"bf16 / fp32 speed: forward {f['fp32']['forward_s'] / f['bf16']['forward_s']:.2f}x, sampling "
        f"{f['bf16']['sampling_tok_s'] / f['fp32']['sampling_tok_s']:.2f}x, training "
        f"{f['fp32']['train_step_s'] / f['bf16']['train_step_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
