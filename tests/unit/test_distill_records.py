"""The run's state in a checkpoint and the finished-draft marker keep the JSON they were always written as."""

from __future__ import annotations

import json
import math

from specray.distill.checkpoints import FinishedDraft, RunState
from specray.distill.curves import CurvePoint

OLD_MARKER = {  # a finished.json as the loop wrote it before the marker was typed
    "curve_inputs": {"eval.temperatures": [0.0, 1.0]},
    "draft": "offline/tau_kd=1",
    "fingerprint": "f" * 64,
    "key_inputs": {"distill.steps": 4},
    "mixture": {"1": 1.0},
    "paradigm": "offline",
    "resumed_from": [2],
    "seconds": 12.3,
    "steps": 4,
}


def test_a_marker_reads_and_writes_the_same_json() -> None:
    marker = FinishedDraft.from_json(json.loads(json.dumps(OLD_MARKER)))
    assert marker.fingerprint == "f" * 64 and marker.resumed_from == [2] and marker.mixture == {"1": 1.0}
    assert json.dumps(marker.to_json(), sort_keys=True) == json.dumps(OLD_MARKER, sort_keys=True)


def test_a_marker_written_before_a_field_existed_reads_with_it_empty() -> None:
    older = {k: v for k, v in OLD_MARKER.items() if k not in ("curve_inputs", "seconds")}
    marker = FinishedDraft.from_json(older)
    assert (
        marker.curve_inputs == {}
        and math.isnan(marker.seconds)
        and marker.key_inputs == OLD_MARKER["key_inputs"]
    )
    assert FinishedDraft().fingerprint == ""  # no marker: matches no draft key


def test_the_run_state_round_trips_through_plain_data() -> None:
    state = RunState("k" * 64, 4, [CurvePoint(0, acceptance={1.0: 0.5}), CurvePoint(4, loss=1.0)], [2])
    saved = state.to_json()
    assert list(saved) == ["step", "curves", "resumed_from", "fingerprint"]  # the trainer state's keys
    assert saved["curves"] == [{"step": 0, "acceptance_rate/tau_dec=1": 0.5}, {"step": 4, "loss": 1.0}]
    assert RunState.from_json(saved | {"optimizer": {}, "rng": None}) == state
