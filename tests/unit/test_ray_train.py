"""Ray Train adapter pieces that need no running Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.train import ControllerError, WorkerGroupError
from ray.util.queue import Empty

from specray.distill.ray_2_60 import SCRATCH_DIR, lost_in_controller, scratch_folder
from specray.distill.ray_2_60 import registered as _registered
from specray.distill.ray_train import MAX_FAILURES, _fit_streaming


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


LOST = ActorUnavailableError("The actor is temporarily unavailable: RpcError: Socket closed", b"\x01" * 16)


def test_only_a_controller_that_lost_a_worker_counts_as_a_lost_worker() -> None:
    """What ended a chaos run: Train's controller lost the worker while launching the train function, and
    wrapped the actor error in a ControllerError (never retried by Train)."""
    assert lost_in_controller(ControllerError(LOST))
    assert lost_in_controller(ControllerError(ActorDiedError()))
    assert not lost_in_controller(ControllerError(ValueError("a bad callback")))  # a bug: not retried
    assert not lost_in_controller(WorkerGroupError("the train function raised", {0: ValueError("x")}))
    assert not lost_in_controller(LOST)  # raised outside Train's controller: not Train's to restart


class _NoItems:
    """The curve queue with nothing on it (what `_drain` reads)."""

    def get(self, timeout: float) -> dict:
        raise Empty

    def get_nowait(self) -> dict:
        raise Empty


@pytest.mark.parametrize("losses", [1, MAX_FAILURES])
def test_a_run_whose_controller_lost_a_worker_starts_again(losses: int) -> None:
    """A stand-in for TorchTrainer: Ray cannot lose a worker at that instant on demand (the chaos test,
    tests/integration/test_chaos.py, meets it at random); a new trainer resumes the run from storage."""
    started: list[int] = []

    class Trainer:
        def fit(self) -> str:
            started.append(len(started))
            if len(started) <= losses:
                raise ControllerError(LOST)
            return "result"

    assert _fit_streaming(Trainer, _NoItems(), None, None) == "result"  # type: ignore[arg-type]
    assert len(started) == losses + 1


def test_a_run_that_keeps_losing_workers_or_fails_otherwise_stops() -> None:
    started: list[int] = []

    def trainer(error: BaseException):  # noqa: ANN202
        class Trainer:
            def fit(self) -> str:
                started.append(1)
                raise error

        return Trainer

    with pytest.raises(ControllerError):
        _fit_streaming(trainer(ControllerError(LOST)), _NoItems(), None, None)  # type: ignore[arg-type]
    assert len(started) == MAX_FAILURES + 1
    started.clear()
    with pytest.raises(ControllerError):
        _fit_streaming(trainer(ControllerError(ValueError("bug"))), _NoItems(), None, None)  # type: ignore[arg-type]
    assert len(started) == 1
