"""What several integration modules start from: one finished smoke sweep, run once per session through the
real CLI. A smoke sweep costs about a minute, so the tests that only read a finished one, or change it, take
a copy of this one instead of running their own. And the order in which `make test` starts the modules."""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from specray.config import dump_spec, load_spec
from specray.files import cache_dir
from specray.sweep.plan import SPEC_FILE
from tests.stores import new_store
from tests.sweeps import COARSE_TIMING, run_cli, smoke_command

# The modules in the order `make test` starts them on its three pytest-xdist workers (`--dist loadfile
# --no-loadscope-reorder`), the longest first, so that the workers run out of work at about the same time.
# xdist hands a worker its next module while the worker still has two tests to go, so a worker may hold a
# module or two that another, done first, could have run: cheap when the last modules are short, minutes
# when one of them is long, as in xdist's own order (by number of tests: the one-test modules last, among
# them test_result_keys.py at 9 minutes). The seconds are the lane of a fresh-clone `make test` at 7f07582 (a
# 2-core AMD EPYC VM, the shared data present, as in CI); test_result_keys.py's include the shared smoke sweep
# (`finished_smoke`), which the first module to ask for it runs. A module not named runs after these.
LONGEST_FIRST = (
    "test_faults.py",  # 418 s
    "test_result_keys.py",  # 367
    "test_benchmarks_quick.py",  # 356
    "test_chaos.py",  # 321
    "test_distill_ray.py",  # 316
    "test_real_model.py",  # 279
    "test_tune.py",  # 244
    "test_garden.py",  # 196
    "test_mlflow_ui.py",  # 164
    "test_submit.py",  # 151
    "test_eval_pool.py",  # 142
    "test_two_nodes.py",  # 113
    "test_spec_bench_sweep.py",  # 102
    "test_sweep.py",  # 100
    "test_bad_input.py",  # 69
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a module keeps its order


@dataclass(frozen=True)
class FinishedSweep:
    """A finished smoke sweep: `root` holds its output folder (`root/smoke`), its MLflow store and the calls
    its driver made of the key recipes (`calls`). It ran with `COARSE_TIMING` (its step costs timed to
    ±50%): a copy re-run passes it too, to reuse them."""

    root: Path

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    def calls(self) -> Counter[tuple[str, str]]:
        """(function, calling module) -> calls, of the split builder and every key recipe, in the sweep's
        driver (recorded_run.py)."""
        rows = json.loads((self.root / CALLS_FILE).read_text())
        return Counter({(function, caller): n for function, caller, n in rows})

    def copy_to(self, folder: Path) -> str:
        """The sweep moved into `folder` (an output_dir): its output folder and MLflow store copied, its
        resolved spec pointing at both; returns the copy's tracking URI. The store is copied with SQLite's
        backup API (a consistent copy). Artifacts stay where the original's experiment keeps them (MLflow
        records that folder's absolute path), so the copy's new runs log theirs there too, each under its
        own run id."""
        shutil.copytree(self.root / "smoke", folder / "smoke")
        source, copy = sqlite3.connect(self.root / "mlflow.db"), sqlite3.connect(folder / "mlflow.db")
        with closing(source), closing(copy):
            source.backup(copy)
        uri = f"sqlite:///{folder / 'mlflow.db'}"
        # the folder's resolved spec (what `specray export` reads) names the copy's store and folder
        spec_file = folder / "smoke" / SPEC_FILE
        spec_file.write_text(dump_spec(load_spec(spec_file, [f"tracking.uri={uri}", f"output_dir={folder}"])))
        return uri


@pytest.fixture(scope="session")
def finished_smoke(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> FinishedSweep:
    """Run once per `pytest` run, also under pytest-xdist, where a session fixture runs once per worker:
    the workers share one sweep in the run's common temp folder, the first to need it running it while
    holding a file lock (the recipe of xdist's docs); the tests only copy it (`copy_to`). The sweep keeps
    its cache (the zoo, the teacher shards) in that folder, and each worker merges it into its own, as if
    the worker had run the sweep: a copy re-run reuses them."""
    if worker_id == "master":  # not under xdist: one process, one cache
        return _run_smoke(tmp_path_factory.mktemp("finished-smoke"))
    root = tmp_path_factory.getbasetemp().parent / "finished-smoke"
    with FileLock(f"{root}.lock"):
        if not (root / FINISHED_MARK).is_file():
            shutil.rmtree(root, ignore_errors=True)  # what a worker that failed here left
            root.mkdir()
            _run_smoke(root, SPECRAY_CACHE=str(root / CACHE))
            (root / FINISHED_MARK).touch()
    # files the worker's cache has already (the same key: the same content) are left alone
    shutil.copytree(root / CACHE, cache_dir(), dirs_exist_ok=True, copy_function=_copy_unless_there)
    return FinishedSweep(root)


FINISHED_MARK, CACHE, CALLS_FILE = "finished-smoke.done", "cache", "calls.json"


def _copy_unless_there(source: str, target: str) -> None:
    if not Path(target).exists():
        shutil.copy2(source, target)


def _run_smoke(root: Path, **env: str) -> FinishedSweep:
    """The smoke sweep through the CLI, its driver's calls of the key recipes recorded (recorded_run.py)."""
    sweep = FinishedSweep(root)
    _, *arguments = smoke_command(root, new_store(root), COARSE_TIMING)  # without the `specray` script
    command = [sys.executable, str(Path(__file__).with_name("recorded_run.py")), *arguments]
    result = run_cli(command, root, RECORD_CALLS=str(root / CALLS_FILE), **env)
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep
