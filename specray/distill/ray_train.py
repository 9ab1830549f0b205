"""Ray Train adapter, the driver of runs: the distillation loop under a `TorchTrainer` (Ray Train V2). With
`train_worker.py` (the worker's side) and `ray_2_60.py` (what works around Ray's internals), the only
distill modules that import Ray.

One Train run distils one draft (`distill`) or several one after another (`distill_drafts`), and a call
runs several such runs side by side (`distill_runs`: the sweep's stage runner shares its drafts out among
a few, `sweep.stages.train_runs`, so Ray Train's start — controller, placement group, worker processes
importing torch and transformers — is paid once per run rather than once per draft).

Driver side: read every draft's shards before Ray starts (`prepare_inputs`: a missing shard is one clear
error, never a retried worker failure; the request itself was validated where its `Draft` was planned);
pass the rows and resolved model paths to the workers (no worker reads the driver's cache or builds the
zoo); run the trainer.

Worker side (`train_worker.TrainWorkerSession`, one per draft): the loop's `Session` over Ray Train — DDP
through `ray.train.torch.prepare_model` (gloo on CPU, NCCL on GPU), sums through
`torch.distributed.all_reduce`, checkpoints through `ray.train.report(..., checkpoint=...)` (rank 0 writes,
every rank reports: it is a barrier) and resume through `ray.train.get_checkpoint()`, which is the run's
latest checkpoint: a session resumes from it only if it is its own draft's (each checkpoint names its draft
key). At a draft's last step rank 0 publishes its last checkpoint as the draft (`checkpoints.publish`: marker
written last) and moves on to the next. When a worker dies, `FailureConfig(max_failures)` makes the controller
restart the whole worker group: it skips the drafts already published, resumes the one the latest checkpoint
names and still ends it at `distill.steps` (the data order is a function of the step, so the resumed run is
the uninterrupted one). Ray's run folder (checkpoints, its snapshot) lives in a work folder beside the drafts,
keyed by the drafts' keys, so calling again after the driver itself died resumes too (Train V2 restores a run
by storage path and name). The controller takes reports asynchronously: a checkpoint reported in the instant
before a crash may not be registered, and the run then resumes from the one before it. On a multi-node cluster
the drafts' folder must be on storage every node shares (NFS), as Ray Train requires of its storage path.

Reports: rank 0 puts each curve point (and each publication) on one Ray queue (an actor on the driver's
node) shared by every run of the call, and the thread that called `distill_runs` takes them off it and
hands them to `report` and `published` while each run's `fit` runs in a helper thread — so the callbacks
run live, on the driver, in the caller's thread: one hop from a worker to the sweep's display and MLflow.
Points that a restarted worker group reports again (steps after the checkpoint it resumed from) are not
passed on twice. Only checkpoints go through `ray.train.report`: Train V2's worker holds one unconsumed
report and its controller takes it at each poll (every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), so a report per
curve point would hold a fast loop to one point per poll.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.util.queue import Empty, Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from specray.cluster.actors import Demand, check_local_fits
from specray.cluster.runtime import ray_session, started_here
from specray.config import DistillSpec, SweepSpec
from specray.data.examples import Example
from specray.distill.checkpoints import (
    claim_work_dir,
    is_finished,
    read_curves,
    set_aside_damaged,
)
from specray.distill.curves import CurvePoint
from specray.distill.inputs import prepare_inputs
from specray.distill.loop import DistillResult, worker_resources
from specray.distill.ray_2_60 import lost_in_controller, torch_trainer
from specray.distill.train_worker import RUN_CONFIG, RUN_NAME, TrainJob, TrainRun, train_worker
from specray.draft import Draft
from specray.errors import USER_ERRORS, find_cause
from specray.faults import Faults
from specray.keys import digest

__all__ = ["distill", "distill_drafts", "distill_runs", "is_finished"]

log = logging.getLogger(__name__)

MAX_FAILURES = 3  # restarts of a run before it fails (a deterministic bug must not loop forever)


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


def _fit(trainer: Callable[[], ray.train.torch.TorchTrainer]) -> ray.train.Result:
    """`trainer().fit()`; a run whose controller failed because it lost a worker (`lost_in_controller`) is
    started again, from its latest checkpoint, at most MAX_FAILURES times. A user error raised in a worker
    comes back as itself."""
    for attempt in range(MAX_FAILURES + 1):
        try:
            return trainer().fit()
        except Exception as error:
            if attempt < MAX_FAILURES and lost_in_controller(error):
                lost = type(error.controller_failure).__name__  # type: ignore[attr-defined]
                log.warning("Ray Train lost a worker while starting it (%s): starting the run anew", lost)
                continue
            cause = _user_error(error)
            if cause is error:
                raise
            raise cause from error
    raise AssertionError("unreachable: the last attempt returns or raises")


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
    """Distill one draft in a Ray Train run of its own (`distill.workers` DDP workers) and publish it in its
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
    """Distill several drafts one after another in one Ray Train run and publish each as it ends: one run
    of `distill_runs`."""
    return distill_runs(spec, [drafts], splits, report, published)[0]


def distill_runs(
    spec: SweepSpec,
    runs: Sequence[Sequence[Draft]],
    splits: Mapping[str, Sequence[Example]] | None = None,
    report: Callable[[str, CurvePoint], None] | None = None,
    published: Callable[[str], None] | None = None,
) -> list[list[DistillResult]]:
    """Distill the drafts of each of `runs` one after another in a Ray Train run of its own, the runs side
    by side, and publish each draft as it ends.

    One run pays Ray Train's start (controller, placement group, worker processes importing torch and
    transformers, models loaded; `benchmarks/distill/train_runs.py` measures it) once for all of its drafts.
    Each draft trains under its own spec, in its own folder, keyed by its own key (the plan's `Draft`); `spec`
    is the call's (Ray, the Train workers' resources). Drafts already published under their key are skipped;
    the others are trained in the given order. `splits`: the sweep's splits as its plan built them (the fixed
    data and the probe's prompts come from them). `report(draft, curve)` gets each curve point and
    `published(draft)` each publication once, live, on this thread, straight from the workers' one queue (an
    exception from `report` is logged; one from `published` is raised once every run has ended). Calling it
    again with the same runs after the driver died resumes: a run's folder is keyed by its drafts' keys, and
    its latest checkpoint names its draft (the drafts before it are published; the ones after it start fresh).
    Returns each run's drafts' results, in order.
    """
    runs = [[replace(d, folder=Path(d.folder).absolute()) for d in drafts] for drafts in runs]
    for draft in (d for drafts in runs for d in drafts):
        set_aside_damaged(draft.folder)
    works = [_claim_run_dir(drafts) for drafts in runs]
    trains = [  # the drafts of each run not published yet; every user error surfaces here, before Ray
        TrainRun(
            [TrainJob(d, prepare_inputs(d, splits)) for d in drafts if not is_finished(d.folder, d.key)],
            str(work),
            Faults.from_env(),
        )
        for drafts, work in zip(runs, works, strict=True)
    ]
    if any(train.jobs for train in trains):
        with ray_session(spec.ray):
            if spec.ray.address is None:  # a remote cluster may autoscale; a local one never grows
                check_local_fits(_demand(spec))
            _run_trainers(spec, [train for train in trains if train.jobs], report, published)
    for work in works:
        shutil.rmtree(work, ignore_errors=True)
    return [
        [DistillResult(d.folder, d.train_spec.distill.steps, read_curves(d.folder)) for d in drafts]
        for drafts in runs
    ]


def _claim_run_dir(drafts: Sequence[Draft]) -> Path:
    """The run's work folder: `.<draft>.work` beside a single draft; `.run-<digest>.work` beside the first
    of several, named by all of their keys (the same drafts find the same folder again)."""
    if len(drafts) == 1:
        return claim_work_dir(drafts[0].folder, drafts[0].key)
    run_key = digest({"drafts": [draft.key for draft in drafts]})
    return claim_work_dir(drafts[0].folder.parent / f"run-{run_key[:16]}", run_key)


def _run_trainers(
    spec: SweepSpec,
    runs: Sequence[TrainRun],
    report: Callable[[str, CurvePoint], None] | None,
    published: Callable[[str], None] | None,
) -> None:
    """Every run's `fit` in a daemon thread of its own (a driver stopped with Ctrl-C does not wait for its
    runs: Ray's shutdown ends them) while this thread follows the one queue all their workers report to:
    each curve point to `report`, each publication to `published`, as they arrive."""
    # On this process's node (the driver's, or a Tune trial's), like Train's controller: this process reads
    # the queue for the whole run, and a lost worker node must not take the queue along with it, failing a
    # run that Train itself survives (tests/integration/test_two_nodes.py).
    on_driver_node = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": on_driver_node})
    try:
        fits = {_start(_trainer(spec, replace(run, curves=queue))): run for run in runs}
        _follow(queue, fits, report, published)
    finally:
        queue.shutdown()


def _start(trainer: Callable[[], ray.train.torch.TorchTrainer]) -> Future:
    """`_fit(trainer)` in a daemon thread; its outcome in the future."""
    outcome: Future = Future()

    def fit() -> None:
        try:
            outcome.set_result(_fit(trainer))
        except BaseException as error:  # handed to the following thread
            outcome.set_exception(error)

    threading.Thread(target=fit, name="specray-distill-fit", daemon=True).start()
    return outcome


def _trainer(spec: SweepSpec, run: TrainRun) -> Callable[[], ray.train.torch.TorchTrainer]:
    """A run's TorchTrainer, made anew for each start: the same name and storage, so a restart resumes."""
    # mypy sees Train v1's RunConfig (ray.train picks v1 or v2 at import time); v2's takes logging_config
    run_config = RunConfig(  # type: ignore[call-arg]
        name=RUN_NAME,
        storage_path=run.work,  # absolute: Ray Train resolves storage through pyarrow URIs
        failure_config=FailureConfig(max_failures=MAX_FAILURES),
        checkpoint_config=CheckpointConfig(num_to_keep=1),
        logging_config=LoggingConfig(log_level="WARNING"),  # not a line per report on the console
    )
    local_ray = started_here()
    return lambda: torch_trainer(
        train_worker,
        local_ray=local_ray,
        train_loop_config={RUN_CONFIG: run},
        scaling_config=_scaling(spec.distill),
        run_config=run_config,
    )


def _follow(
    queue: Queue,
    fits: Mapping[Future, TrainRun],
    report: Callable[[str, CurvePoint], None] | None,
    published: Callable[[str], None] | None,
) -> None:
    """Hand what the runs' workers put on `queue` on, in this thread, until every run has ended (`_Told`).
    The first failure — a run's, or `published`'s — is raised once every run has ended: a run lives on the
    cluster and goes on regardless, so it is followed to its end, never orphaned."""
    told = _Told(report, published)
    ended: set[Future] = set()
    while len(ended) < len(fits):
        done = [fit for fit in fits if fit not in ended and fit.done()]
        for item in _drain(queue, timeout=0.0 if done else 0.5):
            told.item(item)
        for fit in done:  # what its workers put on the queue before it ended has been drained above
            ended.add(fit)
            told.ended(fit, fits[fit])
    if told.failures:
        raise told.failures[0]


class _Told:
    """What the caller was told: curve points to `report` (a restarted worker group's points after its
    checkpoint are passed on once) and publications to `published`, once per draft; a draft published in
    the instant before a restart, its message lost with the worker, is told when its run ends. A draft is
    known by its folder: two drafts of one call may share a name (the same recipe into two folders)."""

    def __init__(
        self, report: Callable[[str, CurvePoint], None] | None, published: Callable[[str], None] | None
    ) -> None:
        self.report, self.published = report, published
        self.last_step: dict[str, int] = {}  # by folder
        self.folders: set[str] = set()  # of the drafts published and told
        self.failures: list[BaseException] = []

    def item(self, item: dict) -> None:
        draft, folder = item["draft"], item["folder"]
        if "published" in item:
            self.publication(draft, folder)
            return
        curve = CurvePoint.from_json(item["curve"])
        if curve.step > self.last_step.get(folder, -1) and self.report is not None:
            _call_back(self.report, draft, curve)
        self.last_step[folder] = max(self.last_step.get(folder, -1), curve.step)

    def publication(self, draft: str, folder: str) -> None:
        if folder in self.folders:
            return
        self.folders.add(folder)
        try:
            if self.published is not None:
                self.published(draft)
        except Exception as error:
            self.failures.append(error)

    def ended(self, fit: Future, run: TrainRun) -> None:
        error = fit.exception()
        if error is not None:
            self.failures.append(error)
            return
        for job in run.jobs:
            if is_finished(job.draft.folder, job.draft.key):
                self.publication(job.draft.name, str(job.draft.folder))
            else:
                self.failures.append(RuntimeError(f"{job.draft.name}: the run ended without publishing it"))
