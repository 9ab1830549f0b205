"""A multi-node Ray cluster on one machine: a head and worker nodes on 127.0.0.1, started, lost and stopped.

What the multi-node tests and the chaos harness (benchmarks/chaos/) both run a sweep on. It lives in the
package, not in tests/ or benchmarks/, because both import it and neither may import the other: benchmarks
run as modules from the repository root without tests/ on their path, and tests should not depend on
benchmark scripts. It imports no Ray (it drives the `ray` command beside this interpreter and reads the
dashboard's state API over HTTP), so it costs nothing to import.

Each node is a `ray start --block` process leading a process group of its own (every process of the node
stays in its group: raylet, GCS, workers), with free ports, token auth and a temp dir of its own, so a kill
reaches exactly this cluster and nothing else Ray runs on the machine (other users' sessions, other tests'
clusters). `ray stop` is never used: it stops every Ray on the machine. A worker node is named by a custom
resource of its own (`worker_1`, `worker_2`, ... in order of start), which is how its node id is found.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).parent / "ray")
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port")
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
)
START_S = 600.0  # a node that has not registered after this long did not start (a loaded machine is slow)
START_TRIES = 5  # on a loaded machine `ray start` can time out ("The current node timed out during startup")
STARTING = (OSError, KeyError, ValueError)  # the dashboard's state API is still starting


def free_ports(n: int) -> list[int]:
    """`n` different free loopback ports (all bound at once, so they differ)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class LoopbackCluster:
    """A head (`head_cpus`) and worker nodes (`worker_cpus` each); `env` is what every node runs with, and
    once started what a driver needs to join it (the auth token added). The head takes the same ports at
    every start, so a cluster started again has the same address (a user's command does not change)."""

    env: Mapping[str, str]
    head_cpus: int = 1
    worker_cpus: int = 1
    # short: Ray's unix socket paths under the temp dir must stay below 108 characters
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="srlb-", dir="/tmp")))
    ports: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)
    node_id: dict[str, str] = field(default_factory=dict)  # name -> Ray's node id, once it registered
    started_workers: int = 0

    def __post_init__(self) -> None:
        self.env = {**self.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.ports = dict(zip(HEAD_PORTS + NODE_PORTS, free_ports(len(HEAD_PORTS + NODE_PORTS)), strict=True))

    @property
    def address(self) -> str:
        """The GCS address, for `ray.address=`."""
        return f"127.0.0.1:{self.ports['port']}"

    def start(self) -> None:
        """The head, then one worker node; returns once Ray lists both alive."""
        args = [f"--num-cpus={self.head_cpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1"]
        args += ["--disable-usage-stats", *(f"--{k}={v}" for k, v in self.ports.items())]
        self._start_node(lambda: ["--head", *args], "head")
        self.start_worker()

    def start_worker(self) -> str:
        """One more worker node (what an autoscaler does after a node is lost); its name once Ray lists it."""
        self.started_workers += 1
        name = f"worker_{self.started_workers}"
        args = [
            f"--address={self.address}",
            f"--num-cpus={self.worker_cpus}",
            f"--resources={json.dumps({name: 1})}",
        ]

        def with_free_ports() -> list[str]:
            # drawn anew for every try: a port free when drawn can be taken before the node binds it (an
            # outgoing connection's local port comes from the same range), and that try then fails
            ports = dict(zip(NODE_PORTS, free_ports(len(NODE_PORTS)), strict=True))
            return [*args, *(f"--{k}={v}" for k, v in ports.items())]

        self._start_node(with_free_ports, name)
        return name

    def _start_node(self, args: Callable[[], list[str]], name: str) -> None:
        """`ray start` a node with `args()` and wait until Ray lists it alive; a start that fails is stopped
        and tried again, up to START_TRIES times."""
        for attempt in range(1, START_TRIES + 1):
            with (self.root / f"{name}.log").open("a") as log:  # the child keeps its own descriptor
                self.nodes[name] = subprocess.Popen(
                    [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=0", *args()]
                    + [f"--temp-dir={self.root / name}"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(self.env),
                    start_new_session=True,  # a process group of its own: killpg reaches exactly this node
                )
            deadline = time.monotonic() + START_S
            while self.nodes[name].poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(*STARTING):
                    if name in (alive := self.node_ids()):
                        self.node_id[name] = alive[name]
                        return
                time.sleep(0.5)
            _end_group(self.nodes.pop(name), grace_s=0.0)
            log_tail = (self.root / f"{name}.log").read_text().strip().splitlines()[-1:]
            print(f"ray start of {name} failed (try {attempt} of {START_TRIES}): {log_tail}", flush=True)
        raise RuntimeError(f"ray start of {name} failed {START_TRIES} times: see {self.root / name}.log")

    def state(self, resource: str) -> list[dict[str, Any]]:
        """Rows of the dashboard's state API (`actors`, `nodes`), dead ones included; raises one of
        STARTING while the dashboard is not up."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports['dashboard-port']}/api/v0/{resource}?limit=10000&detail=1",
            headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            rows: list[dict[str, Any]] = json.loads(response.read())["data"]["result"]["result"]
        return rows

    def node_ids(self) -> dict[str, str]:
        """Name -> node id of this cluster's nodes that Ray lists alive now (raises as `state` does)."""
        ids: dict[str, str] = {}
        for node in self.state("nodes"):
            if node["state"] == "ALIVE":
                names = ["head"] if node["is_head_node"] else list(node.get("resources_total", {}))
                ids |= {name: node["node_id"] for name in names if name in self.nodes}
        return ids

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of node `name`: a lost machine."""
        _end_group(self.nodes.pop(name), grace_s=0.0)

    def stop(self) -> list[int]:
        """Stop every node (SIGTERM, then SIGKILL), then any process of the cluster still there after 30 s,
        and remove the temp dir; returns those last processes' ids (none should be: a node's workers lead
        process groups of their own and exit once they see their raylet gone)."""
        for name in list(self.nodes)[::-1]:
            _end_group(self.nodes.pop(name), grace_s=10.0)
        deadline = time.monotonic() + 30.0
        while (leftovers := self._processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)
        return leftovers

    def _processes(self) -> list[int]:
        """The live processes of the cluster: its temp dir on their command line, or its auth token in their
        environment (a Ray worker renames itself `ray::Class.method` and leads a process group of its own)."""
        token = f"RAY_AUTH_TOKEN={self.env['RAY_AUTH_TOKEN']}".encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    named = str(self.root).encode() in (entry / "cmdline").read_bytes()
                    if named or token in (entry / "environ").read_bytes().split(b"\0"):
                        pids.append(int(entry.name))
        return pids


@contextlib.contextmanager
def loopback_cluster(
    env: Mapping[str, str], head_cpus: int = 1, worker_cpus: int = 1
) -> Iterator[LoopbackCluster]:
    """A started head and worker node, stopped on exit even on failure; a process of the cluster that
    outlives its nodes fails the exit."""
    cluster = LoopbackCluster(env, head_cpus, worker_cpus)
    try:
        cluster.start()
        yield cluster
    finally:
        leftovers = cluster.stop()
        if leftovers:
            raise RuntimeError(
                f"Ray processes of the loopback cluster survived its process groups: {leftovers}"
            )


def _end_group(node: subprocess.Popen, grace_s: float) -> None:
    """Signal the node's process group until it is gone: SIGTERM for `grace_s` (the GCS lingers on it),
    then SIGKILL, sent again while processes forked meanwhile remain. `poll()` reaps `ray start`: unreaped,
    it would keep its group alive as a zombie."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 60.0)):
        deadline = time.monotonic() + wait_s
        while node.poll() is None or _group_alive(node.pid):
            if time.monotonic() > deadline:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, sig)
            time.sleep(0.2)
        else:
            return


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
