"""The smoke sweep on a real Ray cluster of two nodes on this machine, losing its worker node twice.

Nodes are `ray start --block` processes on 127.0.0.1, each the leader of a process group of its own (every
Ray process of a node stays in its group), with free ports, token auth and temp dirs of their own: the head
(1 CPU, the dashboard for the state API) and a worker node (1 CPU, a `worker_node` resource and a name of
its own). They are stopped by killing those groups, never by `ray stop` (it would stop every Ray on the
machine, other tests' included). With one CPU per node, two teacher replicas or two distillation runs
cannot both fit on one node: Ray has to place one of each on the worker node, and the test checks it did.

The sweep loses a worker node in two stages, each killed by SIGKILL to its raylet (as a lost machine):
- mid teacher stage (its replica frozen by SIGSTOP first, so the stage cannot end before; some shard parts
  written): the batches the lost replica held go back on the queue and the head's replica takes them; a
  replacement node joins the cluster, as an autoscaler's would (a fresh replica may start there);
- mid distillation, while a Ray Train worker runs on the replacement node: that run restarts on the head.
The sweep then completes on the head alone, with every shard row, draft and cell exactly once.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specray.config import load_spec
from specray.data.shards import PARTS_DIR, read_shard, shard_dir
from specray.keys import train_shard_keys
from tests.servers import free_ports
from tests.sweeps import (
    COARSE_TIMING,
    SMOKE,
    assert_cells_once,
    assert_tracked_once,
    finished_drafts,
    smoke_command,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.integration
RAY = str(Path(sys.executable).parent / "ray")
OFFLINE_DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1"]
# teacher shards of their own (the teacher really generates here), two replicas and small batches (a
# teacher stage of 64 batches), offline drafts only in two Train runs (one per node: what the cluster's
# 2 CPUs fit, asked for explicitly), step costs timed coarsely (no node is lost then)
OVERRIDES = (
    "teacher.seed=202",
    "teacher.replicas=2",
    "teacher.batch_size=2",
    "distill.paradigms=[offline]",
    "distill.runs=2",
    COARSE_TIMING,
)
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port")
NODE_PORTS = (
    "node-manager-port",
    "object-manager-port",
    "metrics-export-port",
    "runtime-env-agent-port",
    "dashboard-agent-grpc-port",
    "dashboard-agent-listen-port",
)


@dataclass
class LocalCluster:
    """Ray nodes on this machine by name (`head`, `worker_1`, ...); `env` is a client's (the token)."""

    temp_dir: Path
    address: str  # GCS address, for ray.address=
    dashboard: str  # state API
    env: dict[str, str]
    nodes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start_worker(self, cpus: int = 1) -> str:
        """One more worker node, named `worker_<n>`; returns its node id once Ray lists it alive."""
        name = f"worker_{len(self.nodes)}"
        ports = dict(zip(NODE_PORTS, free_ports(len(NODE_PORTS)), strict=True))
        resources = json.dumps({"worker_node": 1, name: 1})
        args = [f"--address={self.address}", f"--num-cpus={cpus}", f"--resources={resources}"]
        args += [f"--temp-dir={self.temp_dir / name}", *(f"--{k}={v}" for k, v in ports.items())]
        self.nodes[name] = _ray_start(args, self.temp_dir / f"{name}.log", self.env)
        return wait_until(
            lambda: self.node_ids().get(name), f"node {name}", 180, ignore=STARTING, alive=[self.nodes[name]]
        )

    def state(self, resource: str) -> list[dict]:
        """Rows of the state API (`actors`, `nodes`), dead ones included."""
        request = urllib.request.Request(
            f"{self.dashboard}/api/v0/{resource}?limit=10000&detail=1",
            headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["data"]["result"]["result"]

    def node_ids(self) -> dict[str, str]:
        """Name -> node id of the nodes Ray lists alive (a worker is named by its own resource)."""
        ids = {}
        for node in self.state("nodes"):
            if node["state"] != "ALIVE":
                continue
            names = ["head"] if node["is_head_node"] else list(node["resources_total"])
            ids |= {name: node["node_id"] for name in names if name in self.nodes or name == "head"}
        return ids

    def kill_raylet(self, name: str) -> None:
        """SIGKILL the raylet of node `name` (found among the processes of its group): a lost machine."""
        group = self.nodes[name].pid
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry.name)) == group and (entry / "comm").read_text() == "raylet\n":
                        os.kill(int(entry.name), signal.SIGKILL)
                        return
        raise AssertionError(f"no raylet in the process group of {name}")

    def alive_pids(self, class_name: str, node_id: str) -> list[int]:
        """Process ids of the live `class_name` actors on node `node_id`."""
        actors = self.state("actors")
        return [
            a["pid"]
            for a in actors
            if a["class_name"] == class_name and a.get("node_id") == node_id and a["state"] == "ALIVE"
        ]

    def actors_by_node(self, class_name: str) -> dict[str, list[str]]:
        """Node id -> states of the `class_name` actors there (alive and dead; a restarted actor is
        listed once, on the node of its latest incarnation)."""
        placed: dict[str, list[str]] = {}
        for actor in self.state("actors"):
            if actor["class_name"] == class_name and actor.get("node_id"):
                placed.setdefault(actor["node_id"], []).append(actor["state"])
        return placed


def _ray_start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("w") as out:  # the child keeps its own copy of the file descriptor
        return subprocess.Popen(
            [RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--num-gpus=0", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a process group of its own: killpg stops exactly this node
        )


def _stop(node: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):  # gcs_server lingers on TERM
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, sig)
        deadline = time.monotonic() + grace
        # poll() reaps `ray start` once it exits: unreaped, it would keep its group alive as a zombie
        while (node.poll() is None or _group_alive(node.pid)) and time.monotonic() < deadline:
            time.sleep(0.2)
    node.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _processes_of(temp_dir: Path, token: str) -> list[int]:
    """The processes of the cluster: its temp dir on their command line, or its auth token in their
    environment (a Ray worker renames itself `ray::Class.method` and leads a process group of its own)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                named = str(temp_dir).encode() in (entry / "cmdline").read_bytes()
                variables = (entry / "environ").read_bytes().split(b"\0")
                if named or f"RAY_AUTH_TOKEN={token}".encode() in variables:
                    pids.append(int(entry.name))
    return pids


STARTING = (OSError, KeyError, ValueError)  # the dashboard's state API is still starting


@contextlib.contextmanager
def local_cluster(head_cpus: int = 1) -> Iterator[LocalCluster]:
    """A head and one worker node on 127.0.0.1; every node is stopped on exit (its process group), even on
    failure, and no process of the cluster may outlive it."""
    # short: Ray's unix socket paths under the temp dir must stay below 108 characters
    temp_dir = Path(tempfile.mkdtemp(prefix="sr2-", dir="/tmp"))
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    ports = dict(zip(HEAD_PORTS + NODE_PORTS, free_ports(len(HEAD_PORTS + NODE_PORTS)), strict=True))
    dashboard = f"http://127.0.0.1:{ports['dashboard-port']}"
    cluster = LocalCluster(temp_dir, f"127.0.0.1:{ports['port']}", dashboard, env)
    args = [f"--num-cpus={head_cpus}", "--include-dashboard=true", "--dashboard-host=127.0.0.1"]
    args += [f"--temp-dir={temp_dir}", "--disable-usage-stats", *(f"--{k}={v}" for k, v in ports.items())]
    try:
        cluster.nodes["head"] = _ray_start(["--head", *args], temp_dir / "head.log", env)
        wait_until(
            lambda: "head" in cluster.node_ids(),
            "the head",
            180,
            ignore=STARTING,
            alive=[cluster.nodes["head"]],
        )
        cluster.start_worker()
        yield cluster
    finally:
        for node in reversed(cluster.nodes.values()):
            _stop(node)
        # a node's workers lead process groups of their own and exit once they see their raylet gone
        deadline = time.monotonic() + 30.0
        while (leftovers := _processes_of(temp_dir, env["RAY_AUTH_TOKEN"])) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in leftovers:  # a process still there after that (none should be)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftovers, f"Ray processes of the test cluster survived its process groups: {leftovers}"


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with local_cluster() as started:
        yield started


def _alive_on(cluster: LocalCluster, class_name: str, node_id: str) -> bool:
    return "ALIVE" in cluster.actors_by_node(class_name).get(node_id, [])


def test_a_two_node_sweep_survives_losing_its_worker_node_in_two_stages(
    cluster: LocalCluster, tmp_path
) -> None:
    spec = load_spec(SMOKE, [f"output_dir={tmp_path}", *OVERRIDES])
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    command = smoke_command(tmp_path, uri, *OVERRIDES, f"ray.address={cluster.address}")
    head, first = cluster.node_ids()["head"], cluster.node_ids()["worker_1"]
    first_parts = shard_dir(train_shard_keys(spec)[spec.teacher.temperatures[0]]) / PARTS_DIR
    with (tmp_path / "sweep.log").open("w") as log:
        sweep = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=cluster.env)
    frozen: list[int] = []
    try:
        # 1. mid teacher stage: freeze the replica on worker_1 as soon as it is up (so the stage cannot end
        # before the node is lost, however fast it runs), wait until the head's replica has returned
        # batches, lose worker_1; its batches go to the head's replica, and a replacement node joins
        frozen = wait_until(
            lambda: cluster.alive_pids("TeacherActor", first),
            "a replica on worker_1",
            600,
            ignore=STARTING,
            alive=[sweep],
        )
        os.kill(frozen[0], signal.SIGSTOP)
        wait_until(
            lambda: any(first_parts.glob("part-*.parquet")),
            "teacher batches",
            600,
            ignore=STARTING,
            alive=[sweep],
        )
        teachers = cluster.actors_by_node("TeacherActor")
        cluster.kill_raylet("worker_1")  # the frozen process stays, dead to Ray, until the node is stopped
        second = cluster.start_worker()
        # 2. mid distillation (one run per node): lose the replacement while a Ray Train worker runs there
        wait_until(
            lambda: _alive_on(cluster, "RayTrainWorker", second),
            "a run on worker_2",
            600,
            ignore=STARTING,
            alive=[sweep],
        )
        cluster.kill_raylet("worker_2")
        returncode = sweep.wait(timeout=900)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        for pid in frozen[:1]:  # stopped, it never sees its raylet die and would outlive the cluster
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert returncode == 0, (tmp_path / "sweep.log").read_text()[-4000:]

    # placement: a teacher replica on each node at first; the lost one is dead for good (replaced, never
    # restarted in place: whether its replacement was placed before the stage ended depends on timing)
    assert set(teachers) == {head, first}, teachers
    assert cluster.actors_by_node("TeacherActor")[first] == ["DEAD"]
    trainers = cluster.actors_by_node("RayTrainWorker")
    assert set(trainers) == {head, second}, trainers
    assert sum(map(len, trainers.values())) >= 3, trainers  # 2 runs; the one on worker_2 started again
    for helper in ("TrainController", "_QueueActor"):  # what the driver reads for a whole run: its node
        assert set(cluster.actors_by_node(helper)) == {head}, helper
    assert cluster.node_ids() == {"head": head}  # both worker nodes are gone for good

    # exactly once: every shard row, draft, cell and MLflow record
    for key in train_shard_keys(spec).values():
        prompt_ids = read_shard(key).column("prompt_id").to_pylist()
        assert len(prompt_ids) == len(set(prompt_ids)) == spec.data.train_size
    assert sorted(finished_drafts(tmp_path)) == ["offline__tau_kd=0", "offline__tau_kd=1"]
    assert_cells_once(tmp_path, OFFLINE_DRAFTS)
    assert_tracked_once(uri, OFFLINE_DRAFTS)
