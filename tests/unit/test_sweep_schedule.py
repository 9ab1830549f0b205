"""How a sweep shares its distillations out among Train runs, and in which order each run trains them."""

from __future__ import annotations

import pytest

from specray.config import load_spec
from specray.sweep import stages
from specray.sweep.plan import plan_sweep
from specray.sweep.stages import ONLINE_STEP_COST, RUN_START_STEPS, split_runs, train_runs
from tests.conftest import REPO


def _cost(spec, plan) -> float:
    steps = spec.distill.steps_for(plan.paradigm)
    assert plan.train_spec.distill.steps == steps  # the draft's own spec holds its paradigm's steps
    return steps * (ONLINE_STEP_COST if plan.paradigm == "online" else 1.0)


@pytest.mark.parametrize("runs", [1, 2, 3, 5])
def test_every_draft_once_longest_first_and_the_runs_balanced(runs: int) -> None:
    spec = load_spec(REPO / "sweeps" / "tiny.yaml")
    plans = list(plan_sweep(spec).drafts)
    assert plans[0].paradigm == "offline"  # the plan lists offline first; the schedule must not
    lanes = split_runs(plans, runs)
    assert len(lanes) == runs
    assert sorted(p.name for lane in lanes for p in lane) == sorted(p.name for p in plans)
    for lane in lanes:  # online (the long ones) first in every run: the last to end is a short one
        costs = [_cost(spec, p) for p in lane]
        assert costs == sorted(costs, reverse=True)
    loads = [sum(_cost(spec, p) for p in lane) for lane in lanes]
    shortest = min(_cost(spec, p) for p in plans)
    assert max(loads) - min(loads) <= shortest  # LPT: within one (the shortest, last placed) draft
    assert split_runs(list(reversed(plans)), runs) == lanes  # the same runs whatever the order given


def test_more_runs_than_drafts_gives_one_draft_a_run() -> None:
    spec = load_spec(REPO / "sweeps" / "tiny.yaml", ["teacher.temperatures=[0.0, 1.0]"])
    plans = list(plan_sweep(spec).drafts)
    assert [len(lane) for lane in split_runs(plans, 10)] == [1, 1, 1, 1]


@pytest.mark.parametrize(
    ("sweep", "overrides", "fit", "runs"),
    [
        ("tiny.yaml", [], 2, 2),  # 22 drafts of 400-600 steps: both cores
        ("tiny.yaml", [], 16, 16),  # and as many runs as fit on a bigger cluster
        ("smoke.yaml", [], 2, 1),  # four 8-step drafts: one run's start, not two
        ("smoke.yaml", ["ray.address=127.0.0.1:6379"], 2, 1),  # on a cluster too
        ("smoke.yaml", ["distill.runs=2"], 2, 2),  # unless the spec asks for more
        ("smoke.yaml", ["distill.runs=3"], 2, 2),  # never more than fit
        ("tiny.yaml", ["distill.runs=1"], 2, 1),
        # a share of RUN_START_STEPS offline steps per run: two offline drafts of that many give two runs,
        # one step fewer gives one
        ("smoke.yaml", ["distill.paradigms=[offline]", f"distill.steps={RUN_START_STEPS}"], 8, 2),
        ("smoke.yaml", ["distill.paradigms=[offline]", f"distill.steps={RUN_START_STEPS - 1}"], 8, 1),
    ],
)
def test_another_train_run_starts_only_for_work_worth_its_start(
    monkeypatch: pytest.MonkeyPatch, sweep: str, overrides: list[str], fit: int, runs: int
) -> None:
    monkeypatch.setattr(stages, "concurrent_runs", lambda spec: fit)  # what the cluster fits
    spec = load_spec(REPO / "sweeps" / sweep, overrides)
    drafts = list(plan_sweep(spec).drafts)
    assert train_runs(spec, drafts) == runs
    # a function of all the drafts, in any order: a re-run finds the same runs
    assert train_runs(spec, list(reversed(drafts))) == runs
