"""Each heavy stage's achieved FLOP/s against this machine's measured fp32 matmul peak.

    .venv/bin/python -m benchmarks.compute.stages [--threads 1] [--steps 40] [--zoo-threads 2]
    .venv/bin/python -m benchmarks.compute.stages --quick   # a smoke check on a micro zoo

Prints one table: stage, seconds, GFLOP, GFLOP/s and the fraction of the peak measured at the same thread
count. The stages are the work `make demo` spends its time on, on the tiny zoo at sweeps/tiny.yaml's settings:

- zoo pre-training: `zoo.pretrain` on the target's recipe (batch 32 × 128 tokens, AdamW) for `--steps`
  steps from a fresh init, on `--zoo-threads` threads (the CLI's own process builds the zoo, all cores);
- offline and online distillation: `--steps` optimizer steps of `train_draft` (τ_kd 1.0; online with its
  kept teacher states and on-policy samples, which are part of its steps), timed by the loop's curve
  windows (the probe and checkpoints excluded);
- the acceptance probe: building it (the target's continuations at 8 τ_dec) and one report;
- teacher generation: the transformers engine, 128 prompts at τ 1.0, batch 64, 48 new tokens;
- eval, analytic: the estimator's pass over 128 prompts' continuations (target and draft teacher-forced,
  as when the continuations come from the disk cache);
- eval, empirical: batch-1 speculative decoding (γ 4, τ 1.0) of 8 prompts — latency-bound by design.

FLOPs are counted by `torch.utils.flop_counter.FlopCounterMode` over the very same work in a separate,
untimed run (runs are deterministic): matrix products and attention, forward and backward. Elementwise
ops, softmaxes, the optimizer and Python are not counted — the fraction of peak says how much of a stage's
time is arithmetic in matrix products. The peak is the best of several timed [n, n] @ [n, n] fp32 products
(n = 1,024 and 2,048) on the same threads: what this CPU's BLAS reaches at shapes far larger than the
stages' ([~1,000, 128] @ [128, 344] for a draft's layer), so small models sit well below it.

Needs the tiny zoo and the τ_kd 1.0 shard: `specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from benchmarks.quick import tiny_or_quick
from specray.config import SweepSpec

TAU = 1.0


def matmul_peak(threads: int, sizes: tuple[int, ...] = (1024, 2048), repeats: int = 5) -> float:
    """FLOP/s of the best fp32 [n, n] @ [n, n] on `threads` threads."""
    torch.set_num_threads(threads)
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up: the BLAS's buffers and threads
        for _ in range(repeats):
            started = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - started))
    return best


def counted(work: Callable[[], object]) -> float:
    """The FLOPs `work` runs (matrix products and attention, forward and backward)."""
    with FlopCounterMode(display=False) as counter:
        work()
    return float(counter.get_total_flops())


def timed(work: Callable[[], object]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


# ---------------------------------------------------------------- the stages


def zoo_pretraining(spec: SweepSpec, steps: int) -> tuple[float, float]:
    """`steps` steps of the target's pre-training recipe from a fresh init; (seconds, FLOPs)."""
    from specray.models.sources import resolve_model_path
    from specray.models.zoo import build_model, corpus_texts, packed_tokens, pretrain, shape_of

    zoo = spec.models.zoo
    shape = shape_of(zoo, "target").model_copy(update={"train_steps": steps})
    tokenizer = PreTrainedTokenizerFast.from_pretrained(resolve_model_path(spec.models.target, spec.models))
    recipe = zoo.model_copy(update={"corpus_size": min(zoo.corpus_size, 2000)})  # shapes set the cost
    stream = packed_tokens(corpus_texts(recipe), tokenizer)

    def run() -> None:
        torch.manual_seed(0)
        pretrain(build_model(shape, tokenizer, zoo.seq_len), stream, shape, zoo, "target")

    return timed(run), counted(run)


def distillation(spec: SweepSpec, paradigm: str, steps: int, root: Path) -> tuple[float, float]:
    """`steps` optimizer steps of the train loop; (seconds of the steps alone, FLOPs of the steps)."""
    import specray.distill.loop as loop
    from specray.distill.inputs import prepare_inputs
    from specray.draft import one_draft

    def draft(name: str):
        return one_draft(spec, paradigm, {TAU: 1.0}, root / name)

    inputs = prepare_inputs(draft(paradigm))
    flops = [0.0]
    step = loop._train_step

    def counting_step(run, number, window) -> None:
        flops[0] += counted(lambda: step(run, number, window))

    loop._train_step = counting_step  # the counting run: untimed
    try:
        loop.train_draft(draft(f"{paradigm}-counted"), inputs=inputs)
    finally:
        loop._train_step = step
    curves = loop.train_draft(draft(paradigm), inputs=inputs).curves
    last = curves[-1]
    assert last.seconds_per_step is not None and last.step == steps
    return last.seconds_per_step * steps, flops[0]


def _models(spec: SweepSpec):
    from specray.models.loading import load_model, load_tokenizer
    from specray.models.sources import resolve_model_path

    target_path = resolve_model_path(spec.models.target, spec.models)
    draft_path = resolve_model_path(spec.models.draft, spec.models)
    return load_model(target_path), load_model(draft_path), load_tokenizer(target_path), target_path


def _test_prompts(spec: SweepSpec, tokenizer, count: int) -> list[list[int]]:
    from specray.data.dataset import build_splits
    from specray.data.templates import encode_prompts

    return encode_prompts(build_splits(spec.data)["in_domain_test"][:count], tokenizer, spec.data)


def probe(spec: SweepSpec) -> dict[str, tuple[float, float]]:
    import specray.distill.probe as probe_module
    from specray.distill.inputs import prepare_inputs
    from specray.draft import one_draft

    target, draft, tokenizer, _ = _models(spec)
    e = spec.eval
    prompts = prepare_inputs(one_draft(spec, "offline", {TAU: 1.0}, Path("unused"))).probe_prompts
    settings = (e.temperatures, e.max_new_tokens, tokenizer.eos_token_id, tokenizer.pad_token_id, e.seed)

    def build() -> probe_module.AcceptanceProbe:
        probe_module._BUILT.clear()  # what a fresh process pays, not the process's kept target side
        return probe_module.AcceptanceProbe(target, prompts, *settings)

    build_seconds = timed(build)
    built = build()
    built(draft)  # warm-up
    taus = f"{len(e.temperatures)} τ_dec"
    return {
        f"probe: build ({taus})": (build_seconds, counted(build)),
        f"probe: one report ({taus})": (timed(lambda: built(draft)), counted(lambda: built(draft))),
    }


def teacher_generation(spec: SweepSpec, prompts: int = 128) -> tuple[float, float]:
    from specray.data.dataset import build_splits
    from specray.data.templates import format_prompt
    from specray.teacher.engines import TransformersEngine
    from specray.teacher.generation import GenerationRequest

    _, _, _, target_path = _models(spec)
    engine = TransformersEngine(target_path, batch_size=spec.teacher.batch_size)
    train = build_splits(spec.data)["train"][:prompts]
    limit = spec.teacher.max_new_tokens
    requests = [
        GenerationRequest(str(i), format_prompt(x.instruction, x.input), TAU, 0, limit)
        for i, x in enumerate(train)
    ]
    engine.generate(requests[:8])  # warm-up
    return timed(lambda: engine.generate(requests)), counted(lambda: engine.generate(requests))


def eval_analytic(spec: SweepSpec, prompts: int = 128) -> tuple[float, float]:
    from specray.specdec.analytic import AnalyticEstimator
    from specray.specdec.continuations import sample_continuations

    target, draft, tokenizer, _ = _models(spec)
    ids = _test_prompts(spec, tokenizer, prompts)
    e, pad = spec.eval, tokenizer.pad_token_id
    continuations = sample_continuations(target, ids, TAU, e.max_new_tokens, tokenizer.eos_token_id, 0, pad)
    continuations = type(continuations)(TAU, continuations.prompts, continuations.responses)  # no logits

    def run() -> None:
        AnalyticEstimator(target, continuations, pad).betas([draft])

    run()  # warm-up
    return timed(run), counted(run)


def eval_empirical(spec: SweepSpec, prompts: int = 8) -> tuple[float, float]:
    from specray.specdec.decoder import speculative_decode

    target, draft, tokenizer, _ = _models(spec)
    ids = _test_prompts(spec, tokenizer, prompts)
    e = spec.eval

    def run() -> None:
        for i, prompt in enumerate(ids):
            generator = torch.Generator().manual_seed(i)
            speculative_decode(
                target, draft, prompt, TAU, e.gamma[0], e.max_new_tokens, tokenizer.eos_token_id, generator
            )

    run()  # warm-up
    return timed(run), counted(run)


# ---------------------------------------------------------------- the table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="default 40 (2 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every stage but the zoo's")
    parser.add_argument("--zoo-threads", type=int, default=None, help="default: every core")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    steps = args.steps or (2 if args.quick else 40)
    zoo_threads = args.zoo_threads or os.cpu_count() or 1
    hf_logging.disable_progress_bar()
    overrides = [
        f"distill.steps={steps}",
        f"distill.online_steps={steps}",
        f"distill.report_every={steps}",
        f"distill.checkpoint_every={steps}",
        "eval.empirical_temperatures=[]",
    ]
    spec = tiny_or_quick(args.quick)(overrides)
    print(f"{os.cpu_count()} cores, load average before: {os.getloadavg()[0]:.2f}", flush=True)
    peaks = {threads: matmul_peak(threads) for threads in sorted({args.threads, zoo_threads})}
    rows: dict[str, tuple[float, float, int]] = {}
    torch.set_num_threads(zoo_threads)
    rows[f"zoo pre-training ({steps} steps)"] = (*zoo_pretraining(spec, steps), zoo_threads)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as root:
        for paradigm in ("offline", "online"):
            rows[f"{paradigm} distillation ({steps} steps)"] = (
                *distillation(spec, paradigm, steps, Path(root)),
                args.threads,
            )
    rows |= {name: (*value, args.threads) for name, value in probe(spec).items()}
    rows["teacher generation (128 prompts)"] = (*teacher_generation(spec), args.threads)
    rows["eval, analytic (128 prompts, 1 draft)"] = (*eval_analytic(spec), args.threads)
    rows["eval, empirical (8 prompts, batch 1)"] = (*eval_empirical(spec), args.threads)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    shown = ", ".join(f"{peaks[t] / 1e9:.1f} GFLOP/s on {t} thread(s)" for t in sorted(peaks))
    print(f"\nfp32 matmul peak: {shown}")
    print("| stage | threads | seconds | GFLOP | GFLOP/s | fraction of peak |")
    print("|---|---:|---:|---:|---:|---:|")
    fraction = {}
    for name, (seconds, flops, threads) in rows.items():
        rate = flops / seconds
        fraction[name.split(" (")[0]] = rate / peaks[threads]
        print(
            f"| {name} | {threads} | {seconds:.3f} | {flops / 1e9:.2f} | {rate / 1e9:.1f} | "
            f"{rate / peaks[threads]:.3f} |"
        )
    print(
        f"\ndistillation steps at {fraction['offline distillation']:.3f} (offline) and "
        f"{fraction['online distillation']:.3f} (online) of the fp32 matmul peak"
    )


if __name__ == "__main__":
    main()
