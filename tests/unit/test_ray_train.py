"""Ray Train adapter pieces that need no running Ray."""

from __future__ import annotations

import json
from pathlib import Path

from specray.distill.ray_train import _registered


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
