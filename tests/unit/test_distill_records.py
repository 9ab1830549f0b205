"""The run's state in a checkpoint and the finished-draft marker round-trip through their JSON; a marker of
another format is refused, never read with fields guessed."""

from __future__ import annotations

import json

import pytest

from specray.distill.checkpoints import FinishedDraft, RunState
from specray.distill.curves import CurvePoint
from specray.keys import FORMAT_VERSION, OlderFormat

MARKER = {  # a finished.json as the loop writes it
    "curve_inputs": {"eval.temperatures": [0.0, 1.0]},
    "draft": "offline/tau_kd=1",
    "fingerprint": "f" * 64,
    "format": FORMAT_VERSION,
    "key_inputs": {"distill.steps": 4},
    "mixture": {"1": 1.0},
    "paradigm": "offline",
    "resumed_from": [2],
    "seconds": 12.3,
    "steps": 4,
    "weights_sha256": {"model.safetensors": "0" * 64},
}


def test_a_marker_reads_and_writes_the_same_json() -> None:
    marker = FinishedDraft.from_json(json.loads(json.dumps(MARKER)))
    assert marker.fingerprint == "f" * 64 and marker.resumed_from == [2] and marker.mixture == {"1": 1.0}
    assert json.dumps(marker.to_json(), sort_keys=True) == json.dumps(MARKER, sort_keys=True)
    assert FinishedDraft().fingerprint == ""  # no marker: matches no draft key


@pytest.mark.parametrize(
    "older",
    [
        {k: v for k, v in MARKER.items() if k != "format"},  # before the format version was written
        MARKER | {"format": FORMAT_VERSION - 1},
        {k: v for k, v in MARKER.items() if k != "weights_sha256"},  # a field missing: never defaulted
    ],
)
def test_a_marker_of_another_format_is_refused_not_read_with_fields_guessed(older: dict) -> None:
    with pytest.raises(OlderFormat):
        FinishedDraft.from_json(older)


def test_the_run_state_round_trips_through_plain_data() -> None:
    state = RunState("k" * 64, 4, [CurvePoint(0, acceptance={1.0: 0.5}), CurvePoint(4, loss=1.0)], [2])
    saved = state.to_json()
    assert list(saved) == ["step", "curves", "resumed_from", "fingerprint"]  # the trainer state's keys
    assert saved["curves"] == [{"step": 0, "acceptance_rate/tau_dec=1": 0.5}, {"step": 4, "loss": 1.0}]
    assert RunState.from_json(saved | {"optimizer": {}, "rng": None}) == state
