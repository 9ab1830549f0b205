"""Ray Train adapter: the distillation loop under a `TorchTrainer` (Ray Train V2). The only distill module
that imports Ray.

Driver side (`distill`): validate the request and read the shards before Ray starts (`prepare_inputs`: a bad
τ_kd or a missing shard is one clear error, never a retried worker failure); pass the rows and resolved
model paths to the workers (no worker reads the driver's cache or builds the zoo); run the trainer; publish
the last checkpoint as the draft (`checkpoints.publish`: marker written last).

Worker side (`RaySession`): the loop's `Session` over Ray Train — DDP through `ray.train.torch.prepare_model`
(gloo on CPU, NCCL on GPU), sums through `torch.distributed.all_reduce`, checkpoints through
`ray.train.report(..., checkpoint=...)` (rank 0 writes, every rank reports: it is a barrier) and resume
through `ray.train.get_checkpoint()`. When a worker dies, `FailureConfig(max_failures)` makes the controller
restart the whole worker group, which resumes from the latest reported checkpoint and still ends at
`distill.steps`: the data order is a function of the step, so the resumed run is the uninterrupted one.
Ray's run folder (checkpoints, its snapshot) lives in the work folder beside `output_dir`, so calling
`distill` again after the driver itself died resumes too (Train V2 restores a run by storage path and name).
The controller takes reports asynchronously: a checkpoint reported in the instant before a crash may not be
registered, and the run then resumes from the one before it. On a multi-node cluster `output_dir` must be
on storage every node shares (NFS), as Ray Train requires of its storage path.

Reports: rank 0 puts each curve point on a Ray queue (an actor on the driver's node), and the driver thread
that called `distill` hands it to `report` while `fit` runs in a helper thread — so `report` runs live, on
the driver, in the caller's thread. Points that a restarted worker group reports again (steps after the
checkpoint it resumed from) are not passed on twice. Only checkpoints go through `ray.train.report`: Train
V2's worker holds one unconsumed report and its controller takes it at each poll (every
RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s in Ray 2.60), so a report per curve point held a fast loop to one
point per poll — 41 points made a 20-CPU-second offline draft take ~110 s of wall time.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.util.queue import Empty, Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from specray.cluster.actors import Demand, check_local_fits
from specray.cluster.runtime import ray_session
from specray.config import DistillSpec, SweepSpec
from specray.devices import Resources
from specray.distill.checkpoints import (
    claim_work_dir,
    fingerprint,
    is_finished,
    load_trainer_state,
    publish,
    read_curves,
)
from specray.distill.inputs import prepare_inputs
from specray.distill.loop import DistillResult, finished_info, run_training, worker_resources
from specray.errors import USER_ERRORS, find_cause
from specray.faults import Faults

__all__ = ["RaySession", "distill", "is_finished"]

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # worker-group restarts before the run fails (a deterministic bug must not loop forever)
RUN_NAME = "ray_train"


class RaySession:
    """The loop's Session inside a Ray Train worker, computing on the device of the worker's resources."""

    def __init__(
        self,
        resources: Resources | None = None,
        faults: Faults | None = None,
        work: Path | None = None,
        curves: Queue | None = None,
    ) -> None:
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = worker_device(resources or Resources(1.0))
        self.scratch_dir = None  # system temp; the checkpoint is copied to storage by `report`
        self.faults, self.work, self.curves = faults or Faults(), work, curves

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
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as folder:
            yield Path(folder)

    def report(self, step: int, curve: dict | None, checkpoint: Path | None, saving: bool) -> None:
        if curve is not None and self.rank == 0 and self.curves is not None:
            self.curves.put(curve)  # before the checkpoint's report: the driver sees the steps in order
        if saving:  # every rank reports (a barrier); rank 0 with the folder
            try:
                persisted = ray.train.Checkpoint.from_directory(checkpoint) if checkpoint else None
                ray.train.report({"step": step}, checkpoint=persisted)
            finally:
                if checkpoint is not None:
                    shutil.rmtree(checkpoint, ignore_errors=True)
        if self.rank == 0 and self.faults.due("train.step", step):  # fault injection (specray/faults.py)
            self._wait_for_registered_checkpoint()
            self.faults.fire("train.step")

    def _wait_for_registered_checkpoint(self, timeout_s: float = 120.0) -> None:
        """Let the controller register the last reported checkpoint first (it does so asynchronously; on a
        loaded machine a kill right after `report` can beat it), so an injected fault always resumes from
        the checkpoint it follows."""
        if self.work is None:
            return
        snapshot = self.work / RUN_NAME / "checkpoint_manager_snapshot.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _registered(snapshot):
                return
            time.sleep(0.2)


def _registered(snapshot: Path) -> bool:
    """Whether Ray's checkpoint manager snapshot names a latest checkpoint. Ray rewrites the file in place,
    so a read can see it missing, empty or cut short: all of those are "not yet"."""
    try:
        return bool(json.loads(snapshot.read_text() or "{}").get("latest_checkpoint_result"))
    except (OSError, json.JSONDecodeError):
        return False


def worker_device(resources: Resources) -> torch.device:
    """A Train worker's device: Ray Train's choice of GPU (workers on one node see all of its assigned GPUs
    and each takes its local rank's) when the worker reserved GPUs, else the CPU; threads as reserved."""
    device = resources.enter()
    return ray.train.torch.get_device() if device.type == "cuda" else device


def _train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry point: rebuild the spec, then run the plain loop."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per model load, from every worker, floods the driver's console
    spec = SweepSpec.model_validate(config["spec"])
    session = RaySession(worker_resources(spec), config["faults"], Path(config["work"]), config["curves"])
    run_training(spec, config["paradigm"], config["mixture"], config["inputs"], session)


# ---------------------------------------------------------------- driver side


def _scaling(d: DistillSpec) -> ScalingConfig:
    resources = {"CPU": d.num_cpus_per_worker}
    if d.num_gpus_per_worker > 0:
        resources["GPU"] = d.num_gpus_per_worker
    return ScalingConfig(
        num_workers=d.workers, use_gpu=d.num_gpus_per_worker > 0, resources_per_worker=resources
    )


def _demand(spec: SweepSpec) -> Demand:
    fields = ("distill.workers", "distill.num_cpus_per_worker", "distill.num_gpus_per_worker")
    return Demand(spec.distill.workers, worker_resources(spec), fields)


def _drain(queue: Queue, timeout: float) -> list[dict]:
    """Whatever is on the queue, waiting up to `timeout` seconds for the first item."""
    items: list[dict] = []
    try:
        items.append(queue.get(timeout=timeout) if timeout > 0 else queue.get_nowait())
        while True:
            items.append(queue.get_nowait())
    except Empty:
        return items


def _fit_streaming(
    trainer: ray.train.torch.TorchTrainer, queue: Queue, report: Callable[[dict], None] | None
) -> ray.train.Result:
    """`trainer.fit()` in a helper thread; curve points reach `report` in this thread as they arrive."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error

    thread = threading.Thread(target=fit, name="specray-distill-fit", daemon=True)
    thread.start()
    last_step = -1
    while True:
        running = thread.is_alive()
        for curve in _drain(queue, timeout=0.5 if running else 0.0):
            if curve["step"] > last_step and report is not None:
                _call_report(report, curve)
            last_step = max(last_step, curve["step"])
        if not running:
            break
    if "error" in outcome:
        raise _user_error(outcome["error"]) from outcome["error"]
    return outcome["result"]


def _call_report(report: Callable[[dict], None], curve: dict) -> None:
    # The run lives on the cluster and goes on regardless: a failing callback must not orphan it.
    try:
        report(curve)
    except Exception:
        log.exception("the distillation report callback failed on step %s; training goes on", curve["step"])


def _user_error(error: BaseException) -> BaseException:
    """A user error raised in a worker (bad data, model) is re-raised as itself: one clear line."""
    return find_cause(error, USER_ERRORS) or error


def distill(
    spec: SweepSpec,
    paradigm: str,
    mixture: Mapping[float, float],
    output_dir: Path,
    report: Callable[[dict], None] | None = None,
) -> DistillResult:
    """Distil the spec's draft with Ray Train (`distill.workers` DDP workers) and publish it at `output_dir`.

    Uses the running Ray, else starts one per `spec.ray`. `report` gets each curve point live, on this
    thread (exceptions from it are logged, not raised: the run goes on).
    """
    output_dir = Path(output_dir).absolute()
    spec = spec.for_paradigm(paradigm)  # distill.steps: this paradigm's steps (loop, checkpoints)
    inputs = prepare_inputs(spec, paradigm, mixture)  # every user error surfaces here, before Ray
    weights = {float(tau): float(weight) for tau, weight in mixture.items()}
    started = time.perf_counter()
    work = claim_work_dir(output_dir, fingerprint(spec, paradigm, weights))
    config = {
        "spec": spec.model_dump(mode="json"),
        "paradigm": paradigm,
        "mixture": weights,
        "inputs": inputs,
    }
    config |= {"work": str(work), "faults": Faults.from_env()}
    with ray_session(spec.ray):
        if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
            check_local_fits(_demand(spec))
        result = _run_trainer(spec, config, work, report)
        with result.checkpoint.as_directory() as final:
            state, curves = load_trainer_state(Path(final)), read_curves(Path(final))
            info = finished_info(spec, paradigm, weights, state, time.perf_counter() - started)
            publish(Path(final), output_dir, spec, info)
    shutil.rmtree(work, ignore_errors=True)
    return DistillResult(output_dir, spec.distill.steps, curves)


def _run_trainer(
    spec: SweepSpec,
    config: dict,
    work: Path,
    report: Callable[[dict], None] | None,
) -> ray.train.Result:
    # On this process's node (the driver's, or a Tune trial's), like Train's controller: this process reads
    # the queue for the whole run, and a lost worker node must not take the queue along with it, failing a
    # run that Train itself survives (tests/integration/test_two_nodes.py).
    on_driver_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": on_driver_node})
    run_config = RunConfig(
        name=RUN_NAME,
        storage_path=str(work),  # absolute: Ray Train resolves storage through pyarrow URIs
        failure_config=FailureConfig(max_failures=MAX_FAILURES),
        checkpoint_config=CheckpointConfig(num_to_keep=1),
        logging_config=LoggingConfig(log_level="WARNING"),  # not a line per report on the console
    )
    trainer = ray.train.torch.TorchTrainer(
        _train_worker,
        train_loop_config=config | {"curves": queue},
        scaling_config=_scaling(spec.distill),
        run_config=run_config,
    )
    try:
        return _fit_streaming(trainer, queue, report)
    finally:
        queue.shutdown()
