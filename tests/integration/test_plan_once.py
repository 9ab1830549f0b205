"""A sweep plans once: `specray run` builds the splits once and computes every result key in the plan
(`sweep/plan.py`, and `draft.plan_draft` that it calls), never again in a stage, a Train run or the report.

The sweep runs in this process (its Ray workers are separate processes, and take what the driver prepared),
with a profiling hook that records who calls the splits and the key recipes. The drafts are trained and the
cells evaluated anew (a fresh output folder); the zoo and the teacher shards come from the session's
finished smoke sweep.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from specray.config import load_spec
from tests.conftest import REPO

pytestmark = pytest.mark.integration

# where each key recipe may be called from: the plan, and the recipes' own modules calling each other
PLANNERS = {"specray.sweep.plan", "specray.draft", "specray.keys"}


def _watched() -> dict[CodeType, str]:
    from specray import keys
    from specray.data import dataset
    from specray.specdec import turns

    functions = {
        "build_splits": dataset.build_splits,
        "draft_key_inputs": keys.draft_key_inputs,
        "cell_key_inputs": keys.cell_key_inputs,
        "cost_ratio_inputs": keys.cost_ratio_inputs,
        "shard_key": keys.shard_key,
        "train_shard_keys": keys.train_shard_keys,
        "answers_key": turns.answers_key,
    }
    return {f.__code__: name for name, f in functions.items()}


@contextmanager
def calls_recorded() -> Iterator[Counter[tuple[str, str]]]:
    """(function, calling module) of every call of a watched function, on every thread of this process."""
    watched, seen = _watched(), Counter[tuple[str, str]]()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code in watched and frame.f_back is not None:
            seen[(watched[frame.f_code], frame.f_back.f_globals.get("__name__", "?"))] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]


def test_a_run_builds_the_splits_once_and_computes_keys_only_in_the_plan(
    finished_smoke, tmp_path: Path
) -> None:
    from specray.sweep.run import run_sweep

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    spec = load_spec(REPO / "sweeps" / "smoke.yaml", [f"output_dir={tmp_path}", f"tracking.uri={uri}"])
    with calls_recorded() as seen:
        outcome = run_sweep(spec, show_progress=False)
    assert len(outcome.records) == 30 and all(stage.todo == 0 for stage in outcome.plan[:1])
    by_function = Counter[str]()
    for (function, _caller), n in seen.items():
        by_function[function] += n
    assert by_function["build_splits"] == 1, seen
    assert by_function["draft_key_inputs"] == 5  # four drafts and the un-distilled one, once each
    outside = sorted({(f, c) for (f, c) in seen if f != "build_splits" and not _planner(c)})
    assert not outside, f"keys computed outside the plan: {outside}"


def _planner(module: str) -> bool:
    """Whether `module` may compute keys: a planner, or a module of the `specray.keys` package."""
    return module in PLANNERS or module.startswith("specray.keys.")
