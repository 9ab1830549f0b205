"""Online KD's teacher pass over student samples: the full forward against the one after kept prompt caches.

    .venv/bin/python -m benchmarks.teacher.online_pass [--tau-kd 1.0] [--batches 100] [--repeats 2]
                                                      [--steps 200]
    .venv/bin/python -m benchmarks.teacher.online_pass --quick   # a smoke check on a micro zoo

Part 1 (the pass): `--batches` random batches of 8 rows of the τ_kd shard (the fresh half of a 16-row
online batch) through the tiny zoo's target, 1 torch thread: `response_states` (prompt + response, padded)
against `cached_response_states` (the response only, after the prompts' kept KV caches), the same batches
in the same order, alternating per repeat; the largest difference between the two is printed too.

Part 2 (a whole draft): one online draft of sweeps/tiny.yaml for `--steps` steps through the plain loop
(`train_draft`, no Ray), with the kept teacher states only (`loop_setup.kept_prompt_states` returning
None: every student sample's teacher pass in full, as before the prompt caches) and with the prompt caches,
process CPU seconds and the final loss of each (the same up to fp round-off).

Needs the tiny zoo and the τ_kd shard: `specray generate sweeps/tiny.yaml 'teacher.temperatures=[1.0]'`
(`--quick` makes its own).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from benchmarks.quick import tiny_or_quick
from specray.distill import loop, loop_setup
from specray.distill.inputs import prepare_inputs
from specray.distill.teacher_states import PromptStates, cached_response_states, response_states
from specray.draft import one_draft
from specray.models.loading import load_model, load_tokenizer


def passes(spec, inputs, tau_kd: float, batches: int, repeats: int) -> None:
    rows = inputs.rows[tau_kd]
    teacher = load_model(inputs.target_path, "float32").requires_grad_(False).eval()
    pad = load_tokenizer(inputs.draft_path).pad_token_id
    started = time.process_time()
    prompts = PromptStates(teacher, [row.prompt_ids for row in rows], spec.teacher.batch_size)
    built = time.process_time() - started
    prompt_mean = sum(len(r.prompt_ids) for r in rows) / len(rows)
    response_mean = sum(len(r.response_ids) for r in rows) / len(rows)
    print(
        f"{len(rows)} rows: prompts {prompt_mean:.1f} tokens on average, responses {response_mean:.1f}; "
        f"{len(prompts)} prompt caches, "
        f"{prompts.megabytes():.0f} MB, built in {built:.2f} CPU s"
    )
    sample = random.Random(0)
    chosen = [sample.sample(rows, 8) for _ in range(batches)]
    worst = max(
        float((a - b).abs().max())
        for batch in chosen[:10]
        for a, b in zip(
            response_states(teacher, batch, pad),
            cached_response_states(teacher, prompts, batch, pad),
            strict=True,
        )
    )
    times: dict[str, list[float]] = {"full": [], "cached": []}
    for _ in range(repeats):
        for name in times:
            started = time.process_time()
            for batch in chosen:
                if name == "full":
                    response_states(teacher, batch, pad)
                else:
                    cached_response_states(teacher, prompts, batch, pad)
            times[name].append(time.process_time() - started)
    full, cached = min(times["full"]), min(times["cached"])
    print(
        f"teacher pass, {batches} batches of 8 rows, best of {repeats}: full {full:.2f} CPU s, "
        f"cached {cached:.2f} CPU s ({cached / full:.2f}x); largest |difference| {worst:.1e}"
    )


def whole_draft(spec, inputs, tau_kd: float) -> None:
    results = {}
    kept_prompts = loop_setup.kept_prompt_states
    for name in ("states only", "states + prompt caches"):
        loop_setup.kept_prompt_states = (lambda *args: None) if name == "states only" else kept_prompts
        started = time.process_time()
        with tempfile.TemporaryDirectory() as root:
            curves = loop.train_draft(
                one_draft(spec, "online", {tau_kd: 1.0}, Path(root) / "d"), inputs=inputs
            ).curves
        results[name] = (time.process_time() - started, curves[-1].loss)
    loop_setup.kept_prompt_states = kept_prompts
    base = results["states only"][0]
    print(f"one online draft, {spec.distill.steps} steps:")
    for name, (cpu, loss) in results.items():
        print(f"  {name:>22}: {cpu:6.1f} CPU s ({cpu / base:.2f}x), last loss {loss:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tau-kd", type=float, default=1.0)
    parser.add_argument("--batches", type=int, default=None, help="default 100 (4 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--steps", type=int, default=None, help="default 200 (4 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    args.batches = args.batches or (4 if args.quick else 100)
    args.repeats = args.repeats or (1 if args.quick else 2)
    args.steps = args.steps or (4 if args.quick else 200)
    torch.set_num_threads(1)  # one Ray Train worker's CPU
    hf_logging.disable_progress_bar()
    every = max(1, args.steps // 10)
    overrides = [f"distill.online_steps={args.steps}", f"distill.report_every={every}"]
    spec = tiny_or_quick(args.quick)(overrides).for_paradigm("online")
    inputs = prepare_inputs(one_draft(spec, "online", {args.tau_kd: 1.0}, Path("draft")))
    passes(spec, inputs, args.tau_kd, args.batches, args.repeats)
    whole_draft(spec, inputs, args.tau_kd)


if __name__ == "__main__":
    main()
