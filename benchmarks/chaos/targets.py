"""What a fault strikes on the chaos run's loopback cluster (`specray.cluster.loopback`): its nodes by
process group, and its actors by process title.

Targets are found from the outside, by process: a Ray actor's process takes the title `ray::<Class>` (or
`ray::<Class>.<method>` while it runs a call), which `/proc/<pid>/cmdline` shows; its node is the process
group it belongs to. Nothing in specray helps: no hook, no marker, no special environment.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from specray.cluster.loopback import LoopbackCluster


def groups(cluster: LoopbackCluster) -> dict[int, str]:
    """Process group -> node name, for the nodes started and not killed."""
    return {node.pid: name for name, node in cluster.nodes.items() if node.poll() is None}


def actors(cluster: LoopbackCluster, class_name: str) -> list[tuple[int, str]]:
    """(pid, node) of the live processes of this cluster titled `ray::<class_name>`, by pid. A Ray worker
    process leads a session of its own; its node is that of its parent, the node's raylet."""
    nodes, processes = groups(cluster), _processes()
    found = []
    for pid, (title, parent, _group) in processes.items():
        if title.split(".")[0].strip() != f"ray::{class_name}":
            continue
        for _ in range(4):  # up the parents to a process of one of the nodes' groups
            if parent not in processes:
                break
            if processes[parent][2] in nodes:
                found.append((pid, nodes[processes[parent][2]]))
                break
            parent = processes[parent][1]
    return sorted(found)


def live_worker(cluster: LoopbackCluster) -> str | None:
    """The name of the live worker node (the latest started)."""
    live = [name for name in groups(cluster).values() if name != "head"]
    return live[-1] if live else None


def kill_all(cluster: LoopbackCluster) -> None:
    """SIGKILL every process of every node of the cluster: `ray stop --force`, for this Ray only."""
    for name in list(cluster.nodes)[::-1]:
        cluster.kill_node(name)


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
