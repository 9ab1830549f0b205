"""What specray works around in Ray's internals, read against Ray 2.60.0 (Ray Train V2): each piece names
the behaviour it relies on, so an upgrade knows what to check. Nothing here is a public Ray API.

- `lost_in_controller`: Train V2 wraps a `RayActorError` raised while its controller starts or clears the
  worker group in a `ControllerError` that its failure policy never retries; the driver starts such a run
  again (`ray_train.MAX_FAILURES` times), and the run resumes from its latest checkpoint.
- `registered`, `wait_for_registered`: the controller registers a reported checkpoint asynchronously, in
  `checkpoint_manager_snapshot.json` in the run's storage folder; fault injection waits for it there, so an
  injected crash always follows the checkpoint it is meant to follow.
- `scratch_folder`: a Train worker killed mid-run leaves the checkpoint it was writing in its local folder
  and nothing in Ray removes it.
- `torch_trainer`: Train V2's trainer adds a Ray Data callback to every run's default callbacks (in
  `ray.train.v2.api.data_parallel_trainer`), which starts a `DatasetManager` actor — one more process
  importing Ray Train and Ray Data — also for a run given no datasets; specray's runs pass their rows in the
  run's config, so theirs leave it out. On a Ray that specray started on this machine (`local_ray`), the
  run's scaling policy also sends no resource requests: Train's fixed scaling policy, once the controller
  starts, starts Ray Data's detached `AutoscalingCoordinator` actor (one more process importing Ray Train and
  Ray Data) and asks it for the run's resources, every 20 s while the run lasts, for an autoscaler to act
  on; a local Ray has no autoscaler that could add a node.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.train.torch import TorchTrainer

SCRATCH_DIR = "specray-scratch"  # under the system temp: one folder per worker process (`scratch_folder`)
SNAPSHOT = "checkpoint_manager_snapshot.json"  # Train V2's record of a run's checkpoints, in its folder


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


def registered(snapshot: Path, metrics: Mapping[str, Any] | None = None) -> bool:
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


def wait_for_registered(run_folder: Path, metrics: Mapping[str, Any], timeout_s: float = 120.0) -> None:
    """Wait (at most `timeout_s`) until the controller has registered the checkpoint reported with
    `metrics` in the run folder's snapshot."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if registered(run_folder / SNAPSHOT, metrics):
            return
        time.sleep(0.2)


def lost_in_controller(error: BaseException) -> bool:
    """Whether a run failed because its controller lost a worker actor (its node died) in a call Train V2
    does not turn into a worker-group restart — starting the group (`run_train_fn`), clearing it after a
    failure — rather than because of anything the run does: another start, like a re-run of the driver,
    resumes it. Why here and not in Ray: Train 2.x wraps these calls' `RayActorError` in a `ControllerError`,
    which its failure policy never retries."""
    from ray.exceptions import RayActorError
    from ray.train import ControllerError

    return isinstance(error, ControllerError) and isinstance(error.controller_failure, RayActorError)


def torch_trainer(*args: Any, local_ray: bool = False, **kwargs: Any) -> TorchTrainer:
    """`ray.train.torch.TorchTrainer(*args, **kwargs)`, less the Ray Data callback when it is given no
    `datasets`: no `DatasetManager` actor per run (`benchmarks/distill/train_overhead.py` measures the
    difference). A run with datasets gets Train's callbacks as they are. `local_ray`: the running Ray is a
    local one (`specray.cluster.runtime.started_here`), where the run asks no autoscaler for resources."""
    return _lean_trainer_class(local_ray)(*args, **kwargs)


@functools.cache
def _lean_trainer_class(local_ray: bool) -> type[TorchTrainer]:
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy

    class NoRequestsScalingPolicy(FixedScalingPolicy):
        """Train's fixed scaling policy without the autoscaling coordinator: the same decisions, no
        requests. Defined here, so that Ray pickles the class itself and its controller imports nothing of
        specray."""

        def after_controller_start(self, train_run_context: Any) -> None:
            pass  # the base class starts the coordinator's client and sends the run's first request

        def _maybe_send_resource_request(self) -> None:
            pass  # (cancelling is a no-op already without a client)

    class LeanTorchTrainer(TorchTrainer):
        def _create_default_callbacks(self) -> list:
            # mypy sees Train v1's TorchTrainer (ray.train picks v1 or v2 at import time); v2's has it
            callbacks = super()._create_default_callbacks()  # type: ignore[misc]
            if self.datasets:
                return callbacks
            return [callback for callback in callbacks if not isinstance(callback, DatasetsCallback)]

        def _initialize_and_run_controller(self, **controller_kwargs: Any) -> Any:
            policy = controller_kwargs["scaling_policy"]
            if local_ray and type(policy) is FixedScalingPolicy:  # an elastic run's policy stays Train's
                controller_kwargs["scaling_policy"] = NoRequestsScalingPolicy(policy.scaling_config)
            return super()._initialize_and_run_controller(**controller_kwargs)  # type: ignore[misc]

    return LeanTorchTrainer
