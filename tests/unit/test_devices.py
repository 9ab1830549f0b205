"""The device seam (specray/devices.py), without CUDA and without starting Ray: the spec's resources give each
stage its device, and each actor and loop loads its models on the device it is given.

To see where an object would load without a GPU, the actors are given a GPU request whose device resolves
to PyTorch's `meta` device (`GpuOnMeta`): models "load" there without data, and say where they went.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from specray.config import TeacherSpec, load_spec
from specray.devices import Resources
from specray.distill.inputs import DistillInputs
from specray.distill.loop import worker_resources
from specray.distill.loop_setup import teacher_and_probe
from specray.errors import SpecError
from specray.models.loading import load_tokenizer
from specray.specdec.evaluator import EvalSettings
from specray.specdec.workers import EvalWorker, eval_demand
from specray.teacher.pool import TeacherActor, replica_plan, teacher_demand
from tests.conftest import REPO

ON_GPUS = ["teacher.num_gpus=1", "eval.num_gpus=1", "distill.num_gpus_per_worker=1"]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


class GpuOnMeta(Resources):
    """A GPU request whose device, here, is `meta`: what an object loads there shows where it would load."""

    def torch_device(self) -> torch.device:
        assert self.kind == "cuda"
        return torch.device("meta")


@contextmanager
def threads_kept() -> Iterator[None]:
    """`Resources.enter` sets this process's torch threads, as an actor's would: restore them."""
    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_resources_give_the_device_threads_and_ray_options() -> None:
    assert (Resources(2.0).device, Resources(2.0).threads, Resources(0.5).threads) == ("cpu", 2, 1)
    for gpus in (1.0, 0.5, 4.0):  # Ray narrows CUDA_VISIBLE_DEVICES to the assigned GPUs: the first is 0
        assert (Resources(1.0, gpus).device, Resources(1.0, gpus).kind) == ("cuda:0", "cuda")
    assert Resources(3.0, 1.0).ray_options() == {"num_cpus": 3.0, "num_gpus": 1.0}


def test_each_stage_takes_its_device_from_its_own_resources() -> None:
    spec = load_spec(REPO / "sweeps" / "smoke.yaml", ON_GPUS)
    teacher = replica_plan(spec.teacher)
    assert (teacher.resources.device, teacher.options["num_gpus"]) == ("cuda:0", 1.0)
    assert teacher_demand(spec.teacher).each == teacher.resources
    assert eval_demand(spec).each.device == "cuda:0"
    assert worker_resources(spec).device == "cuda:0"  # the train loop, its probe, and a Tune trial
    cpu = load_spec(REPO / "sweeps" / "smoke.yaml", ["teacher.num_gpus=0", "eval.num_cpus=2"])
    assert replica_plan(cpu.teacher).resources.device == "cpu"
    assert (eval_demand(cpu).each.device, eval_demand(cpu, replicas=1).count) == ("cpu", 1)
    assert eval_demand(cpu).each.threads == 2


def test_a_tensor_parallel_vllm_replica_reserves_its_group_and_drives_it_from_the_cpu() -> None:
    spec = TeacherSpec(
        engine="vllm", temperatures=[0.0], num_gpus=2, replicas=3, vllm={"tensor_parallel_size": 2}
    )
    demand = teacher_demand(spec)
    assert (demand.count, demand.each.num_gpus, demand.each.num_cpus) == (3, 2, 2)
    assert "tensor_parallel_size" in demand.fields[2]


@no_cuda
def test_a_gpu_request_without_cuda_fails_in_one_line_instead_of_running_on_the_cpu() -> None:
    with pytest.raises(SpecError, match=r"1 GPU\(s\) reserved but torch .* sees no CUDA device"):
        Resources(1.0, 1.0).torch_device()
    spec = load_spec(REPO / "sweeps" / "smoke.yaml", ON_GPUS)
    with pytest.raises(SpecError, match="num_gpus to 0"):
        worker_resources(spec).torch_device()  # train_draft and a Tune trial's validation use this


@no_cuda
def test_a_teacher_replica_reports_a_missing_gpu_from_ready(micro_zoo) -> None:
    spec = TeacherSpec(temperatures=[0.0], num_gpus=1)
    with threads_kept():
        replica = TeacherActor(spec, str(micro_zoo.target), "float32", False, Resources(1.0, 1.0))
    with pytest.raises(SpecError, match="sees no CUDA device"):
        replica.ready()  # as one clear line through Ray, not an opaque dead actor


def test_actors_load_their_models_on_the_device_of_their_resources(micro_zoo) -> None:
    gpu = GpuOnMeta(2.0, 1.0)
    with threads_kept():
        replica = TeacherActor(
            TeacherSpec(temperatures=[0.0], num_gpus=1), str(micro_zoo.target), "float32", False, gpu
        )
        assert torch.get_num_threads() == 2  # as many threads as CPUs reserved
    assert next(replica.engine.model.parameters()).device.type == "meta"
    prompts = {"in_domain": [[1, 5, 6]]}
    with threads_kept():
        worker = EvalWorker(str(micro_zoo.target), prompts, EvalSettings(1, 8, 1), gpu)
    assert worker.ready()["device"] == "meta" and worker.evaluator.target.device.type == "meta"
    assert worker.evaluator._load_draft(str(micro_zoo.draft)).device.type == "meta"  # drafts follow


@dataclass
class OtherRank:
    """A Session of a rank other than 0 (no probe) on the meta device: what `teacher_and_probe` reads."""

    rank: int = 1
    world_size: int = 2
    device: torch.device = torch.device("meta")
    scratch_dir: Path | None = None


def test_the_train_loop_loads_its_teacher_on_the_session_device(micro_zoo) -> None:
    spec = load_spec(REPO / "sweeps" / "smoke.yaml")
    inputs = DistillInputs(str(micro_zoo.draft), str(micro_zoo.target), {}, [])
    tokenizer = load_tokenizer(str(micro_zoo.draft))
    teacher, probe = teacher_and_probe(spec, "online", inputs, OtherRank(), tokenizer)
    assert teacher is not None and probe is None
    assert next(teacher.parameters()).device.type == "meta"
