"""What MLflow datasets and logged models add to a sweep's wall time: the tiny sweep's 22 distilled drafts
and its un-distilled one, logged the old way and the new way, side by side in one run, per store.

    .venv/bin/python -m benchmarks.sweep.mlflow_lineage              # sqlite and an `mlflow server` over HTTP
    .venv/bin/python -m benchmarks.sweep.mlflow_lineage --stores sqlite --repeats 1
    .venv/bin/python -m benchmarks.sweep.mlflow_lineage --quick   # a smoke check (benchmarks/quick.py)

old: what `finish_draft` did before: the HF folder as the draft run's artifacts (`log_artifacts`).
new: what it does now: the run's datasets (`log_datasets`: its shard and the test sets) and the draft as a
     logged model (`log_draft_model`: create, link to the run, MLmodel, the HF folder, finalize), plus the
     un-distilled draft's datasets and, once per sweep, the parent's datasets, description and drafts view
     (`describe_sweep`).
Each repeat uses fresh runs in a fresh experiment of the same store, old and new alternating; the drafts
are copies of the default tiny zoo's draft (5.3M-parameter zoo; its draft folder is what a tiny sweep
publishes per draft). Both sides include the search MLflow needs to log each thing once. `--quick`: the
drafts of the quick spec (4, copies of the micro zoo's draft), sqlite only, one repeat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from benchmarks.quick import tiny_or_quick
from specray.models.zoo import build_zoo
from specray.sweep.plan import plan_sweep
from specray.sweep.tracked import sweep_data
from specray.tracking.client import Tracker, describe_sweep
from specray.tracking.lineage import draft_model, draft_note

QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


@contextmanager
def sqlite_store(folder: Path) -> Iterator[str]:
    yield f"sqlite:///{folder / 'bench.db'}"


@contextmanager
def mlflow_server(folder: Path, port: int = 5399) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 with a sqlite backend and proxied artifacts, as the tests run it."""
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--host=127.0.0.1", f"--port={port}"]
    command += [f"--backend-store-uri=sqlite:///{folder / 'server.db'}", "--workers=1"]
    command += [f"--artifacts-destination={folder / 'served-artifacts'}"]
    env = os.environ | QUIET
    with open(folder / "server.log", "w") as log:
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


def one_sweep(uri: str, experiment: str, sweep, plans, baseline, way: str) -> float:
    """Seconds to log one sweep's drafts `way` (old or new) into fresh runs."""
    tracker, spec = Tracker(uri, experiment), sweep.spec
    parent, _ = tracker.parent_run(spec)
    runs = {p.name: tracker.child_run(parent, p.name, p.key, p.tags, draft_note(spec, p)) for p in plans}
    runs[baseline.name] = tracker.child_run(parent, baseline.name, baseline.key, baseline.tags)
    started = time.perf_counter()
    if way == "old":
        for plan in plans:
            if "draft" not in tracker.artifact_paths(runs[plan.name]):
                tracker.log_artifacts(runs[plan.name], plan.folder, "draft")
    else:
        data = sweep_data(sweep)
        describe_sweep(tracker, parent, spec, data, len(plans))
        for plan in plans:
            tracker.log_datasets(runs[plan.name], data.for_draft(plan.mixture))
            tracker.log_draft_model(runs[plan.name], draft_model(plan))
        tracker.log_datasets(runs[baseline.name], data.tests)
    return time.perf_counter() - started


def measure(uri: str, sweep, plans, baseline, repeats: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    for repeat in range(repeats):
        for way in ("old", "new") if repeat % 2 == 0 else ("new", "old"):
            elapsed = one_sweep(uri, f"bench-{way}-{repeat}", sweep, plans, baseline, way)
            seconds[way].append(elapsed)
            print(f"  pass {repeat + 1} {way}: {elapsed:6.2f} s", flush=True)
    return seconds


def report(store: str, seconds: dict[str, list[float]], drafts: int) -> None:
    old, new = statistics.median(seconds["old"]), statistics.median(seconds["new"])
    print(
        f"{store:>6}: old {old:6.2f} s, new {new:6.2f} s (median of {len(seconds['old'])}); "
        f"new/old {new / old:.2f}x; +{new - old:.2f} s per sweep, +{(new - old) / drafts:.3f} s per draft"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--stores", nargs="+", default=None, choices=["sqlite", "server"])
    parser.add_argument("--quick", action="store_true", help="a micro zoo's drafts, sqlite: a smoke check")
    args = parser.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.stores = args.stores or (["sqlite"] if args.quick else ["sqlite", "server"])
    os.environ.update(QUIET)
    spec = tiny_or_quick(args.quick)(())
    draft_dir = build_zoo(spec.models.zoo).draft  # the tiny zoo (or the micro one), cached once built
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plans = []
        sweep = plan_sweep(spec)
        for plan in sweep.drafts:
            folder = root / "drafts" / plan.folder.name
            shutil.copytree(draft_dir, folder)
            plans.append(replace(plan, folder=folder))
        baseline = replace(sweep.baseline, folder=Path(draft_dir))
        size = sum(f.stat().st_size for f in Path(draft_dir).iterdir()) / 2**20
        print(f"{len(plans)} distilled drafts + 1 un-distilled, {size:.1f} MiB per draft folder")
        os.chdir(root)  # the sqlite store's artifacts (./mlruns) go to the temp folder
        results = {}
        for store in args.stores:
            print(f"{store}:", flush=True)
            with sqlite_store(root) if store == "sqlite" else mlflow_server(root) as uri:
                results[store] = measure(uri, sweep, plans, baseline, args.repeats)
        print()
        for store, seconds in results.items():
            report(store, seconds, len(plans) + 1)


if __name__ == "__main__":
    main()
