"""Starting or joining Ray — the one place the program decides where Ray runs."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from specray.config import RaySpec

# Ray Train settings for a Ray that `ray_session` starts on this machine, where a user has not set them
# (Ray reads them from the driver's environment and hands them on to its controller and workers):
# - the controller polls its workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, and a run's start, each
#   checkpoint report and its end each wait for a poll; a local poll is a cheap call;
# - the preemption watcher (an actor per run, polling on a timer) watches for nodes being drained, which a
#   machine's own local Ray never is.
# benchmarks/distill/train_overhead.py measures what they save per draft.
GCS_WAIT_S = 60.0  # how long a cluster's address may refuse connections before the run gives up on it

LOCAL_TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


_started_here = False  # whether the running Ray is a local one that `ray_session` started


def started_here() -> bool:
    """Whether the running Ray is a local one that `ray_session` started (`ray.address: null`): one machine,
    no autoscaler, shut down when the session ends."""
    return _started_here and ray.is_initialized()


@contextmanager
def ray_session(spec: RaySpec) -> Iterator[None]:
    """Use the running Ray, else start a local one (`ray.address: null`) or join the cluster at the address;
    a Ray started here is shut down on exit."""
    global _started_here
    if ray.is_initialized():
        yield
        return
    # workers' own log lines drown the sweep's progress display; SPECRAY_RAY_LOGS=1 shows them
    # (errors in workers still reach the driver as exceptions either way)
    log_to_driver = os.environ.get("SPECRAY_RAY_LOGS", "") not in ("", "0")
    unset = {n: v for n, v in LOCAL_TRAIN_ENV.items() if n not in os.environ} if spec.address is None else {}
    os.environ.update(unset)
    try:
        if spec.address is None:
            # "local" never attaches to another cluster found on the machine; bind to loopback only.
            ray.init(
                "local",
                num_cpus=spec.num_cpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                log_to_driver=log_to_driver,
            )
        else:
            check_reachable(spec.address)
            ray.init(address=spec.address, log_to_driver=log_to_driver)
        _started_here = spec.address is None
        try:
            yield
        finally:
            _started_here = False
            ray.shutdown()
    finally:
        for name in unset:  # the driver's environment as it was, also when Ray did not start
            os.environ.pop(name, None)


def check_reachable(address: str, wait_s: float | None = None) -> None:
    """Raise ConnectionError naming `address` when nothing listens there for `wait_s` seconds (default
    GCS_WAIT_S: a head that restarts is waited for). `ray.init` itself retries a dead head's address for
    about a quarter of an hour, printing a warning every few seconds, before it fails: a driver started
    just after its cluster died would wait that long. `auto` and `ray://` (client) addresses are left to
    Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    deadline = time.monotonic() + (GCS_WAIT_S if wait_s is None else wait_s)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5.0).close()
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                why = e.strerror or type(e).__name__
                raise ConnectionError(f"no Ray cluster answers at {address} (ray.address): {why}") from None
            time.sleep(1.0)


def train_env_seen_by_a_worker(folder: Path) -> dict[str, str]:
    """The values of LOCAL_TRAIN_ENV's names as a Ray Train worker on the running Ray reads them ("unset"
    where it has none): what Ray actually ran with, whoever set them. A one-worker run with its storage in
    `folder`."""
    import ray.train
    from ray.train.torch import TorchTrainer

    seen = Path(folder) / "train_env_seen.json"

    def read(config: dict) -> None:
        values = {name: os.environ.get(name, "unset") for name in LOCAL_TRAIN_ENV}
        Path(config["file"]).write_text(json.dumps(values))

    TorchTrainer(
        read,
        train_loop_config={"file": str(seen)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(storage_path=str(Path(folder) / "train_env_run")),
    ).fit()
    return json.loads(seen.read_text())
