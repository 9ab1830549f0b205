"""A Ray Train worker of a distillation run: the loop's `Session` over Ray Train (`TrainWorkerSession`, one
per draft) and the per-worker entry point (`train_worker`) that trains, one after another, the drafts of
the run not yet published, publishing each from rank 0. The driver of runs is `ray_train.py`; what works
around Ray's internals is `ray_2_60.py`.
"""

from __future__ import annotations

import gc
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray.train
import ray.train.torch
import torch
from ray.util.queue import Queue

from specray.devices import Resources
from specray.distill.checkpoints import (
    RunState,
    checkpoint_key,
    is_finished,
    load_trainer_state,
    publish,
)
from specray.distill.curves import CurvePoint
from specray.distill.inputs import DistillInputs
from specray.distill.loop import finished_info, run_training, worker_resources
from specray.distill.ray_2_60 import scratch_folder, wait_for_registered
from specray.draft import Draft
from specray.faults import Faults

RUN_NAME = "ray_train"  # the Train run's name: its folder under the run's work folder


class TrainWorkerSession:
    """The loop's Session inside a Ray Train worker, computing on the device of the worker's resources.

    One session per draft of the run: `key` is the draft's (a checkpoint of another draft of the same run is
    no checkpoint of this one); `draft` and `folder` name its curve points on the queue (two drafts of one
    run may share a name, never a folder). Rank 0 keeps its latest
    checkpoint folder after reporting it (`kept`), so the worker can publish the last one itself."""

    def __init__(
        self,
        resources: Resources | None = None,
        faults: Faults | None = None,
        work: Path | None = None,
        curves: Queue | None = None,
        key: str | None = None,
        draft: str = "",
        folder: str = "",
    ) -> None:
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = worker_device(resources or Resources(1.0))
        self.scratch_dir = scratch_folder()  # the checkpoint is copied to storage by `report`
        self.faults, self.work, self.curves = faults or Faults(), work, curves
        self.key, self.draft, self.folder = key, draft, folder
        self.kept: Path | None = None
        self.saved: dict[str, Any] | None = None  # what this draft's latest checkpoint was reported with

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        return ray.train.torch.prepare_model(model)  # DDP when world_size > 1

    def all_reduce(self, values: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return values.clone()
        summed = values.to(self.device)  # NCCL needs device tensors; gloo takes CPU ones
        torch.distributed.all_reduce(summed)
        return summed.cpu()

    @contextmanager
    def latest_checkpoint(self) -> Iterator[Path | None]:
        checkpoint = ray.train.get_checkpoint()  # the run's latest: maybe an earlier draft's
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as folder:
            ours = self.key is None or checkpoint_key(Path(folder)) == self.key
            yield Path(folder) if ours else None

    def report(self, step: int, curve: CurvePoint | None, checkpoint: Path | None, saving: bool) -> None:
        if curve is not None and self.rank == 0 and self.curves is not None:
            # before the checkpoint, so steps arrive in order; a Ray payload carries the JSON form
            self.curves.put({"draft": self.draft, "folder": self.folder, "curve": curve.to_json()})
        if saving:  # every rank reports (a barrier); rank 0 with the folder
            try:
                persisted = ray.train.Checkpoint.from_directory(checkpoint) if checkpoint else None
                # synchronous upload, local folder kept (Ray's default): rank 0 publishes the last one
                self.saved = {"step": step, "draft": self.key or ""}
                ray.train.report(self.saved, checkpoint=persisted, delete_local_checkpoint_after_upload=False)
            finally:
                if checkpoint is not None:
                    self.release()
                    self.kept = checkpoint
        if self.rank == 0 and self.faults.due("train.step", step):  # fault injection (specray/faults.py)
            if self.saved is not None:
                self._wait_for_registered_checkpoint(self.saved)
            self.faults.fire("train.step")

    def release(self) -> None:
        """Delete the kept checkpoint folder (storage has its copy)."""
        if self.kept is not None:
            shutil.rmtree(self.kept, ignore_errors=True)
            self.kept = None

    def _wait_for_registered_checkpoint(self, metrics: dict[str, Any], timeout_s: float = 120.0) -> None:
        """Let the controller register this draft's latest reported checkpoint first (it does so
        asynchronously; on a loaded machine a kill right after `report` can beat it), so an injected fault
        always resumes from the checkpoint it follows."""
        if self.work is not None:
            wait_for_registered(self.work / RUN_NAME, metrics, timeout_s)


def worker_device(resources: Resources) -> torch.device:
    """A Train worker's device: Ray Train's choice of GPU (workers on one node see all of its assigned GPUs
    and each takes its local rank's) when the worker reserved GPUs, else the CPU; threads as reserved."""
    device = resources.enter()
    return ray.train.torch.get_device() if device.type == "cuda" else device


@dataclass(frozen=True)
class TrainJob:
    """One draft of the run, as the workers get it: the plan's record and what the driver read for it."""

    draft: Draft
    inputs: DistillInputs


@dataclass(frozen=True)
class TrainRun:
    """What every worker of the run gets (Ray Train's `train_loop_config` holds it under RUN_CONFIG)."""

    jobs: list[TrainJob]
    work: str  # the run's work folder
    faults: Faults
    curves: Queue | None = None  # the driver's queue of curve points and publications


RUN_CONFIG = "run"


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry point: rebuild the spec, then run the plain loop for each draft of the
    run that is not published yet (after a restart, the earlier ones are), publishing each from rank 0."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per model load, from every worker, floods the driver's console
    run: TrainRun = config[RUN_CONFIG]
    for job in run.jobs:
        if not is_finished(job.draft.folder, job.draft.key):
            _train_job(job, run)
            gc.collect()  # the draft's models, states and caches go now, not whenever cycles are next swept


def _train_job(job: TrainJob, run: TrainRun) -> None:
    """One draft: the loop from its latest checkpoint (if the run's latest is its own) to `distill.steps`;
    rank 0 then publishes the last checkpoint and tells the driver."""
    draft = job.draft
    resources, work = worker_resources(draft.train_spec), Path(run.work)
    folder = str(draft.folder)
    session = TrainWorkerSession(resources, run.faults, work, run.curves, draft.key, draft.name, folder)
    started = time.perf_counter()
    try:
        run_training(draft, job.inputs, session)
        if session.rank == 0:
            with _last_checkpoint(session) as final:
                state = RunState.from_json(load_trainer_state(final))
                info = finished_info(draft, state, time.perf_counter() - started)
                publish(final, Path(draft.folder), draft.train_spec, info)
            if run.curves is not None:
                run.curves.put({"draft": draft.name, "folder": folder, "published": True})
    finally:
        session.release()


@contextmanager
def _last_checkpoint(session: TrainWorkerSession) -> Iterator[Path]:
    """The draft's last checkpoint: the one this session wrote last; else the one it resumed from, which
    then was already the last (a restart between that checkpoint's report and the draft's publication, or
    an earlier draft of the run with the same key)."""
    if session.kept is not None:
        yield session.kept
        return
    with session.latest_checkpoint() as folder:
        if folder is None:
            raise RuntimeError(f"{session.draft}: no checkpoint of its own to publish")
        yield folder
