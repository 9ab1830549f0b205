"""Ray Train adapter: the distillation loop under a `TorchTrainer` (Ray Train V2). The only distill module
that imports Ray.

One Train run distils one draft (`distill`) or several one after another (`distill_drafts`: the sweep runs
a few, `sweep.stages.train_runs`, so Ray Train's start — controller, placement group, worker processes
importing torch and transformers — is paid once per run rather than once per draft).

Driver side: validate every request and read the shards before Ray starts (`prepare_inputs`: a bad τ_kd or
a missing shard is one clear error, never a retried worker failure); pass the rows and resolved model paths
to the workers (no worker reads the driver's cache or builds the zoo); run the trainer.

Worker side (`RaySession`, one per draft): the loop's `Session` over Ray Train — DDP through
`ray.train.torch.prepare_model` (gloo on CPU, NCCL on GPU), sums through `torch.distributed.all_reduce`,
checkpoints through `ray.train.report(..., checkpoint=...)` (rank 0 writes, every rank reports: it is a
barrier) and resume through `ray.train.get_checkpoint()`, which is the run's latest checkpoint: a session
resumes from it only if it is its own draft's (each checkpoint names its draft key). At a draft's last step
rank 0 publishes its last checkpoint as the draft (`checkpoints.publish`: marker written last) and moves on
to the next. When a worker dies, `FailureConfig(max_failures)` makes the controller restart the whole worker
group: it skips the drafts already published, resumes the one the latest checkpoint names and still ends it
at `distill.steps` (the data order is a function of the step, so the resumed run is the uninterrupted one).
Ray's run folder (checkpoints, its snapshot) lives in a work folder beside the drafts, keyed by the drafts'
keys, so calling again after the driver itself died resumes too (Train V2 restores a run by storage path and
name). The controller takes reports asynchronously: a checkpoint reported in the instant before a crash may
not be registered, and the run then resumes from the one before it. On a multi-node cluster the drafts'
folder must be on storage every node shares (NFS), as Ray Train requires of its storage path.

Reports: rank 0 puts each curve point (and each publication) on a Ray queue (an actor on the driver's node),
and the driver thread that called `distill` hands it to `report` while `fit` runs in a helper thread — so
`report` runs live, on the driver, in the caller's thread. Points that a restarted worker group reports
again (steps after the checkpoint it resumed from) are not passed on twice. Only checkpoints go through
`ray.train.report`: Train V2's worker holds one unconsumed report and its controller takes it at each poll
(every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), so a report per curve point would hold a fast loop to one point
per poll.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
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
from specray.data.examples import Example
from specray.devices import Resources
from specray.distill.checkpoints import (
    RunState,
    checkpoint_key,
    claim_work_dir,
    is_finished,
    load_trainer_state,
    publish,
    read_curves,
    set_aside_damaged,
)
from specray.distill.curves import CurvePoint
from specray.distill.inputs import DistillInputs, check_request, prepare_inputs
from specray.distill.loop import DistillResult, finished_info, run_training, worker_resources
from specray.draft import Draft
from specray.errors import USER_ERRORS, find_cause
from specray.faults import Faults
from specray.keys import digest

__all__ = ["RaySession", "distill", "distill_drafts", "is_finished"]

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # restarts of a run before it fails (a deterministic bug must not loop forever)
RUN_NAME = "ray_train"
SCRATCH_DIR = "specray-scratch"  # under the system temp: one folder per worker process (`scratch_folder`)


class RaySession:
    """The loop's Session inside a Ray Train worker, computing on the device of the worker's resources.

    One session per draft of the run: `key` is the draft's (a checkpoint of another draft of the same run is
    no checkpoint of this one) and `draft` names its curve points on the queue. Rank 0 keeps its latest
    checkpoint folder after reporting it (`kept`), so the worker can publish the last one itself."""

    def __init__(
        self,
        resources: Resources | None = None,
        faults: Faults | None = None,
        work: Path | None = None,
        curves: Queue | None = None,
        key: str | None = None,
        draft: str = "",
    ) -> None:
        context = ray.train.get_context()
        self.rank, self.world_size = context.get_world_rank(), context.get_world_size()
        self.device = worker_device(resources or Resources(1.0))
        self.scratch_dir = scratch_folder()  # the checkpoint is copied to storage by `report`
        self.faults, self.work, self.curves = faults or Faults(), work, curves
        self.key, self.draft = key, draft
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
            self.curves.put({"draft": self.draft, "curve": curve.to_json()})
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
        if self.work is None:
            return
        snapshot = self.work / RUN_NAME / "checkpoint_manager_snapshot.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _registered(snapshot, metrics):
                return
            time.sleep(0.2)


def scratch_folder(root: Path | None = None) -> Path:
    """This worker process's folder for checkpoints on their way to storage: under the system temp
    (`root`), one per process id. A worker killed mid-run leaves its checkpoint there and nothing of its
    own removes it; the next worker on the node removes the folders of processes that are gone."""
    root = (root or Path(tempfile.gettempdir())) / SCRATCH_DIR
    for folder in root.glob("*"):
        if folder.name.isdigit() and not _alive(int(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)
    own = root / str(os.getpid())
    own.mkdir(parents=True, exist_ok=True)
    return own


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _registered(snapshot: Path, metrics: Mapping[str, Any] | None = None) -> bool:
    """Whether Ray's checkpoint manager snapshot names a latest checkpoint (reported with `metrics`, if
    given: the draft's key and step). Ray rewrites the file in place, so a read can see it missing, empty or
    cut short: all of those are "not yet"."""
    try:
        latest = json.loads(snapshot.read_text() or "{}").get("latest_checkpoint_result")
    except (OSError, json.JSONDecodeError):
        return False
    if not latest:
        return False
    reported = latest.get("metrics", {})
    return metrics is None or all(reported.get(name) == value for name, value in metrics.items())


def worker_device(resources: Resources) -> torch.device:
    """A Train worker's device: Ray Train's choice of GPU (workers on one node see all of its assigned GPUs
    and each takes its local rank's) when the worker reserved GPUs, else the CPU; threads as reserved."""
    device = resources.enter()
    return ray.train.torch.get_device() if device.type == "cuda" else device


@dataclass(frozen=True)
class _TrainJob:
    """One draft of the run, as the workers get it: the plan's record and what the driver read for it."""

    draft: Draft
    inputs: DistillInputs


@dataclass(frozen=True)
class _TrainRun:
    """What every worker of the run gets (Ray Train's `train_loop_config` holds it under RUN_CONFIG)."""

    jobs: list[_TrainJob]
    work: str  # the run's work folder
    faults: Faults
    curves: Queue | None = None  # the driver's queue of curve points and publications


RUN_CONFIG = "run"


def _train_worker(config: dict[str, Any]) -> None:
    """Ray Train's per-worker entry point: rebuild the spec, then run the plain loop for each draft of the
    run that is not published yet (after a restart, the earlier ones are), publishing each from rank 0."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per model load, from every worker, floods the driver's console
    run: _TrainRun = config[RUN_CONFIG]
    for job in run.jobs:
        if not is_finished(job.draft.folder, job.draft.key):
            _train_job(job, run)
            gc.collect()  # the draft's models, states and caches go now, not whenever cycles are next swept


def _train_job(job: _TrainJob, run: _TrainRun) -> None:
    """One draft: the loop from its latest checkpoint (if the run's latest is its own) to `distill.steps`;
    rank 0 then publishes the last checkpoint and tells the driver."""
    draft = job.draft
    resources, work = worker_resources(draft.train_spec), Path(run.work)
    session = RaySession(resources, run.faults, work, run.curves, draft.key, draft.name)
    started = time.perf_counter()
    try:
        run_training(draft, job.inputs, session)
        if session.rank == 0:
            with _last_checkpoint(session) as final:
                state = RunState.from_json(load_trainer_state(final))
                info = finished_info(draft, state, time.perf_counter() - started)
                publish(final, Path(draft.folder), draft.train_spec, info)
            if run.curves is not None:
                run.curves.put({"draft": draft.name, "published": True})
    finally:
        session.release()


@contextmanager
def _last_checkpoint(session: RaySession) -> Iterator[Path]:
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
    trainer: Callable[[], ray.train.torch.TorchTrainer],
    queue: Queue,
    report: Callable[[str, CurvePoint], None] | None,
    published: Callable[[str], None] | None,
) -> ray.train.Result:
    """`trainer().fit()` in a helper thread; each draft's curve points reach `report(draft, curve)`, and its
    publication `published(draft)`, in this thread as they arrive. A run whose controller failed because
    it lost a worker (`lost_in_controller`) is started again, from its latest checkpoint, at most
    MAX_FAILURES times; its points that arrive twice are passed on once."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        for attempt in range(MAX_FAILURES + 1):
            try:
                outcome["result"] = trainer().fit()
                return
            except BaseException as error:  # handed to the caller's thread below
                if attempt < MAX_FAILURES and lost_in_controller(error):
                    lost = type(error.controller_failure).__name__  # type: ignore[attr-defined]
                    log.warning("Ray Train lost a worker while starting it (%s): starting the run anew", lost)
                    continue
                outcome["error"] = error
                return

    thread = threading.Thread(target=fit, name="specray-distill-fit", daemon=True)
    thread.start()
    last_step: dict[str, int] = {}
    while True:
        running = thread.is_alive()
        for item in _drain(queue, timeout=0.5 if running else 0.0):
            draft = item["draft"]
            if "published" in item:
                if published is not None:
                    _call_back(published, draft)
                continue
            curve = CurvePoint.from_json(item["curve"])
            if curve.step > last_step.get(draft, -1) and report is not None:
                _call_back(report, draft, curve)
            last_step[draft] = max(last_step.get(draft, -1), curve.step)
        if not running:
            break
    if "error" in outcome:
        raise _user_error(outcome["error"]) from outcome["error"]
    return outcome["result"]


def lost_in_controller(error: BaseException) -> bool:
    """Whether a run failed because its controller lost a worker actor (its node died) in a call Train V2
    does not turn into a worker-group restart — starting the group (`run_train_fn`), clearing it after a
    failure — rather than because of anything the run does: another start, like a re-run of the driver,
    resumes it. Why here and not in Ray: Train 2.x wraps these calls' `RayActorError` in a `ControllerError`,
    which its failure policy never retries."""
    from ray.exceptions import RayActorError
    from ray.train import ControllerError

    return isinstance(error, ControllerError) and isinstance(error.controller_failure, RayActorError)


def _call_back(callback: Callable[..., None], *args: Any) -> None:
    # The run lives on the cluster and goes on regardless: a failing callback must not orphan it.
    try:
        callback(*args)
    except Exception:
        log.exception("a distillation callback failed on %s; training goes on", args)


def _user_error(error: BaseException) -> BaseException:
    """A user error raised in a worker (bad data, model) is re-raised as itself: one clear line."""
    return find_cause(error, USER_ERRORS) or error


def distill(
    draft: Draft,
    report: Callable[[CurvePoint], None] | None = None,
    splits: Mapping[str, Sequence[Example]] | None = None,
) -> DistillResult:
    """Distil one draft in a Ray Train run of its own (`distill.workers` DDP workers) and publish it in its
    folder (`specray distill`); `report` gets each curve point live, on this thread. A draft already
    published under its key is returned as it is."""
    on_curve = None if report is None else (lambda _name, curve: report(curve))
    return distill_drafts(draft.train_spec, [draft], splits, on_curve)[0]


def distill_drafts(
    spec: SweepSpec,
    drafts: Sequence[Draft],
    splits: Mapping[str, Sequence[Example]] | None = None,
    report: Callable[[str, CurvePoint], None] | None = None,
    published: Callable[[str], None] | None = None,
) -> list[DistillResult]:
    """Distil several drafts one after another in one Ray Train run and publish each as it ends.

    One run pays Ray Train's start (controller, placement group, worker processes importing torch and
    transformers, models loaded; `benchmarks/train_runs.py` measures it) once for all of them. Each draft
    trains under its own spec, in its own folder, keyed by its own key (the plan's `Draft`); `spec` is the
    run's (Ray, the Train workers' resources). Drafts already published under their key are skipped; the
    others are trained in the given order. `splits`: the sweep's splits as its plan built them (the fixed
    data and the probe's prompts come from them). `report(draft, curve)` gets each curve point and
    `published(draft)` each publication, live, on this thread (exceptions from either are logged, not
    raised). Calling it again with the same drafts after the driver died resumes: the run's folder is keyed
    by every draft's key, and its latest checkpoint names its draft (the drafts before it are published;
    the ones after it start fresh).
    """
    drafts = [replace(d, folder=Path(d.folder).absolute()) for d in drafts]
    for draft in drafts:  # a bad paradigm or τ_kd is one clear error here, before any work
        check_request(draft.train_spec, draft.paradigm or "", draft.mixture)
        set_aside_damaged(draft.folder)
    todo = [draft for draft in drafts if not is_finished(draft.folder, draft.key)]
    work = _claim_run_dir(drafts)
    if todo:
        # every user error surfaces here, before Ray
        jobs = [_TrainJob(draft, prepare_inputs(draft, splits)) for draft in todo]
        config = _TrainRun(jobs, str(work), Faults.from_env())
        told: set[str] = set()

        def on_published(name: str) -> None:
            told.add(name)
            if published is not None:
                published(name)

        with ray_session(spec.ray):
            if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
                check_local_fits(_demand(spec))
            _run_trainer(spec, config, work, report, on_published)
        for draft in todo:
            if not is_finished(draft.folder, draft.key):
                raise RuntimeError(f"{draft.name}: the run ended without publishing it")
            if draft.name not in told:  # published just before a restart, the message lost with it
                on_published(draft.name)
    shutil.rmtree(work, ignore_errors=True)
    return [
        DistillResult(draft.folder, draft.train_spec.distill.steps, read_curves(draft.folder))
        for draft in drafts
    ]


def _claim_run_dir(drafts: Sequence[Draft]) -> Path:
    """The run's work folder: `.<draft>.work` beside a single draft; `.run-<digest>.work` beside the first
    of several, named by all of their keys (the same drafts find the same folder again)."""
    if len(drafts) == 1:
        return claim_work_dir(drafts[0].folder, drafts[0].key)
    run_key = digest({"drafts": [draft.key for draft in drafts]})
    return claim_work_dir(drafts[0].folder.parent / f"run-{run_key[:16]}", run_key)


def _run_trainer(
    spec: SweepSpec,
    config: _TrainRun,
    work: Path,
    report: Callable[[str, CurvePoint], None] | None,
    published: Callable[[str], None],
) -> ray.train.Result:
    # On this process's node (the driver's, or a Tune trial's), like Train's controller: this process reads
    # the queue for the whole run, and a lost worker node must not take the queue along with it, failing a
    # run that Train itself survives (tests/integration/test_two_nodes.py).
    on_driver_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": on_driver_node})
    # mypy sees Train v1's RunConfig (ray.train picks v1 or v2 at import time); v2's takes logging_config
    run_config = RunConfig(  # type: ignore[call-arg]
        name=RUN_NAME,
        storage_path=str(work),  # absolute: Ray Train resolves storage through pyarrow URIs
        failure_config=FailureConfig(max_failures=MAX_FAILURES),
        checkpoint_config=CheckpointConfig(num_to_keep=1),
        logging_config=LoggingConfig(log_level="WARNING"),  # not a line per report on the console
    )

    def trainer() -> ray.train.torch.TorchTrainer:  # the same name and storage: a restart resumes the run
        return ray.train.torch.TorchTrainer(
            _train_worker,
            train_loop_config={RUN_CONFIG: replace(config, curves=queue)},
            scaling_config=_scaling(spec.distill),
            run_config=run_config,
        )

    try:
        return _fit_streaming(trainer, queue, report, published)
    finally:
        queue.shutdown()
