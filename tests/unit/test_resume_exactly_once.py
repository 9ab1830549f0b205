"""Regressions the chaos run (benchmarks/chaos/run.py) found: a sweep resumed after a fault must end as the
fault-free one does, each result once."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
import typer

from specray.cli.common import resumable
from specray.files import write_json
from specray.specdec.records import CellRecord
from tests.stores import new_store


def test_a_cell_record_read_back_gives_the_same_report_row_as_when_it_was_evaluated(tmp_path: Path) -> None:
    """A resumed run reads its cells back from disk, where their dict figures have sorted keys; the report's
    cells.csv printed those dicts in another order than the fault-free run's."""
    metrics = {
        "cost_terms": {"target_step": 1.0, "per_drafted_token": 0.5, "prefill_target": 0.0},
        "speedup_model_by_batch": {"4": 2.0, "1": 1.4},
        "acceptance_rate": 0.9,
    }
    record = CellRecord("d", "K", "in_domain", 1.0, "analytic", 3, "key", 0.5, 0.1, metrics)
    write_json(tmp_path / "key.json", record.to_json(), indent=None)  # as the stage runner saves it
    back = CellRecord.from_json(json.loads((tmp_path / "key.json").read_text()))
    assert str(back.flat()) == str(record.flat())


def test_a_lost_ray_cluster_ends_the_run_with_one_line_and_the_resume_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """When the whole Ray died (`ray stop --force`, a lost head), the driver printed a 70-line traceback
    ending in Ray's ActorUnavailableError (read from the Train run's curve queue), not what specray says
    of every other environment failure: what failed, where the work is, the command that resumes."""
    from ray.exceptions import ActorUnavailableError

    caplog.set_level(logging.DEBUG, logger="specray")
    lost = ActorUnavailableError("RpcError: recvmsg:Connection reset by peer", b"\0" * 16)
    with pytest.raises(typer.Exit) as ended, resumable(tmp_path):
        raise RuntimeError("a Train run failed") from lost
    assert ended.value.exit_code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "error: Ray lost a process this run needs (ActorUnavailableError): "
        "a node or the whole cluster is gone"
    )
    assert lines[1].startswith(f"Finished work is kept under {tmp_path}") and "resume with:" in lines[1]
    assert len(lines) == 3 and "Connection reset by peer" in caplog.text  # the raw error: --verbose


def test_an_error_of_specrays_own_code_in_a_ray_worker_keeps_its_traceback(tmp_path: Path) -> None:
    from ray.exceptions import RayTaskError

    bug = RayTaskError("generate", "Traceback ...", ZeroDivisionError("division by zero"))
    with pytest.raises(RayTaskError), resumable(tmp_path):
        raise bug


def test_the_sweeps_own_figures_reach_its_parent_run_once_however_often_the_end_is_reached(
    tmp_path: Path,
) -> None:
    """A driver killed after logging the parent run's stage times and c, before marking the run finished
    (while it closes the child runs), is resumed: the resumed run reaches the end again and logged them a
    second time (two history entries at step 0)."""
    from mlflow.tracking import MlflowClient

    from specray.sweep.tracked import log_missing
    from specray.tracking.client import open_tracker

    uri = new_store(tmp_path)
    tracker = open_tracker(uri, "smoke")
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    log_missing(tracker, parent, {"stage_seconds/distill": 12.0, "cost_ratio": 0.5})
    log_missing(tracker, parent, {"stage_seconds/distill": 3.0, "cost_ratio": 0.5, "stage_seconds/eval": 1.0})
    client = MlflowClient(uri)
    history = {key: client.get_metric_history(parent, key) for key in client.get_run(parent).data.metrics}
    assert {key: [m.value for m in points] for key, points in history.items()} == {
        "stage_seconds/distill": [12.0],
        "cost_ratio": [0.5],
        "stage_seconds/eval": [1.0],
    }


def test_a_run_whose_cluster_is_gone_stops_at_once_naming_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver started just after its Ray cluster died (re-run by a user, or by an operator who restarts
    the head) sat in `ray.init`, which retries a dead address for about a quarter of an hour; now it waits
    GCS_WAIT_S for the head to come back, then ends with one line and the resume command."""
    import socket

    import ray

    from specray.cluster import runtime
    from specray.config import RaySpec

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens there once it is closed
    monkeypatch.setattr(runtime, "GCS_WAIT_S", 0.5, raising=False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init called on a dead address"))
    with (
        pytest.raises(typer.Exit) as ended,
        resumable(tmp_path),
        runtime.ray_session(RaySpec(address=address)),
    ):
        pass
    assert ended.value.exit_code == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"error: no Ray cluster answers at {address} (ray.address): Connection refused"
    with socket.socket() as head:  # a head that listens is joined as before
        head.bind(("127.0.0.1", 0))
        head.listen()
        runtime.check_reachable(f"127.0.0.1:{head.getsockname()[1]}", wait_s=0.5)


def test_a_train_runs_work_folder_left_by_a_driver_that_died_goes_once_every_draft_is_published(
    tmp_path: Path,
) -> None:
    """A driver killed mid-distillation leaves its Train runs' work folders; the re-run resumes them only
    if it shares the drafts out among as many runs, and a re-run on a smaller cluster (a node lost, its
    replacement not joined yet) does not: the old folders, checkpoints and all, stayed for good."""
    from specray.draft import Draft
    from specray.sweep.stages import remove_stale_work

    drafts = [Draft(f"offline/tau_kd={t}", "offline", {t: 1.0}, tmp_path / f"d{t}", f"k{t}") for t in (0, 1)]

    def work(name: str, *keys: str) -> Path:
        folder = tmp_path / name
        for i, key in enumerate(keys):
            checkpoint = folder / "ray_train" / f"checkpoint_{i}"
            checkpoint.mkdir(parents=True)
            (checkpoint / "fingerprint.txt").write_text(key)
        folder.mkdir(exist_ok=True)
        (folder / "fingerprint.txt").write_text("run key")  # the run's own tag, not a draft's
        return folder

    stale = [work(".run-aaaa.work", "k0"), work(".run-bbbb.work"), work(".d1.work", "k1")]
    other = work(".run-cccc.work", "k0", "another-draft")  # another command's draft may resume from it
    remove_stale_work(drafts)
    assert [folder.exists() for folder in stale] == [False, False, False] and other.exists()


def test_a_temporary_left_by_a_writer_killed_before_its_rename_goes_with_the_next_write(
    tmp_path: Path,
) -> None:
    """An eval actor killed while it saved the target's continuations (after writing the temporary, before
    the rename) left `.KEY.json.<hex>.tmp` in the cache for good; the same holds for a cell record, the
    step costs, a spec: the next write of the same file now removes it."""
    from specray.files import write_json

    target = tmp_path / "7915af6cc1ab8bc0fba1.json"
    killed = tmp_path / ".7915af6cc1ab8bc0fba1.json.d15b10a4.tmp"
    killed.write_text('{"tau": 1.0, "respo')
    others = [tmp_path / ".7915af6cc1ab8bc0fba1.json.bak.d15b10a4.tmp", tmp_path / ".other.json.d15b10a4.tmp"]
    for other in others:
        other.write_text("another file's")
    write_json(target, {"tau": 1.0})
    assert json.loads(target.read_text()) == {"tau": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, *(o.name for o in others)])


class _CtrlCInDestructor:
    """A library's clean-up that runs when the garbage collector frees it: a Ctrl-C that arrives while it
    runs raises KeyboardInterrupt inside it, where Python prints "Exception ignored" and goes on."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # os.kill runs the handler before it returns: in here


def test_a_ctrl_c_that_lands_in_a_destructor_still_stops_the_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Ctrl-C integration test's driver once ran to its end (exit 0): the SIGINT had landed in
    SQLAlchemy's weakref callback, which swallowed the KeyboardInterrupt."""
    # Python's own handler, as a CLI process in a terminal starts with: a test run started in the
    # background by a shell without job control inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.monotonic()
        with pytest.raises(typer.Exit) as ended, resumable(tmp_path):
            _CtrlCInDestructor()  # freed at once: the interrupt is raised, and lost, in its __del__
            while time.monotonic() - started < 20:  # the job goes on, as a sweep would
                time.sleep(0.05)
        assert ended.value.exit_code == 130 and "\ninterrupted\n" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, previous)
