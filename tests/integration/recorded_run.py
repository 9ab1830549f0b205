"""The `specray` CLI with every call of the split builder and of the key recipes recorded, for
test_plan_once.py: the session's shared smoke sweep (tests/integration/conftest.py) runs through it, so that
one sweep both serves the tests that copy it and shows where its driver computed keys.

Run as `python recorded_run.py run SWEEP ...` (the CLI's own arguments). RECORD_CALLS names the JSON file
written as the CLI exits (also when it fails): a list of [function, calling module, number of calls], one
entry per pair, over every thread of the driver's process (its Ray workers are processes of their own, and
take what the driver planned).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specray.cli import main


def watched() -> dict[str, Callable[..., Any]]:
    from specray import keys
    from specray.data import dataset

    return {
        "build_splits": dataset.build_splits,
        "draft_key_inputs": keys.draft_key_inputs,
        "cell_key_inputs": keys.cell_key_inputs,
        "cost_ratio_inputs": keys.cost_ratio_inputs,
        "shard_key": keys.shard_key,
        "train_shard_keys": keys.train_shard_keys,
        "answers_key": keys.answers_key,
    }


def record_calls() -> Counter[tuple[str, str]]:
    """From now on, (function, calling module) of every call of a watched function, on every thread of this
    process: each watched function is replaced by a counting wrapper wherever a loaded specray module holds
    it, so a module imported later, which imports it from one of those, takes the wrapper too. (A profile
    hook would see calls however they were made, but would run on every call the driver makes.)"""
    seen = Counter[tuple[str, str]]()

    def counting(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def counted(*args: Any, **kwargs: Any) -> Any:
            seen[(name, sys._getframe(1).f_globals.get("__name__", "?"))] += 1
            return original(*args, **kwargs)

        return counted

    wrappers = {id(original): (original, counting(name, original)) for name, original in watched().items()}
    for module in [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "specray"]:
        for attribute, value in list(vars(module).items()):
            original, wrapper = wrappers.get(id(value), (None, None))
            if value is original:
                setattr(module, attribute, wrapper)
    return seen


if __name__ == "__main__":
    calls = record_calls()

    def write_calls() -> None:
        rows = [[function, caller, n] for (function, caller), n in sorted(calls.items())]
        Path(os.environ["RECORD_CALLS"]).write_text(json.dumps(rows))

    atexit.register(write_calls)  # the first registered, the last run: after Ray's and MLflow's hooks
    main()  # as the `specray` executable runs (with its quick exit, which runs the atexit hooks)
