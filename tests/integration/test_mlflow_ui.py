"""A real MLflow tracking server (`mlflow server` on 127.0.0.1, sqlite backend, artifacts proxied to a local
folder): the smoke sweep tracks to it over HTTP, `MlflowClient` reads the runs back, and the MLflow UI in
headless Chromium lists them. The UI's screenshot is kept as a test artifact (outputs/test-artifacts/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from urllib.parse import quote

import pytest
from mlflow.tracking import MlflowClient

from specray.tracking import (
    ACCEPTANCE_RATE,
    BLOCK_EFFICIENCY,
    DRAFT_ACCEPTANCE,
    EMPIRICAL_ACCEPTANCE_RATE,
    PARENT,
    ROLE,
    SPEEDUP,
    SPEEDUP_MODEL,
    cell_key,
)
from tests.conftest import REPO
from tests.servers import QUIET, listening_addresses
from tests.servers import mlflow_server as start_mlflow_server
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_COPY = REPO / "outputs" / "test-artifacts" / "mlflow_ui.png"
TEST_SETS = ("in_domain", "out_of_domain")
DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1", "online/tau_kd=0", "online/tau_kd=1"]


@dataclass(frozen=True)
class TrackedSweep:
    url: str
    experiment_id: str
    folder: Path  # the sweep's output_dir; the server's artifact store is folder / "artifacts"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`mlflow server` on a free loopback port; stopped (its whole process group) afterwards."""
    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))
    try:
        yield server.url, server.folder
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tracked_sweep(mlflow_server: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> TrackedSweep:
    """The smoke sweep, run through the real CLI, tracking to the server over HTTP."""
    url, server_folder = mlflow_server
    folder = tmp_path_factory.mktemp("sweep")
    command = [str(BIN / "specray"), "run", str(REPO / "sweeps" / "smoke.yaml"), f"tracking.uri={url}"]
    command.append(f"output_dir={folder}")
    env = {**os.environ, **QUIET}
    result = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    experiment = MlflowClient(url).get_experiment_by_name("smoke")
    return TrackedSweep(url, experiment.experiment_id, server_folder)


def test_the_server_listens_on_loopback_only(mlflow_server: tuple[str, Path]) -> None:
    port = int(mlflow_server[0].rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_runs_read_back_from_the_server(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    client = MlflowClient(tracked_sweep.url)
    runs = client.search_runs([tracked_sweep.experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["eval.gamma"] == "3"
    assert parent.data.params["teacher.temperatures"] == "[0.0, 1.0]"
    assert parent.data.params["tracking.uri"] == tracked_sweep.url

    children = [r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id]
    assert sorted(r.info.run_name for r in children) == DRAFTS
    analytic_metrics = (ACCEPTANCE_RATE, BLOCK_EFFICIENCY, SPEEDUP_MODEL)
    empirical_metrics = (EMPIRICAL_ACCEPTANCE_RATE, DRAFT_ACCEPTANCE, SPEEDUP)
    analytic = [cell_key(*cell) for cell in product(analytic_metrics, TEST_SETS, (0.0, 1.0))]
    empirical = [cell_key(*cell, 1.0) for cell in product(empirical_metrics, TEST_SETS)]  # at τ_dec 1 only
    assert "acceptance_rate/in_domain/tau_dec_0" in analytic  # the names of DESIGN.md, "=" spelled "_"
    for child in children:
        assert set(analytic + empirical) <= set(child.data.metrics), child.info.run_name
        assert 0.0 <= child.data.metrics["acceptance_rate/in_domain/tau_dec_1"] <= 1.0

    reports = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/report.md", "report/cells.csv", "report/heatmap_speedup_model_in_domain.png"} <= reports
    report = Path(client.download_artifacts(parent.info.run_id, "report/report.md", str(tmp_path)))
    assert report.read_text().startswith("# specray sweep: smoke")
    # the artifacts went through the server into its store, not straight from the client to a folder
    assert list((tracked_sweep.folder / "artifacts").rglob("report.md"))


def _chromium(url: str, profile: Path, *action: str) -> subprocess.CompletedProcess:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1400,900",
        "--virtual-time-budget=15000",  # the UI is a React app: let it fetch and render the runs
    ]
    return subprocess.run([CHROMIUM, *flags, *action, url], capture_output=True, text=True, timeout=300)


def test_ui_lists_the_sweeps_runs(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("chromium not found: `make setup-test` installs it on Debian (apt-get install chromium)")
    # Sorted by a metric, the UI lists child runs flat; in its default order it nests them, collapsed,
    # under the sweep's parent run. The sort is itself a useful view: drafts ranked by acceptance at τ_dec 1.
    order = quote("metrics.`acceptance_rate/in_domain/tau_dec_1`", safe="")
    runs_page = f"{tracked_sweep.url}/#/experiments/{tracked_sweep.experiment_id}/runs"
    page = f"{runs_page}?orderByKey={order}&orderByAsc=false"
    for attempt in range(3):  # the first start of a fresh profile can be slow
        dom = _chromium(page, tmp_path / f"profile-dom-{attempt}", "--dump-dom").stdout
        if all(name in dom for name in DRAFTS):
            break
    missing = [name for name in DRAFTS if name not in dom]
    assert not missing, f"runs not listed in the UI: {missing}\n{dom[-3000:]}"

    screenshot = tmp_path / "mlflow_ui.png"
    shot = _chromium(page, tmp_path / "profile-shot", f"--screenshot={screenshot}")
    assert screenshot.exists() and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, SCREENSHOT_COPY)
