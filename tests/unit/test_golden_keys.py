"""The cache keys of the shipped sweeps, pinned: every shard, draft, step-cost and cell key that
`sweeps/tiny.yaml` and `sweeps/smoke.yaml` plan is compared with a golden file, so a restructuring that
changes no result provably keeps every cached result valid.

A key may change only where a bug is fixed (or a record format is bumped on purpose). Then re-pin with
`SPECRAY_REPIN=1 pytest tests/unit/test_golden_keys.py` and say in the change which keys moved and why.
Analytic cells are keyed by the step costs' values; the golden cells use the papers' fixed model at c = 0.2
(`StepCosts.fixed`), so no timing enters the pin.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specray.config import load_spec
from specray.specdec.records import StepCosts
from tests.conftest import REPO

GOLDEN = REPO / "tests" / "fixtures" / "golden_keys"
SWEEPS = ["tiny", "smoke"]


def planned_keys(sweep: str, output_dir: Path) -> dict[str, dict[str, str]]:
    """Every key the sweep's plan computes, by a readable name of what it keys."""
    from specray.sweep.plan import plan_sweep

    spec = load_spec(REPO / "sweeps" / f"{sweep}.yaml", [f"output_dir={output_dir}"])
    plan = plan_sweep(spec)
    costs = StepCosts.fixed(0.2, spec.eval.batch_sizes, spec.eval.gamma)
    shards = {
        f"seed={sample.spec.teacher.seed}/tau_kd={tau:g}": key.digest
        for sample in plan.shards
        for tau, key in sample.keys.items()
    }
    return {
        "shards": shards,
        "drafts": {draft.name: draft.key for draft in plan.evaluated},
        "step_costs": {"measured": plan.step_costs_key},
        "cells": {job.label: job.key for job in plan.cell_jobs(costs)},
    }


@pytest.mark.parametrize("sweep", SWEEPS)
def test_planned_keys_match_the_golden_file(sweep: str, tmp_path: Path) -> None:
    found = planned_keys(sweep, tmp_path)
    path = GOLDEN / f"{sweep}.json"
    if os.environ.get("SPECRAY_REPIN"):
        path.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    golden = json.loads(path.read_text())
    assert sorted(found) == sorted(golden)
    for kind in golden:
        moved = sorted(
            k for k in golden[kind].keys() & found[kind].keys() if golden[kind][k] != found[kind][k]
        )
        missing = sorted(golden[kind].keys() - found[kind].keys())
        added = sorted(found[kind].keys() - golden[kind].keys())
        assert not (moved or missing or added), (
            f"{sweep} {kind} keys: {len(moved)} moved (e.g. {moved[:3]}), {len(missing)} no longer planned "
            f"(e.g. {missing[:3]}), {len(added)} new (e.g. {added[:3]})"
        )
