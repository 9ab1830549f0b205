"""`tune.early_stopping: none` makes the search's choices independent of timing: specray's searcher
(Optuna TPE behind Tune's concurrency limiter, `sweep/tune/search.py`) is driven here as Tune drives it —
`suggest` while it gives trials, `on_trial_complete` as trials end — with the trials ending in two different
orders. In batches it proposes the same recipes both times; as Tune's default it does not."""

from __future__ import annotations

import random

import pytest

from specray.config import load_spec
from specray.sweep.tune.search import _search_alg
from specray.sweep.tune.space import search_space
from specray.sweep.tune.trial import OBJECTIVE
from tests.conftest import REPO


def _objective(config: dict) -> float:
    """A function of the recipe alone, with one best mixture (the trial's result on any machine)."""
    return -sum((value - 0.1 * i) ** 2 for i, (_, value) in enumerate(sorted(config.items())))


def _proposed(early_stopping: str, order: int) -> list[dict]:
    spec = load_spec(REPO / "sweeps" / "tune_tiny.yaml", [f"tune.early_stopping={early_stopping}"])
    searcher = _search_alg(spec.tune)
    searcher.set_search_properties(OBJECTIVE, "max", search_space(spec))
    ends = random.Random(order)  # which running trial ends next
    proposed: list[dict] = []
    running: dict[str, dict] = {}
    while len(proposed) < spec.tune.num_samples or running:
        while len(proposed) < spec.tune.num_samples:
            trial = f"trial_{len(proposed)}"
            config = searcher.suggest(trial)
            if config is None:
                break
            proposed.append(config)
            running[trial] = config
        trial = ends.choice(sorted(running))
        searcher.on_trial_complete(trial, {OBJECTIVE: _objective(running.pop(trial))})
    return proposed


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_in_batches_the_order_trials_end_in_changes_no_proposal() -> None:
    first, second = _proposed("none", order=1), _proposed("none", order=2)
    assert len(first) == 16 and first == second
    # the same searcher proposing as soon as any trial ends (Tune's default, with ASHA): the history each
    # proposal is made from depends on which trial ended first, and so do the proposals after TPE's start-up
    assert _proposed("asha", order=1) != _proposed("asha", order=2)
