"""Starting or joining Ray — the one place the program decides where Ray runs."""

from __future__ import annotations

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
    if spec.address is None:
        # "local" never attaches to another cluster found on the machine; bind to loopback only.
        ray.init("local", num_cpus=spec.num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1")
    else:
        ray.init(address=spec.address)
    try:
        yield
    finally:
        ray.shutdown()
