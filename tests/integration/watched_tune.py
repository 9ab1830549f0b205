"""The `specray` CLI with its tune driver watched, for test_tune.py, which runs one search through the real
CLI in a subprocess (so that it can be killed) and checks what it cannot see from outside the process.

Run as `python watched_tune.py tune SWEEP ...` (the CLI's own arguments). Environment:
- WATCH_LOG: a file each driver event is appended to, one JSON object a line: every call for teacher shards
  (`generate`: its τ_kd and whether the search was running then) and a snapshot of the shard cache as the
  search starts and as it returns (`search_start`, `search_end`);
- WATCH_INTERRUPT_FINAL=1: the driver dies (`Interrupted`) after training two full-budget drafts;
- WATCH_OUTCOME: where the finished search's TuneOutcome is pickled.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import specray.sweep.tune as tune_package
import specray.sweep.tune.driver as driver
import specray.sweep.tune.search_stage as search_stage
import specray.teacher.shards as teacher_shards
from specray.cli import app
from specray.files import cache_dir


class Interrupted(Exception):
    """The driver stopped part-way through the full budget."""


def shard_files() -> dict[str, list[int]]:
    root = cache_dir() / "shards"
    return {str(p): [p.stat().st_size, p.stat().st_mtime_ns] for p in root.rglob("*") if p.is_file()}


def record(**event: Any) -> None:
    with Path(os.environ["WATCH_LOG"]).open("a") as log:
        log.write(json.dumps(event) + "\n")


def watch() -> None:
    searching = [False]
    real_generate, real_search = teacher_shards.generate_shards, search_stage.search
    real_distill, real_run_tune = driver.Tune.distill, tune_package.run_tune

    def generate(*args, **kwargs):
        record(event="generate", taus=list(args[2]), searching=searching[0])
        return real_generate(*args, **kwargs)

    def search(*args, **kwargs):
        searching[0] = True
        record(event="search_start", shards=shard_files())
        try:
            return real_search(*args, **kwargs)
        finally:
            searching[0] = False
            record(event="search_end", shards=shard_files())

    def distill(self, drafts, role, stage):
        if role == "final" and os.environ.get("WATCH_INTERRUPT_FINAL"):
            real_distill(self, drafts[:2], role, stage)
            raise Interrupted
        return real_distill(self, drafts, role, stage)

    def run_tune(*args, **kwargs):
        outcome = real_run_tune(*args, **kwargs)
        if where := os.environ.get("WATCH_OUTCOME"):
            Path(where).write_bytes(pickle.dumps(outcome))
        return outcome

    teacher_shards.generate_shards = generate
    search_stage.search = search
    driver.Tune.distill = distill  # type: ignore[method-assign]
    tune_package.run_tune = run_tune


if __name__ == "__main__":
    watch()
    app()
