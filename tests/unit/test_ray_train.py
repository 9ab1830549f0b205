"""Ray Train adapter pieces that need no running Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from specray.distill.ray_train import SCRATCH_DIR, _registered, scratch_folder


def test_a_snapshot_read_mid_write_is_not_yet_registered(tmp_path: Path) -> None:
    """Ray rewrites checkpoint_manager_snapshot.json in place: a read may see it missing, empty or cut short
    (JSONDecodeError before the fix); each is "not yet", never an error."""
    snapshot = tmp_path / "checkpoint_manager_snapshot.json"
    assert not _registered(snapshot)  # missing
    complete = json.dumps({"latest_checkpoint_result": {"checkpoint": "/x/checkpoint_000002"}})
    for partial in ("", complete[: len(complete) // 2], '{"latest_checkpoint_result": null}'):
        snapshot.write_text(partial)
        assert not _registered(snapshot), partial
    snapshot.write_text(complete)
    assert _registered(snapshot)


def test_a_checkpoint_counts_as_registered_only_with_the_metrics_it_was_reported_with(tmp_path: Path) -> None:
    """Several drafts share a run: the registered latest checkpoint may be an earlier draft's (or an
    earlier step's), which must not count as this draft's step."""
    snapshot = tmp_path / "checkpoint_manager_snapshot.json"
    latest = {"checkpoint_dir_name": "checkpoint_3", "metrics": {"step": 2, "draft": "aaa"}}
    snapshot.write_text(json.dumps({"latest_checkpoint_result": latest}))
    assert _registered(snapshot, {"step": 2, "draft": "aaa"})
    assert not _registered(snapshot, {"step": 2, "draft": "bbb"})
    assert not _registered(snapshot, {"step": 4, "draft": "aaa"})


def test_a_worker_removes_the_scratch_checkpoints_of_dead_workers_and_keeps_live_ones(tmp_path: Path) -> None:
    """A worker killed mid-run leaves its checkpoint in the system temp: the next worker on the node removes
    the folders of processes that are gone, and no other."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead_pid = int(gone.stdout)  # a process that has ended
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        root = tmp_path / SCRATCH_DIR
        for pid in (dead_pid, live.pid):
            checkpoint = root / str(pid) / ".checkpoint-abc"
            checkpoint.mkdir(parents=True)
            (checkpoint / "model.safetensors").write_bytes(b"weights")
        (root / "notes").mkdir()  # not a worker's folder: left alone
        own = scratch_folder(tmp_path)
        assert own == root / str(os.getpid()) and own.is_dir()
        assert sorted(p.name for p in root.iterdir()) == sorted(["notes", str(live.pid), str(os.getpid())])
        assert (root / str(live.pid) / ".checkpoint-abc" / "model.safetensors").exists()
        assert scratch_folder(tmp_path) == own  # a second draft of the same worker: the same folder
    finally:
        live.kill()
        live.wait()
