"""The smoke sweep on a real Ray cluster of two nodes on this machine, losing its worker node twice.

The cluster is `specray.cluster.loopback`'s (the chaos harness runs on the same): `ray start --block`
processes on 127.0.0.1, each the leader of a process group of its own, with free ports, token auth and temp
dirs of their own: the head (1 CPU, the dashboard for the state API) and a worker node (1 CPU, a resource
named after it). They are stopped by killing those groups, never by `ray stop` (it would stop every Ray on
the machine, other tests' included). With one CPU per node, two teacher replicas or two distillation runs
cannot both fit on one node: Ray has to place one of each on the worker node, and the test checks it did.

The sweep loses a worker node in two stages, each killed by SIGKILL to its raylet (as a lost machine):
- mid teacher stage (its replica frozen by SIGSTOP first, so the stage cannot end before; some shard parts
  written; a replacement node joined first, as an autoscaler's would): the batches the lost replica held
  go back on the queue and the head's replica takes them (or a fresh replica on the replacement);
- mid distillation, while a Ray Train worker runs on the replacement node: that run restarts on the head.
The sweep then completes on the head alone, with every shard row, draft and cell exactly once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from specray.cluster.loopback import STARTING, LoopbackCluster, loopback_cluster
from specray.config import load_spec
from specray.data.shards import PARTS_DIR, read_shard, shard_dir
from specray.keys import train_shard_keys
from tests.stores import new_store
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


def kill_raylet(cluster: LoopbackCluster, name: str) -> None:
    """SIGKILL the raylet of node `name` (found among the processes of its group): a lost machine, whose
    node process stays until the cluster stops it."""
    group = cluster.nodes[name].pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry.name)) == group and (entry / "comm").read_text() == "raylet\n":
                    os.kill(int(entry.name), signal.SIGKILL)
                    return
    raise AssertionError(f"no raylet in the process group of {name}")


def alive_pids(cluster: LoopbackCluster, class_name: str, node_id: str) -> list[int]:
    """Process ids of the live `class_name` actors on node `node_id`."""
    return [
        a["pid"]
        for a in cluster.state("actors")
        if a["class_name"] == class_name and a.get("node_id") == node_id and a["state"] == "ALIVE"
    ]


def actors_by_node(cluster: LoopbackCluster, class_name: str) -> dict[str, list[str]]:
    """Node id -> states of the `class_name` actors there (alive and dead; a restarted actor is listed once,
    on the node of its latest incarnation)."""
    placed: dict[str, list[str]] = {}
    for actor in cluster.state("actors"):
        if actor["class_name"] == class_name and actor.get("node_id"):
            placed.setdefault(actor["node_id"], []).append(actor["state"])
    return placed


@pytest.fixture
def cluster() -> Iterator[LoopbackCluster]:
    with loopback_cluster(os.environ) as started:
        yield started


def _alive_on(cluster: LoopbackCluster, class_name: str, node_id: str) -> bool:
    return "ALIVE" in actors_by_node(cluster, class_name).get(node_id, [])


def test_a_two_node_sweep_survives_losing_its_worker_node_in_two_stages(
    cluster: LoopbackCluster, tmp_path
) -> None:
    spec = load_spec(SMOKE, [f"output_dir={tmp_path}", *OVERRIDES])
    uri = new_store(tmp_path)
    command = smoke_command(tmp_path, uri, *OVERRIDES, f"ray.address={cluster.address}")
    head, first = cluster.node_id["head"], cluster.node_id["worker_1"]
    first_parts = shard_dir(train_shard_keys(spec)[spec.teacher.temperatures[0]]) / PARTS_DIR
    with (tmp_path / "sweep.log").open("w") as log:
        sweep = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=cluster.env)
    frozen: list[int] = []
    try:
        # 1. mid teacher stage: freeze the replica on worker_1 as soon as it is up (so the stage cannot end
        # before the node is lost, however fast it runs), wait until the head's replica has returned
        # batches, lose worker_1; its batches go to the head's replica, and a replacement node joins
        frozen = wait_until(
            lambda: alive_pids(cluster, "TeacherActor", first),
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
        # the replacement joins while the frozen replica holds the stage open, so that it is part of the
        # cluster when the distillation shares its drafts out among the CPUs there are (a node that joined
        # only after the teacher stage ended would leave one run for the head alone: a race with how fast
        # the head's replica clears the lost batches)
        second = cluster.node_id[cluster.start_worker()]
        teachers = actors_by_node(cluster, "TeacherActor")
        kill_raylet(cluster, "worker_1")  # the frozen process stays, dead to Ray, until the node is stopped
        # 2. mid distillation (one run per node): lose the replacement while a Ray Train worker runs there
        wait_until(
            lambda: _alive_on(cluster, "RayTrainWorker", second),
            "a run on worker_2",
            600,
            ignore=STARTING,
            alive=[sweep],
        )
        kill_raylet(cluster, "worker_2")
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
    assert actors_by_node(cluster, "TeacherActor")[first] == ["DEAD"]
    trainers = actors_by_node(cluster, "RayTrainWorker")
    assert set(trainers) == {head, second}, trainers
    assert sum(map(len, trainers.values())) >= 3, trainers  # 2 runs; the one on worker_2 started again
    for helper in ("TrainController", "_QueueActor"):  # what the driver reads for a whole run: its node
        assert set(actors_by_node(cluster, helper)) == {head}, helper
    assert cluster.node_ids() == {"head": head}  # both worker nodes are gone for good

    # exactly once: every shard row, draft, cell and MLflow record
    for key in train_shard_keys(spec).values():
        prompt_ids = read_shard(key).column("prompt_id").to_pylist()
        assert len(prompt_ids) == len(set(prompt_ids)) == spec.data.train_size
    assert sorted(finished_drafts(tmp_path)) == ["offline__tau_kd=0", "offline__tau_kd=1"]
    assert_cells_once(tmp_path, OFFLINE_DRAFTS)
    assert_tracked_once(uri, OFFLINE_DRAFTS)
