"""The teacher generator pool: Ray actors hosting one generation engine each, filling Parquet shards.

Design. Each replica is a thin actor (`TeacherActor`: load once, `generate`, `close`) created by one
factory, `make_teacher_pool`, with the spec's `num_cpus`/`num_gpus` (its device follows from them,
`specray/devices.py`). The replicas are a `cluster.actors.Replicas`: batches go only to replicas that are
up, two per replica at a time (one running, one queued), and when a replica is lost (its process or node
dies) a fresh one replaces it and the batches it held go back on the queue, where any replica that is up
takes them (the one retry policy of every specray pool, `cluster/actors.py`). Exactly-once rows follow
from three facts: every request sits in exactly one batch, the driver reads each batch's result once (a
lost attempt's result is never read) and is the only writer of part files, and a re-run batch reproduces
the same rows (per-request seeds, see `generation.py`). The last holds for vLLM only in its batch-invariant
mode; without it each row still comes from exactly one attempt, but a re-run batch may sample other rows.
Part files are written atomically as batches finish, so an interrupted run resumes with only the missing
prompts; a τ's shard is compacted as soon as its last prompt arrives.

Why not Ray Data `map_batches` with an `ActorPoolStrategy`: it also retries, but its output would still
have to be routed back to per-τ shards with our atomic-write/manifest/resume rules, it brings its own
executor, resource reservations and progress bars (heavy on a 2-core laptop), and it hides the per-batch
completion events that drive resume and tokens/s per temperature. On GPU clusters `ray.data.llm` could
replace the vLLM engine, but per-request seeds and the shard layout would have to be re-plumbed.

One pass carries every temperature: requests are sorted by τ, cut into batches of `teacher.batch_size`,
and a batch may mix temperatures (each request has its own τ and seed).
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ray

from specray.cluster.actors import Demand, LoadError, Replicas, check_local_fits
from specray.cluster.runtime import ray_session
from specray.config import SweepSpec, TeacherSpec
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
from specray.devices import Resources
from specray.errors import DataError
from specray.faults import Faults
from specray.locks import producing
from specray.progress import bar
from specray.teacher.engines import make_engine
from specray.teacher.generation import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

QUEUE_DEPTH = 2  # batches submitted to a replica at once


class TeacherActor:
    """One replica: loads its engine once, on the device and with the threads of its resources."""

    def __init__(
        self,
        spec: TeacherSpec,
        model_path: str,
        dtype: str,
        trust_remote_code: bool,
        resources: Resources,
        faults: Faults | None = None,
    ) -> None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.faults, self.batches = faults or Faults(), 0
        self.load_error = LoadError()
        self.engine = self.load_error.load(
            lambda: make_engine(spec, model_path, dtype, trust_remote_code, str(resources.enter()))
        )

    def ready(self) -> dict[str, int]:
        import torch

        self.load_error.check()
        return {"pid": os.getpid(), "threads": torch.get_num_threads()}

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        assert self.engine is not None, "generate before a successful ready()"
        results = self.engine.generate(requests)
        self.batches += 1
        self.faults.check("teacher.batch", self.batches)  # fault injection (specray/faults.py)
        return results

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


class GenerationPool(Protocol):
    def generate(
        self, requests: Sequence[GenerationRequest], on_results: Callable[[list[GenerationResult]], None]
    ) -> None: ...


@dataclass
class TeacherPool:
    """The replicas. `generate` streams each finished batch to `on_results` (driver side)."""

    replicas: Replicas
    batch_size: int
    placement_groups: list[Any] = field(default_factory=list)

    @property
    def actors(self) -> list[Any]:
        return self.replicas.actors

    def generate(
        self, requests: Sequence[GenerationRequest], on_results: Callable[[list[GenerationResult]], None]
    ) -> None:
        batches = [list(requests[i : i + self.batch_size]) for i in range(0, len(requests), self.batch_size)]
        self.replicas.run(
            batches,
            lambda actor, batch: actor.generate.remote(batch),
            lambda _, results: on_results(results),
            describe=lambda batch: f"a batch of {len(batch)} requests (τ={batch[0].tau:g}, ...)",
        )

    def close(self) -> None:
        """Release the engines (vLLM frees GPU memory), then the actors and their placement groups."""
        self.replicas.close(release="close")
        self._remove_groups()

    def kill(self) -> None:
        self.replicas.close()
        self._remove_groups()

    def _remove_groups(self) -> None:
        for group in self.placement_groups:
            ray.util.remove_placement_group(group)

    def __enter__(self) -> TeacherPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:  # e.g. Ctrl-C: do not wait for the batches still queued on the replicas
            self.kill()


@dataclass(frozen=True)
class ReplicaPlan:
    """How one replica is placed: its Ray options, the resources its process computes with (device,
    threads) and the placement group it needs (tensor-parallel vLLM only)."""

    options: dict[str, Any]
    resources: Resources
    group: Any = None


def replica_plan(spec: TeacherSpec) -> ReplicaPlan:
    """One replica's placement, from the spec's resources (its device: `resources.device`)."""
    resources = Resources(spec.num_cpus, spec.num_gpus)
    tensor_parallel = spec.vllm.tensor_parallel_size if spec.engine == "vllm" else 1
    if tensor_parallel == 1:
        return ReplicaPlan(resources.ray_options(), resources)
    # vLLM starts one Ray worker per GPU; they land in this replica's group (captured child tasks), packed
    # on one node for NVLink. The actor itself only drives them and holds no GPU: it computes on the CPU.
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"GPU": 1, "CPU": 1}] * tensor_parallel, strategy="STRICT_PACK")
    strategy = PlacementGroupSchedulingStrategy(group, 0, placement_group_capture_child_tasks=True)
    options = {"num_cpus": 0, "num_gpus": 0, "scheduling_strategy": strategy}
    return ReplicaPlan(options, Resources(spec.num_cpus, 0.0), group)


def teacher_demand(spec: TeacherSpec) -> Demand:
    """What the replicas reserve in all (a tensor-parallel replica: its group's GPUs and CPUs)."""
    tensor_parallel = spec.vllm.tensor_parallel_size if spec.engine == "vllm" else 1
    if tensor_parallel == 1:
        each = Resources(spec.num_cpus, spec.num_gpus)
        return Demand(spec.replicas, each, ("teacher.replicas", "teacher.num_cpus", "teacher.num_gpus"))
    each = Resources(tensor_parallel, tensor_parallel)
    fields = ("teacher.replicas", "teacher.vllm.tensor_parallel_size", "teacher.vllm.tensor_parallel_size")
    return Demand(spec.replicas, each, fields)


def make_teacher_pool(
    spec: TeacherSpec, model_path: str, dtype: str = "auto", trust_remote_code: bool = False
) -> TeacherPool:
    """Start `spec.replicas` teacher actors (Ray must be initialised) and wait until each has loaded."""
    plans = [replica_plan(spec) for _ in range(spec.replicas)]
    faults = Faults.from_env()
    # every replica gets the same arguments; a replacement reuses its slot's options (and group)
    args = (spec, model_path, dtype, trust_remote_code, plans[0].resources, faults)
    replicas = Replicas(ray.remote(TeacherActor), args, [p.options for p in plans], "teacher", QUEUE_DEPTH)
    pool = TeacherPool(replicas, spec.batch_size, [p.group for p in plans if p.group is not None])
    try:
        ready = replicas.wait_until_up()
    except BaseException:
        pool.kill()
        raise
    log.info("teacher pool: %d %s replicas ready (%s)", spec.replicas, spec.engine, ready)
    return pool


# ---------------------------------------------------------------- filling shards


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
    from specray.models.loading import load_tokenizer, resolve_model_path

    target = spec.models.target
    path = resolve_model_path(target, spec.models.zoo)
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
                nullcontext(pool) if pool is not None else _own_pool(spec) as active,
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


@contextmanager
def _own_pool(spec: SweepSpec) -> Iterator[TeacherPool]:
    """Ray per the spec, the teacher model (building the zoo if needed), and a pool over it."""
    from specray.models.loading import resolve_model_path

    target = spec.models.target
    if spec.teacher.engine == "vllm" and spec.ray.address is None:  # fail before starting anything
        from specray.teacher.vllm_engine import require_vllm

        require_vllm()
    model_path = resolve_model_path(target, spec.models.zoo)
    with ray_session(spec.ray):
        if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
            check_local_fits(teacher_demand(spec.teacher))
        with make_teacher_pool(spec.teacher, model_path, target.dtype, target.trust_remote_code) as pool:
            yield pool
