"""Ray Train adapter pieces that need no running Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError
from ray.train import ControllerError, WorkerGroupError
from ray.util.queue import Empty

from specray.distill import ray_train
from specray.distill.curves import CurvePoint
from specray.distill.ray_2_60 import SCRATCH_DIR, lost_in_controller, scratch_folder, torch_trainer
from specray.distill.ray_2_60 import registered as _registered
from specray.distill.ray_train import MAX_FAILURES, _fit, _follow
from specray.distill.train_worker import TrainJob, TrainRun
from specray.draft import Draft
from specray.faults import Faults


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


def test_a_run_without_datasets_starts_no_ray_data_actor() -> None:
    """Train's callbacks less the Ray Data one (its DatasetManager actor) when no datasets are given; all of
    them, in Train's order, when some are."""
    from ray.train.torch import TorchTrainer

    def names(trainer: TorchTrainer) -> list[str]:
        return [type(c).__name__ for c in trainer._create_default_callbacks()]  # type: ignore[attr-defined]

    datasets = {"train": lambda: None}  # a dataset factory, never called here
    full = names(TorchTrainer(lambda: None))
    assert "DatasetsCallback" in full
    assert names(torch_trainer(lambda: None)) == [n for n in full if n != "DatasetsCallback"]
    assert names(torch_trainer(lambda: None, datasets=datasets)) == names(
        TorchTrainer(lambda: None, datasets=datasets)
    )


def test_a_run_on_a_local_ray_sends_no_resource_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a Ray that specray started here, the controller gets Train's fixed policy less its requests to the
    autoscaling coordinator (the same worker count and resources); on any other Ray, Train's policy."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
    from ray.train.v2._internal.execution.scaling_policy.factory import create_scaling_policy

    given: list = []
    monkeypatch.setattr(TorchTrainer, "_initialize_and_run_controller", lambda self, **kw: given.append(kw))
    config = ScalingConfig(num_workers=2)
    for local_ray in (True, False):
        trainer = torch_trainer(lambda: None, local_ray=local_ray, scaling_config=config)
        trainer._initialize_and_run_controller(scaling_policy=create_scaling_policy(config))
    local, other = (kw["scaling_policy"] for kw in given)
    assert type(other) is FixedScalingPolicy
    assert isinstance(local, FixedScalingPolicy) and type(local) is not FixedScalingPolicy
    assert local.scaling_config is config
    local.after_controller_start(None)  # Train's would start the coordinator's client and send a request
    local._maybe_send_resource_request()  # Train's asserts that it has the client
    assert local._coordinator_client is None


def test_only_a_controller_that_lost_a_worker_counts_as_a_lost_worker() -> None:
    """What ended a chaos run: Train's controller lost the worker while launching the train function, and
    wrapped the actor error in a ControllerError (never retried by Train)."""
    assert lost_in_controller(ControllerError(LOST))
    assert lost_in_controller(ControllerError(ActorDiedError()))
    assert not lost_in_controller(ControllerError(ValueError("a bad callback")))  # a bug: not retried
    assert not lost_in_controller(WorkerGroupError("the train function raised", {0: ValueError("x")}))
    assert not lost_in_controller(LOST)  # raised outside Train's controller: not Train's to restart


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

    assert _fit(Trainer) == "result"  # type: ignore[arg-type]
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
        _fit(trainer(ControllerError(LOST)))
    assert len(started) == MAX_FAILURES + 1
    started.clear()
    with pytest.raises(ControllerError):
        _fit(trainer(ControllerError(ValueError("bug"))))
    assert len(started) == 1


class _Items:
    """The one queue of curve points and publications (what `_drain` reads), filled as each run "runs"."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def get(self, timeout: float) -> dict:
        return self.get_nowait()

    def get_nowait(self) -> dict:
        if not self.items:
            raise Empty
        return self.items.pop(0)


def _point(draft: str, step: int, folder: str = "") -> dict:
    return {"draft": draft, "folder": folder or draft, "curve": CurvePoint(step, loss=1.0).to_json()}


def _publication(draft: str, folder: str = "") -> dict:
    return {"draft": draft, "folder": folder or draft, "published": True}


def _run(*drafts: str) -> TrainRun:
    """A run of drafts given as `name` or `name:folder` (the folder is the name unless given)."""
    jobs = []
    for draft in drafts:
        name, _, folder = draft.partition(":")
        jobs.append(TrainJob(Draft(name, "offline", {}, Path(folder or name), key=name), None))  # type: ignore[arg-type]
    return TrainRun(jobs, "work", Faults())


def _published(monkeypatch: pytest.MonkeyPatch, *folders: str) -> None:
    monkeypatch.setattr(ray_train, "is_finished", lambda folder, key: Path(folder).name in folders)


def test_the_caller_gets_each_point_and_publication_once_from_the_one_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs side by side report to one queue; a restarted worker group's points come again (passed on
    once), a publication lost with a restarted worker is passed on when its run ends, and two drafts of one
    name (one recipe into two folders, `t1` and `t2`) are each passed on."""
    queue = _Items()
    first, second = Future(), Future()
    _published(monkeypatch, "a", "b", "c", "t1", "t2")
    fits = {first: _run("a", "b", "t:t1"), second: _run("c", "t:t2")}
    queue.items = [_point("a", 0), _point("c", 0), _point("a", 1), _point("a", 0), _point("a", 1)]
    queue.items += [_publication("a"), _point("c", 1), _publication("c"), _publication("c")]
    queue.items += [_point("t", 0, "t1"), _point("t", 0, "t2"), _publication("t", "t2")]
    first.set_result(None)  # "b" and "t" (in t1) were published, their messages lost
    second.set_result(None)
    reported: list[tuple[str, int]] = []
    published: list[str] = []
    _follow(queue, fits, lambda d, c: reported.append((d, c.step)), published.append)  # type: ignore[arg-type]
    assert reported == [("a", 0), ("c", 0), ("a", 1), ("c", 1), ("t", 0), ("t", 0)]
    assert published == ["a", "c", "t", "b", "t"]


def test_a_failed_run_or_callback_is_raised_once_every_run_has_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run lives on the cluster: the driver follows the others to their end, then raises the first failure
    (a run's, a run that ended without publishing its draft, or the `published` callback's)."""
    queue = _Items()
    failed, unpublished, fine = Future(), Future(), Future()
    failed.set_exception(ValueError("bad data"))
    unpublished.set_result(None)
    fine.set_result(None)
    _published(monkeypatch, "c")
    fits = {failed: _run("a"), unpublished: _run("b"), fine: _run("c")}
    queue.items = [_publication("c")]
    published: list[str] = []
    with pytest.raises(ValueError, match="bad data"):
        _follow(queue, fits, None, published.append)  # type: ignore[arg-type]
    assert published == ["c"]
    with pytest.raises(RuntimeError, match="b: the run ended without publishing it"):
        _follow(_Items(), {unpublished: fits[unpublished]}, None, None)  # type: ignore[arg-type]

    def failing(name: str) -> None:
        raise OSError("MLflow is down")

    queue.items = [_publication("c")]
    with pytest.raises(OSError, match="MLflow is down"):
        _follow(queue, {fine: fits[fine]}, None, failing)  # type: ignore[arg-type]
