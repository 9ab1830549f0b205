"""The teacher generator pool: Ray actors hosting one generation engine each.

Design. Each replica is a thin actor (`TeacherActor`: load once, `generate`, `close`) created by one
factory, `make_teacher_pool`, with the spec's `num_cpus`/`num_gpus` (its device follows from them,
`specray/devices.py`). The replicas are a `cluster.actors.Replicas`: batches go only to replicas that are
up, two per replica at a time (one running, one queued), and when a replica is lost (its process or node
dies) a fresh one replaces it and the batches it held go back on the queue, where any replica that is up
takes them (the one retry policy of every specray pool, `cluster/actors.py`). What the pool's batches
become, and why each row is written exactly once, is `teacher/shards.py`'s.

Why not Ray Data `map_batches` with an `ActorPoolStrategy`: it also retries, but its output would still
have to be routed back to per-τ shards with our atomic-write/manifest/resume rules, it brings its own
executor, resource reservations and progress bars (heavy on a 2-core laptop), and it hides the per-batch
completion events that drive resume and tokens/s per temperature. On GPU clusters `ray.data.llm` could
replace the vLLM engine, but per-request seeds and the shard layout would have to be re-plumbed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray

from specray.cluster.actors import Demand, LoadError, Replicas, check_local_fits
from specray.cluster.runtime import ray_session
from specray.config import SweepSpec, TeacherSpec
from specray.devices import Resources
from specray.faults import Faults
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


@contextmanager
def open_teacher_pool(spec: SweepSpec) -> Iterator[TeacherPool]:
    """Ray per the spec, the teacher model (building the zoo if needed), and a pool over it."""
    from specray.models.sources import resolve_model_path

    target = spec.models.target
    if spec.teacher.engine == "vllm" and spec.ray.address is None:  # fail before starting anything
        from specray.teacher.vllm_engine import require_vllm

        require_vllm()
    model_path = resolve_model_path(target, spec.models)
    with ray_session(spec.ray):
        if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
            check_local_fits(teacher_demand(spec.teacher))
        with make_teacher_pool(spec.teacher, model_path, target.dtype, target.trust_remote_code) as pool:
            yield pool
