"""Filling the τ_kd shards: every (prompt, τ) the teacher pool (`teacher/pool.py`) samples becomes a row of
its τ's Parquet shard (`data/shards.py`).

Exactly-once rows follow from three facts: every request sits in exactly one batch, the driver reads each
batch's result once (a lost attempt's result is never read) and is the only writer of part files, and a
re-run batch reproduces the same rows (per-request seeds, see `generation.py`). The last holds for vLLM
only in its batch-invariant mode; without it each row still comes from exactly one attempt, but a re-run
batch may sample other rows. Part files are written atomically as batches finish, so an interrupted run
resumes with only the missing prompts; a τ's shard is compacted as soon as its last prompt arrives.

One pass carries every temperature: requests are sorted by τ, cut into batches of `teacher.batch_size`,
and a batch may mix temperatures (each request has its own τ and seed).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.config import SweepSpec
from specray.data.chat import require_chat_template
from specray.data.examples import Example
from specray.data.shards import (
    ShardKey,
    done_prompt_ids,
    finalize_shard,
    is_complete,
    shard_dir,
    write_part,
)
from specray.data.templates import prompt_text
from specray.errors import DataError
from specray.locks import producing
from specray.progress import bar
from specray.teacher.generation import GenerationRequest, GenerationResult
from specray.teacher.pool import GenerationPool, open_teacher_pool


@dataclass
class ShardReport:
    """What happened to one τ's shard in one call: a cache hit, or how much was generated and how fast."""

    tau: float
    path: Path
    cached: bool
    rows: int
    split: str
    generated: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        if self.cached:
            return f"τ={self.tau:g}: cache hit, {self.rows} responses, nothing generated ({self.path})"
        if not self.generated:
            return f"τ={self.tau:g}: completed from saved parts, {self.rows} responses ({self.path})"
        return (
            f"τ={self.tau:g}: generated {self.generated} of {self.rows} responses, {self.tokens} tokens in "
            f"{self.seconds:.1f}s ({self.tokens_per_s:.0f} tokens/s) -> {self.path}"
        )


@dataclass
class _Progress:
    """Driver-side bookkeeping of one τ during a pass."""

    key: ShardKey
    missing: set[str]
    report: ShardReport


def _requests(
    progress: Mapping[float, _Progress], examples: Sequence[Example], template: str, tokenizer: Any = None
) -> list[GenerationRequest]:
    """Every missing (prompt, τ), sorted by τ so a temperature's batches run together. A chat prompt is
    rendered by the teacher's `tokenizer` and holds its own special tokens."""
    requests = []
    texts = {e.id: prompt_text(e, template, tokenizer) for e in examples}
    for tau, state in sorted(progress.items()):
        for example in examples:
            if example.id in state.missing:
                key = state.key
                requests.append(
                    GenerationRequest(
                        example.id, texts[example.id], tau, key.seed, key.max_new_tokens, template == "alpaca"
                    )
                )
    return requests


def _chat_tokenizer(spec: SweepSpec) -> Any:
    """The teacher's tokenizer, which renders chat prompts (refused without a chat template)."""
    from specray.models.loading import load_tokenizer
    from specray.models.sources import resolve_model_path

    target = spec.models.target
    path = resolve_model_path(target, spec.models)
    tokenizer = load_tokenizer(path, target.trust_remote_code)
    require_chat_template(tokenizer, path)
    return tokenizer


def _row(result: GenerationResult, prompt: str, teacher: str) -> dict[str, Any]:
    return {
        "prompt_id": result.prompt_id,
        "prompt": prompt,
        "response": result.response_text,
        "prompt_token_ids": result.prompt_token_ids,
        "response_token_ids": result.response_token_ids,
        "tau": result.tau,
        "seed": result.seed,
        "teacher": teacher,
        "finish_reason": result.finish_reason,
    }


def _run_pass(
    pool: GenerationPool,
    requests: list[GenerationRequest],
    progress: dict[float, _Progress],
    prompt_ids: list[str],
    root: Path | None,
    advance: Callable[[int, str], None],
) -> None:
    """Generate `requests`, saving each finished batch as part files and completing shards as they fill;
    `advance(responses, rates)` after each batch.

    Timing: the wall time since the previous batch arrived is charged to the temperatures of the batch
    that just arrived, by row share. With R busy replicas a batch arrives every ~(batch time / R), so
    per-τ tokens/s is the whole pool's throughput on that τ, and the per-τ seconds add up to the wall time.
    """
    prompts = {(r.tau, r.prompt_id): r.prompt for r in requests}
    last = time.perf_counter()

    def on_results(results: list[GenerationResult]) -> None:
        nonlocal last
        now, elapsed = time.perf_counter(), time.perf_counter() - last
        last = now
        by_tau: dict[float, list[GenerationResult]] = defaultdict(list)
        for result in results:
            by_tau[result.tau].append(result)
        for tau, group in by_tau.items():
            state = progress[tau]
            rows = [_row(r, prompts[(tau, r.prompt_id)], state.key.teacher) for r in group]
            write_part(state.key, rows, root)
            state.missing -= {r.prompt_id for r in group}
            state.report.generated += len(group)
            state.report.tokens += sum(len(r.response_token_ids) for r in group)
            state.report.seconds += elapsed * len(group) / len(results)
            if not state.missing:
                finalize_shard(state.key, prompt_ids, root, {"tau": tau, "split": state.report.split})
        rates = [f"τ={t:g} {s.report.tokens_per_s:.0f}" for t, s in progress.items() if s.report.generated]
        advance(len(results), "tok/s " + ", ".join(rates))

    pool.generate(requests, on_results)


def _check_prompt_ids(examples: Sequence[Example], split: str) -> list[str]:
    ids = [example.id for example in examples]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise DataError(f"split {split!r}: example ids must be unique to key responses; repeated: {repeated}")
    return ids


def _plan(
    examples: Sequence[Example], keys: Mapping[float, ShardKey], split: str, root: Path | None
) -> tuple[dict[float, ShardReport], dict[float, _Progress]]:
    """A report per τ, and the bookkeeping of every τ that still misses prompts."""
    prompt_ids = _check_prompt_ids(examples, split)
    reports: dict[float, ShardReport] = {}
    progress: dict[float, _Progress] = {}
    for tau, key in keys.items():
        cached = is_complete(key, root)
        missing = set(prompt_ids) - done_prompt_ids(key, root)  # validates saved files (DataError if bad)
        reports[tau] = ShardReport(tau, shard_dir(key, root), cached, len(prompt_ids), split)
        if missing:
            progress[tau] = _Progress(key, missing, reports[tau])
        elif not cached:  # every row was saved but the last run died before compacting them
            finalize_shard(key, prompt_ids, root, {"tau": tau, "split": split})
    return reports, progress


def generate_shards(
    spec: SweepSpec,
    examples: Sequence[Example],
    keys: Mapping[float, ShardKey],
    split: str = "train",
    *,
    pool: GenerationPool | None = None,
    root: Path | None = None,
    show_progress: bool = True,
    on_progress: Callable[[int, int, int], None] | None = None,
) -> dict[float, ShardReport]:
    """Make sure a complete shard of `examples` exists for every τ of `keys` (the plan's shard keys, which
    hold each shard's τ, seed and length): reuse complete ones, finish partial ones, generate the rest in
    one pass. Starts Ray (per `spec.ray`) and a teacher pool over the sweep's
    target only when something is missing, unless a `pool` (hosting that same model) is given.
    `on_progress(done, total, saved)` counts responses over every τ (`saved`: found saved, of `done`):
    once after planning, then after every batch. A shard that another process is generating is waited
    for (one producer per shard, `locks.producing`), then reused as far as that process got."""
    plan = (examples, keys, split, root)
    reports, progress = _plan(*plan)
    with producing([shard_dir(state.key, root) for state in progress.values()], "a teacher shard"):
        if progress:  # again, holding them: what another producer wrote meanwhile is not redone
            reports, progress = _plan(*plan)
        total = len(examples) * len(keys)
        done = saved = total - sum(len(state.missing) for state in progress.values())
        report = on_progress or (lambda done, total, saved: None)
        report(done, total, saved)
        if progress:
            tokenizer = _chat_tokenizer(spec) if spec.data.template == "chat" else None
            requests = _requests(progress, examples, spec.data.template, tokenizer)
            prompt_ids = [example.id for example in examples]
            with (
                nullcontext(pool) if pool is not None else open_teacher_pool(spec) as active,
                bar(len(requests), "teacher", "response", enabled=show_progress) as meter,
            ):

                def advance(responses: int, rates: str) -> None:
                    nonlocal done
                    done += responses
                    meter.update(responses)
                    meter.set_postfix_str(rates)
                    report(done, total, saved)

                _run_pass(active, requests, progress, prompt_ids, root, advance)
    return reports
