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
