"""benchmarks/peers/compare.py's two measurements that need no TRL: teacher data from the pool's
transformers engine against batched `model.generate`, and the quality of finished drafts.

`compare_generate`: the same prompts — the sweep's train split in its template (`data.template`), encoded as
the engine encodes a shard's request (a chat prompt holds its own special tokens) — cut into the same
length-sorted batches the engine makes, sampled at the same τ with the same `max_new_tokens` and EOS ids, the
target loaded once in `models.target.dtype` (as the teacher pool loads it). `generate` gets `do_sample`,
`temperature`, `top_k=0` and `top_p=1.0` (its defaults or the model's generation_config would otherwise add a
top-k of 50), and the logits processors it builds are recorded and checked: only the temperature warper at τ,
none at τ ∈ {0, 1}, as in `specray/specdec/hf_compare.py`. Tokens/s count response tokens up to and with each
row's first EOS (what a shard keeps); `generate` keeps decoding a batch until its last row stops, and that
time is its own.

`draft_quality`: held-out teacher rows (the in-domain test prompts, one teacher sample each at τ_kd, seeded
apart from the shards; the target in `models.target.dtype`) give each draft's cross-entropy and forward KL per
response token (specray's loss functions; the teacher's logits kept at the response positions only, so a
real vocabulary fits); specray's analytic estimator (`AcceptanceProbe`) gives α at τ_dec 0 and 1 on the same
prompts.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specray.config import SweepSpec
from specray.data.dataset import build_splits
from specray.data.templates import encode_prompts, prompt_text
from specray.distill.data import TrainRow, collate
from specray.distill.losses import IGNORE_INDEX, per_token_divergence, response_cross_entropy_sum
from specray.distill.probe import AcceptanceProbe
from specray.models.loading import load_model, load_tokenizer
from specray.models.sources import resolve_model_path
from specray.sampling import left_pad
from specray.specdec.continuations import sample_continuations
from specray.specdec.hf_compare import MisconfiguredComparison, expected_processors
from specray.teacher.engines import TransformersEngine
from specray.teacher.generation import GenerationRequest

HELD_OUT_SEED = 1_000_003  # teacher samples for the held-out rows: not the shards' stream


def _generate_batches(
    engine: TransformersEngine, prompt_ids: list[list[int]], batch: int, tau: float, limit: int
):
    """`model.generate` over the engine's batches; (response tokens, the processors each call built)."""
    model, eos = engine.model, sorted(engine.eos_token_ids)
    pad = engine.tokenizer.pad_token_id
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    seen: set[tuple] = set()
    get_processors = model._get_logits_processor

    def recorded(*args, **kwargs):
        built = get_processors(*args, **kwargs)
        seen.add(tuple((type(p).__name__, getattr(p, "temperature", None)) for p in built))
        return built

    model._get_logits_processor = recorded
    sampling = dict(do_sample=True, temperature=tau, top_k=0, top_p=1.0) if tau > 0 else dict(do_sample=False)
    tokens = 0
    try:
        for start in range(0, len(order), batch):
            input_ids, mask = left_pad([prompt_ids[i] for i in order[start : start + batch]], pad)
            torch.manual_seed(start)
            out = model.generate(
                input_ids,
                attention_mask=mask,
                max_new_tokens=limit,
                eos_token_id=eos,
                pad_token_id=pad,
                **sampling,
            )
            for row in out[:, input_ids.shape[1] :].tolist():
                stops = [k for k, token in enumerate(row) if token in eos]
                tokens += stops[0] + 1 if stops else len(row)
    finally:
        del model._get_logits_processor
    return tokens, seen


def compare_generate(spec: SweepSpec, batch: int, prompts: int, tau: float, hf_first: bool) -> dict:
    """Tokens/s of the engine and of `generate` on the same requests (one warm-up batch each, untimed)."""
    ref = spec.models.target
    target = resolve_model_path(ref, spec.models)
    engine = TransformersEngine(target, ref.dtype, ref.trust_remote_code, batch_size=batch)
    limit, template = spec.teacher.max_new_tokens, spec.data.template
    examples = build_splits(spec.data)["train"][:prompts]
    special = template == "alpaca"  # a chat text writes its own BOS (`teacher/shards.py`)
    requests = [
        GenerationRequest(e.id, prompt_text(e, template, engine.tokenizer), tau, 0, limit, special)
        for e in examples
    ]
    prompt_ids = [engine.tokenizer(r.prompt, add_special_tokens=special)["input_ids"] for r in requests]
    engine.generate(requests[:batch])
    _generate_batches(engine, prompt_ids[:batch], batch, tau, limit)
    rates, counts, seen = {}, {}, set()
    for side in ("generate", "engine") if hf_first else ("engine", "generate"):
        started = time.perf_counter()
        if side == "engine":
            counts[side] = sum(len(r.response_token_ids) for r in engine.generate(requests))
        else:
            counts[side], seen = _generate_batches(engine, prompt_ids, batch, tau, limit)
        rates[side] = counts[side] / (time.perf_counter() - started)
    if seen != {expected_processors(tau)}:
        raise MisconfiguredComparison(
            f"generate built processors {seen}, expected {expected_processors(tau)}"
        )
    dtype = str(next(engine.model.parameters()).dtype).removeprefix("torch.")
    check = (
        f"model.generate: sampling τ={tau:g}, top_k 0, top_p 1, logits processors "
        f"{sorted(seen)[0] or 'none'}, max_new_tokens {limit}, the engine's EOS ids and length-sorted "
        f"batches; {len(requests)} {template}-template prompts as the engine encodes them; the target in "
        f"{dtype} (models.target.dtype {ref.dtype})"
    )
    return {
        "engine": rates["engine"],
        "generate": rates["generate"],
        "engine_tokens": counts["engine"],
        "generate_tokens": counts["generate"],
        "check": check,
    }


def _held_out(spec: SweepSpec, target, tokenizer, tau_kd: float):
    prompts = encode_prompts(build_splits(spec.data)["in_domain_test"], tokenizer, spec.data)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    samples = sample_continuations(
        target, prompts, tau_kd, spec.teacher.max_new_tokens, eos, HELD_OUT_SEED, pad, keep_logits=False
    )
    rows = [
        TrainRow(tuple(p), tuple(r), tau_kd) for p, r in zip(prompts, samples.responses, strict=True) if r
    ]
    batches = [collate(rows[i : i + 32], pad) for i in range(0, len(rows), 32)]
    with torch.no_grad():  # the logits at the response positions only: [counted, vocab] per batch
        teacher = [
            target(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[b.labels != IGNORE_INDEX]
            for b in batches
        ]
    probe = AcceptanceProbe(target, prompts, [0.0, 1.0], spec.eval.max_new_tokens, eos, pad, spec.eval.seed)
    return batches, teacher, probe


@torch.no_grad()
def _quality(path: str, batches, teacher_logits, probe: AcceptanceProbe) -> dict:
    draft = load_model(path, "float32")
    ce = fkl = units = 0.0
    for batch, teacher in zip(batches, teacher_logits, strict=True):
        logits = draft(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        ce += float(response_cross_entropy_sum(logits, batch.labels)[0])
        counted = batch.labels != IGNORE_INDEX
        fkl += float(per_token_divergence("fkl")(logits[counted], teacher).sum())
        units += float(counted.sum())
    alpha, _ = probe(draft)
    return {"ce": ce / units, "fkl": fkl / units, "alpha": alpha}


def draft_quality(spec: SweepSpec, tau_kd: float, drafts: dict) -> dict:
    """CE and FKL on held-out teacher rows and analytic α at τ_dec 0 and 1, per draft and for the
    un-distilled one."""
    ref = spec.models.target
    target_path = resolve_model_path(ref, spec.models)
    target = load_model(target_path, ref.dtype, ref.trust_remote_code)  # as specray's sweep loads it
    tokenizer = load_tokenizer(target_path, ref.trust_remote_code)
    batches, teacher, probe = _held_out(spec, target, tokenizer, tau_kd)
    quality = {key: _quality(str(Path(path)), batches, teacher, probe) for key, path in drafts.items()}
    quality["undistilled"] = _quality(
        resolve_model_path(spec.models.draft, spec.models), batches, teacher, probe
    )
    return quality
