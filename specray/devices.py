"""The device seam: where a process computes follows from the resources its spec reserves for it, once.

Every actor and loop is given its `Resources` (CPUs and GPUs, as the spec sets them for one teacher replica,
eval actor, distill worker or Tune trial) and takes its device and torch thread count from them — never from
`torch.cuda.is_available()`: a stage that asked for a GPU and silently ran on the CPU would compute other
numbers (bf16 autocast, kernels) under a key that says "cuda". Ray (actors, tasks, Tune trials) sets
`CUDA_VISIBLE_DEVICES` to the GPUs it assigned, so inside the process the first assigned GPU is `cuda:0`;
Ray Train workers take theirs from `ray.train.torch.get_device()` (several workers may share a node's GPUs).
Random generators are created where the tensors they draw for live (`torch.Generator(device=logits.device)`).

Import-light (torch only inside functions; no Ray, no config): result keys, the loops, the engines and the
GPU test suite all use it.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specray.errors import SpecError

if TYPE_CHECKING:
    import torch


def device_kind(num_gpus: float) -> str:
    """The kind of device a stage runs on, from its resources: what changes numerics (bf16, kernels)."""
    return "cuda" if num_gpus > 0 else "cpu"


@dataclass(frozen=True)
class Resources:
    """What one actor, worker or trial reserves; its device and thread count follow from it."""

    num_cpus: float
    num_gpus: float = 0.0

    @property
    def kind(self) -> str:
        return device_kind(self.num_gpus)

    @property
    def device(self) -> str:
        """The torch device of the process: its first assigned GPU (`cuda:0` once Ray has narrowed
        CUDA_VISIBLE_DEVICES to the assigned ones), else the CPU."""
        return "cuda:0" if self.kind == "cuda" else "cpu"

    @property
    def threads(self) -> int:
        """torch threads: as many as CPUs reserved, so N processes on a node never oversubscribe its cores."""
        return max(1, int(self.num_cpus))

    def ray_options(self) -> dict[str, float]:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}

    def torch_device(self) -> torch.device:
        """`device` as a torch device; fails in one line when a GPU was reserved but torch sees none (a CPU
        build of torch, or no GPU assigned) rather than computing elsewhere."""
        import torch

        device = torch.device(self.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
            raise SpecError(
                f"{self.num_gpus:g} GPU(s) reserved but torch {torch.__version__} sees no CUDA device "
                f"(CUDA_VISIBLE_DEVICES={visible}); set the stage's num_gpus to 0 to run on the CPU"
            )
        return device

    def enter(self) -> torch.device:
        """Configure this process (an actor, worker or trial of its own) for the resources: its torch thread
        count; returns its device (`torch_device`)."""
        import torch

        torch.set_num_threads(self.threads)
        return self.torch_device()


def autocast(device: torch.device | str, cpu_autocast: bool = False) -> AbstractContextManager:
    """bf16 autocast on CUDA; on CPU only when asked (`distill.cpu_autocast`): a CPU without bf16 matmul units
    (avx512_bf16, AMX) runs it slower than fp32, one with them about twice as fast (benchmarks/README.md,
    "bf16 on a CPU"), and either way it changes the numbers, so it is a setting that reaches the keys."""
    import torch

    kind = torch.device(device).type
    if kind == "cuda" or (kind == "cpu" and cpu_autocast):
        return torch.autocast(kind, dtype=torch.bfloat16)
    return nullcontext()


def train_device_kind(num_gpus: float, cpu_autocast: bool) -> str:
    """The training device as a draft's key names it: `cuda` (bf16 autocast), `cpu`, or `cpu+bf16`."""
    kind = device_kind(num_gpus)
    return f"{kind}+bf16" if kind == "cpu" and cpu_autocast else kind
