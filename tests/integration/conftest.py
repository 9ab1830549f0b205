"""What several integration modules start from: one finished smoke sweep, run once per session through the
real CLI. A smoke sweep costs about a minute, so the tests that only read a finished one, or change it, take
a copy of this one instead of running their own."""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import pytest

from specray.config import dump_spec, load_spec
from specray.sweep.plan import SPEC_FILE
from tests.sweeps import run_cli, smoke_command


@dataclass(frozen=True)
class FinishedSweep:
    """A finished smoke sweep: `root` holds its output folder (`root/smoke`) and its MLflow store."""

    root: Path

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

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
def finished_smoke(tmp_path_factory: pytest.TempPathFactory) -> FinishedSweep:
    root = tmp_path_factory.mktemp("finished-smoke")
    sweep = FinishedSweep(root)
    result = run_cli(smoke_command(root, sweep.uri), root)
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep
