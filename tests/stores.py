"""A new, empty MLflow SQLite store for a test, without MLflow's schema migrations each time.

MLflow makes a new SQLite store by running every schema migration since its first release, one after
another: seconds per store on a 2-core machine, where opening a store that has its tables takes a fraction
of one (CHANGELOG has the figures). A test that runs a sweep (or a server) on a store of its own asks
`new_store` for it instead: a copy of an empty store that this MLflow made once, on first use, for every
test on the machine (one file per MLflow version, under the system's temp folder, made under a file lock
and published whole).

The copy is the store MLflow would make, with one difference no test reads: its `Default` experiment (id 0,
which specray never logs to) keeps the artifact folder of the template's own folder. A test that does not
ask for one (the read-only output folder, the refusals before any work) names a path that does not exist,
and MLflow makes the store there as it would for a user.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

TEMPLATES = Path(tempfile.gettempdir()) / f"specray-tests-{os.getuid()}"


def new_store(folder: Path, name: str = "mlflow.db") -> str:
    """`folder/name`, an empty MLflow store (made if it is not there yet), as a tracking URI."""
    store = Path(folder) / name
    if not store.exists():
        store.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_template(), store)
    return f"sqlite:///{store}"


def _template() -> Path:
    import mlflow  # here: importing this module costs nothing until a store is asked for
    from mlflow.tracking import MlflowClient

    template = TEMPLATES / f"mlflow-{mlflow.__version__}.db"
    if template.is_file():
        return template
    TEMPLATES.mkdir(exist_ok=True)
    with FileLock(f"{template}.lock"):
        if not template.is_file():
            with tempfile.TemporaryDirectory(dir=TEMPLATES) as scratch:
                made = Path(scratch) / "mlflow.db"
                MlflowClient(f"sqlite:///{made}").search_experiments()  # runs the migrations
                os.replace(made, template)
    return template
