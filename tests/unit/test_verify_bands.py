"""`export --verify` picks its bands: every routed band with its exported draft, and every declined band's
best candidate where the sweep's draft folder is at hand (a plan that declines every band is
still checked)."""

from __future__ import annotations

from pathlib import Path

from specray.serving.verify import bands_to_check


def candidate(name: str, speedup: float) -> dict:
    return {
        "draft_name": name,
        "gamma": 2,
        "expected": {"draft_acceptance_hf": 0.3},
        "speedup": {"tau_dec": 1.0, "value": speedup, "basis": "modelled"},
    }


PLAN = {
    "bands": [
        {"alias": "tau-0", "route": "speculative", "draft": "drafts/online__tau_kd=0", "gamma": 3,
         "expected": {}, "speedup": {"tau_dec": 0.0, "value": 1.3, "basis": "measured"},
         "best_candidate": candidate("online/tau_kd=0", 1.3)},
        {"alias": "tau-1", "route": "none", "draft": None, "gamma": 0,
         "best_candidate": candidate("offline/tau_kd=1/r1", 0.93)},
        {"alias": "tau-2", "route": "none", "draft": None, "gamma": 0,
         "best_candidate": candidate("offline/tau_kd=2", 0.7)},
        {"alias": "tau-3", "route": "none", "draft": None, "gamma": 0},
    ]
}  # fmt: skip


def test_routed_bands_use_the_exported_draft_and_declined_ones_their_best_candidate(tmp_path: Path) -> None:
    folders = {"offline/tau_kd=1/r1": tmp_path / "drafts" / "offline__tau_kd=1__r1"}
    checked = bands_to_check(PLAN, tmp_path / "export", folders)
    assert [(b["alias"], b["route"], b["draft"]) for b in checked] == [
        ("tau-0", "speculative", "drafts/online__tau_kd=0"),
        ("tau-1", "declined", "offline/tau_kd=1/r1"),
    ]  # tau-2's candidate has no folder here, tau-3 has no candidate at all
    assert checked[0]["folder"] == str(tmp_path / "export" / "drafts" / "online__tau_kd=0")
    declined = checked[1]
    assert declined["folder"] == str(folders["offline/tau_kd=1/r1"])
    # what check_band reads: the candidate's γ, expectations and modelled speedup, not the band's γ = 0
    assert (declined["gamma"], declined["speedup"]["value"], declined["speedup"]["tau_dec"]) == (2, 0.93, 1.0)


def test_without_the_sweeps_drafts_only_routed_bands_are_checked(tmp_path: Path) -> None:
    assert [b["alias"] for b in bands_to_check(PLAN, tmp_path, {})] == ["tau-0"]
    assert bands_to_check({"bands": PLAN["bands"][1:]}, tmp_path, {}) == []
