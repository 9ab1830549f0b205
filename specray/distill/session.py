"""Where the train loop runs: the few things that differ between one plain process and a Ray Train worker.

The loop (`loop.py`) talks only to a `Session`. `LocalSession` is the plain single-process one (rank 0 of
1, checkpoints in a local folder, reports to a callback); `train_worker.TrainWorkerSession` is the Ray Train
one (DDP, `ray.train.report`, `ray.train.get_checkpoint`). Keeping Ray behind this protocol is what lets the
loop run and be tested without Ray.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

from specray.distill.checkpoints import TRAINER_STATE
from specray.distill.curves import CurvePoint

CHECKPOINT_PREFIX = "checkpoint-"


class Session(Protocol):
    rank: int
    world_size: int
    device: torch.device

    @property
    def scratch_dir(self) -> Path | None:
        """Where rank 0 writes a checkpoint before handing it to `report` (None: the system's temp)."""
        ...

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the student to the device and wrap it for data parallelism (DDP) if there are peers."""
        ...

    def all_reduce(self, values: Tensor) -> Tensor:
        """Sum over ranks (a copy); identity with one rank."""
        ...

    def latest_checkpoint(self) -> AbstractContextManager[Path | None]:
        """The folder of the checkpoint to resume from, or None for a fresh start."""
        ...

    def report(self, step: int, curve: CurvePoint | None, checkpoint: Path | None, saving: bool) -> None:
        """Publish a curve point and/or a checkpoint folder (rank 0 only; the session then owns it).
        Every rank calls this at the same steps with the same `saving` (this step checkpoints, though only
        rank 0 holds the folder): under Ray Train a checkpoint's report is a barrier."""
        ...


class LocalSession:
    """One process: checkpoints under `work`, keeping only the latest; curves go to `on_curve`."""

    rank, world_size = 0, 1

    def __init__(
        self,
        work: Path,
        on_curve: Callable[[CurvePoint], None] | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.scratch_dir = work
        self.on_curve = on_curve
        self.device = torch.device(device)

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(self.device)

    def all_reduce(self, values: Tensor) -> Tensor:
        return values.clone()

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (a folder is renamed into place only once complete)."""
        found = self.scratch_dir.glob(f"{CHECKPOINT_PREFIX}*") if self.scratch_dir else []
        return sorted(p for p in found if (p / TRAINER_STATE).is_file())

    @contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        found = self.checkpoints()
        yield found[-1] if found else None

    def report(self, step: int, curve: CurvePoint | None, checkpoint: Path | None, saving: bool) -> None:
        if checkpoint is not None:
            assert self.scratch_dir is not None
            final = self.scratch_dir / f"{CHECKPOINT_PREFIX}{step:08d}"
            if final.exists():
                shutil.rmtree(final)
            os.replace(checkpoint, final)
            for older in self.checkpoints()[:-1]:
                shutil.rmtree(older, ignore_errors=True)
        if curve is not None and self.on_curve is not None:
            self.on_curve(curve)
