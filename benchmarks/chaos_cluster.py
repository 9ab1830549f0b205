"""The chaos run's Ray: a head and a worker node on 127.0.0.1, started, killed and started again.

Each node is a `ray start --block` process leading a process group of its own (every process of the node
stays in its group: raylet, GCS, workers, actors), with its own ports, token auth and temp dir, so every
kill here reaches exactly this cluster and nothing else Ray runs on the machine (other users' sessions,
other tests' clusters). `ray stop --force` is never used: it stops every Ray on the machine.

Targets are found from the outside, by process: a Ray actor's process takes the title `ray::<Class>` (or
`ray::<Class>.<method>` while it runs a call), which `/proc/<pid>/cmdline` shows; its node is the process
group it belongs to. Nothing in specray helps: no hook, no marker, no special environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
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
START_TRIES = 5


def free_ports(n: int) -> list[int]:
    """`n` different free loopback ports (all bound at once, so they differ)."""
    import socket

    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class Cluster:
    """A head (`head_cpus`) and one worker node (`worker_cpus`); `env` is what every node and the driver run
    with (the token, the cache). Worker nodes are named `worker_1`, `worker_2`, ... in order of start."""

    env: dict[str, str]
    head_cpus: int = 1
    worker_cpus: int = 1
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="srchaos-", dir="/tmp")))
    ports: dict[str, int] = field(default_factory=dict)
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)
    started_workers: int = 0

    def __post_init__(self) -> None:
        self.env = {**self.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        names = HEAD_PORTS + NODE_PORTS
        self.ports = dict(zip(names, free_ports(len(names)), strict=True))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports['port']}"

    def start(self) -> None:
        """The head, then one worker node; returns once Ray lists both alive. The head takes the same ports
        each time, so a restarted cluster has the same address (the user's command does not change)."""
        args = [f"--num-cpus={self.head_cpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1"]
        args += ["--disable-usage-stats", *(f"--{k}={v}" for k, v in self.ports.items())]
        self.nodes = {}
        self._start_node(["--head", *args], "head")
        self.start_worker()

    def start_worker(self) -> str:
        """One more worker node (what an autoscaler does after a node is lost); returns its name once Ray
        lists it alive."""
        self.started_workers += 1
        name = f"worker_{self.started_workers}"
        ports = dict(zip(NODE_PORTS, free_ports(len(NODE_PORTS)), strict=True))
        args = [f"--address={self.address}", f"--num-cpus={self.worker_cpus}"]
        args += [f"--resources={json.dumps({name: 1})}", *(f"--{k}={v}" for k, v in ports.items())]
        self._start_node(args, name)
        return name

    def _start_node(self, args: list[str], name: str) -> None:
        """`ray start` a node and wait until Ray lists it alive; on a loaded machine a start can time out
        (`The current node timed out during startup`), so a failed one is stopped and tried again."""
        for attempt in range(1, START_TRIES + 1):
            self.nodes[name] = self._ray_start(args, name)
            deadline = time.monotonic() + START_S
            while name not in self._alive_nodes() and self.nodes[name].poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            else:
                if self.nodes[name].poll() is None:
                    return
            _kill_group(self.nodes.pop(name))
            log = (self.root / f"{name}.log").read_text().strip().splitlines()[-1:]
            print(f"ray start of {name} failed (try {attempt} of {START_TRIES}): {log}", flush=True)
        raise RuntimeError(f"ray start of {name} failed {START_TRIES} times: see {self.root / name}.log")

    def _ray_start(self, args: list[str], name: str) -> subprocess.Popen:
        temp = self.root / name
        with (self.root / f"{name}.log").open("a") as log:
            return subprocess.Popen(
                [str(BIN / "ray"), "start", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=0", *args]
                + [f"--temp-dir={temp}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # a process group of its own: killpg reaches exactly this node
            )

    def _alive_nodes(self) -> set[str]:
        """The names of the nodes Ray lists alive (a worker node is named by its own resource)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports['dashboard-port']}/api/v0/nodes?limit=1000&detail=1",
            headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                rows = json.loads(response.read())["data"]["result"]["result"]
        except (OSError, ValueError, KeyError):  # the dashboard is still starting
            return set()
        alive = [row for row in rows if row["state"] == "ALIVE"]
        return {"head" for row in alive if row["is_head_node"]} | {
            name for row in alive for name in row.get("resources_total", {}) if name in self.nodes
        }

    # ------------------------------------------------------------ finding and killing

    def groups(self) -> dict[int, str]:
        """Process group -> node name, for the nodes started and not killed."""
        return {node.pid: name for name, node in self.nodes.items() if node.poll() is None}

    def actors(self, class_name: str) -> list[tuple[int, str]]:
        """(pid, node) of the live processes of this cluster titled `ray::<class_name>`, by pid. A Ray worker
        process leads a session of its own; its node is that of its parent, the node's raylet."""
        groups, processes = self.groups(), _processes()
        found = []
        for pid, (title, parent, _group) in processes.items():
            if title.split(".")[0].strip() != f"ray::{class_name}":
                continue
            for _ in range(4):  # up the parents to a process of one of the nodes' groups
                if parent not in processes:
                    break
                if processes[parent][2] in groups:
                    found.append((pid, groups[processes[parent][2]]))
                    break
                parent = processes[parent][1]
        return sorted(found)

    @property
    def worker(self) -> str | None:
        """The name of the live worker node (the latest started)."""
        live = [name for name in self.groups().values() if name != "head"]
        return live[-1] if live else None

    def kill_node(self, name: str) -> None:
        """SIGKILL every process of node `name`: a lost machine."""
        node = self.nodes.pop(name)
        _kill_group(node)

    def kill_all(self) -> None:
        """SIGKILL every process of every node of this cluster: `ray stop --force`, for this Ray only."""
        for name in list(self.nodes)[::-1]:
            self.kill_node(name)

    def close(self) -> None:
        self.kill_all()
        leftovers = _processes_of(self.root)
        for pid in leftovers:  # a process that left its group (none should)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def _processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (title, parent pid, process group) of every live process (zombies left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X"):
                found[int(entry.name)] = (title, int(fields[1]), int(fields[2]))
    return found


def _kill_group(node: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.pid, signal.SIGKILL)
    node.wait(timeout=60)  # reaped: an unreaped leader keeps its group alive as a zombie
    deadline = time.monotonic() + 60
    while _group_alive(node.pid) and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)  # processes forked while the first signal went out
        time.sleep(0.2)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _processes_of(root: Path) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(root).encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids
