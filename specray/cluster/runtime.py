"""Starting or joining Ray — the one place the program decides where Ray runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from specray.config import RaySpec


@contextmanager
def ray_session(spec: RaySpec) -> Iterator[None]:
    """Use the running Ray, else start a local one (`ray.address: null`) or join the cluster at the address;
    a Ray started here is shut down on exit."""
    if ray.is_initialized():
        yield
        return
    # workers' own log lines drown the sweep's progress display; SPECRAY_RAY_LOGS=1 shows them
    # (errors in workers still reach the driver as exceptions either way)
    log_to_driver = os.environ.get("SPECRAY_RAY_LOGS", "") not in ("", "0")
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
        ray.init(address=spec.address, log_to_driver=log_to_driver)
    try:
        yield
    finally:
        ray.shutdown()
