"""The order in which a sweep starts its distillations."""

from __future__ import annotations

from specray.config import load_spec
from specray.sweep.plan import plan_drafts
from specray.sweep.run import longest_first
from tests.conftest import REPO


def test_online_drafts_start_first_and_each_paradigm_keeps_the_plans_order() -> None:
    spec = load_spec(REPO / "sweeps" / "tiny.yaml")
    plans = plan_drafts(spec)
    assert plans[0].paradigm == "offline"  # the plan lists offline first; the schedule must not
    ordered = longest_first(spec, plans)
    assert sorted(ordered, key=plans.index) == plans  # the same drafts, each once
    paradigms = [plan.paradigm for plan in ordered]
    assert paradigms == ["online"] * 11 + ["offline"] * 11
    for paradigm in ("online", "offline"):
        assert [p for p in ordered if p.paradigm == paradigm] == [p for p in plans if p.paradigm == paradigm]


def test_a_one_paradigm_sweep_keeps_the_plans_order() -> None:
    spec = load_spec(REPO / "sweeps" / "tiny.yaml", ["distill.paradigms=[offline]"])
    plans = plan_drafts(spec)
    assert longest_first(spec, plans) == plans  # one paradigm, one step count: the plan's order
