"""A sweep plans once: `specray run` builds the splits once and computes every result key in the plan
(`sweep/plan.py`, and `draft.plan_draft` that it calls), never again in a stage, a Train run or the report.

The sweep is the session's shared smoke sweep (tests/integration/conftest.py): it runs from an empty output
folder and cache (the zoo built, the teacher's shards generated, every draft trained and every cell
evaluated) through `recorded_run.py`, the CLI with counting wrappers that record who calls the splits and
the key recipes in its driver (its Ray workers are separate processes, and take what the driver prepared).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.integration.conftest import FinishedSweep

pytestmark = pytest.mark.integration

# where each key recipe may be called from: the plan, and the recipes' own modules calling each other
PLANNERS = {"specray.sweep.plan", "specray.draft", "specray.keys"}


def test_a_run_builds_the_splits_once_and_computes_keys_only_in_the_plan(
    finished_smoke: FinishedSweep,
) -> None:
    seen = finished_smoke.calls()
    by_function = Counter[str]()
    for (function, _caller), n in seen.items():
        by_function[function] += n
    assert by_function["build_splits"] == 1, seen
    assert by_function["draft_key_inputs"] == 5, seen  # four drafts and the un-distilled one, once each
    assert by_function["shard_key"] >= 1 and by_function["cell_key_inputs"] >= 1, seen  # counted at all
    outside = sorted({(f, c) for (f, c) in seen if f != "build_splits" and not _planner(c)})
    assert not outside, f"keys computed outside the plan: {outside}"


def _planner(module: str) -> bool:
    """Whether `module` may compute keys: a planner, or a module of the `specray.keys` package."""
    return module in PLANNERS or module.startswith("specray.keys.")
