"""A real MLflow tracking server (`mlflow server` on 127.0.0.1, sqlite backend, artifacts proxied to a local
folder): the smoke sweep tracks to it over HTTP with its output to a pipe, `MlflowClient` reads the runs,
datasets and logged models back, and the MLflow UI in headless Chromium shows them on the page the sweep
prints. The UI's screenshot is kept as a test artifact (outputs/test-artifacts/; README's copy is
docs/figures/mlflow_runs.png). The sweep's progress lines in the pipe are checked here too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from specray.metrics import (
    ACCEPTANCE_RATE,
    BLOCK_EFFICIENCY,
    DRAFT_ACCEPTANCE,
    EMPIRICAL_ACCEPTANCE_RATE,
    SPEEDUP,
    SPEEDUP_MODEL,
)
from specray.progress import INTERVAL_ENV
from specray.tracking.lineage import DRAFTS_VIEW
from specray.tracking.names import (
    EXPERIMENT_KIND,
    MODEL_DEVELOPMENT,
    NOTE,
    PARENT,
    ROLE,
    SAVED_VIEW,
    cell_key,
)
from tests.conftest import REPO
from tests.servers import QUIET, listening_addresses
from tests.servers import mlflow_server as start_mlflow_server
from tests.sweeps import COARSE_TIMING
from tests.waiting import CLI_TIMEOUT_S

pytestmark = pytest.mark.integration
BIN = Path(sys.executable).parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENSHOT_COPY = REPO / "outputs" / "test-artifacts" / "mlflow_ui.png"
TEST_SETS = ("in_domain", "out_of_domain")
DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1", "online/tau_kd=0", "online/tau_kd=1"]
TITLES = ["smoke · non-distill", "smoke · offline τ_kd=0", "smoke · offline τ_kd=1", "smoke · online τ_kd=0"]
TITLES += ["smoke · online τ_kd=1"]
STAGES = ["zoo", "teacher shards", "distill", "step costs", "eval"]
PROGRESS = re.compile(r"^progress (?P<stage>[a-z ]+): (?P<done>\d+)/(?P<total>\d+) \w+ \(\d+%\)")


@dataclass(frozen=True)
class TrackedSweep:
    url: str
    experiment_id: str
    folder: Path  # the server's folder; its artifact store is folder / "artifacts"
    stdout: str
    stderr: str  # progress lines and logs, as a pipe received them


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
    """The smoke sweep, run through the real CLI with its output to pipes, tracking to the server over HTTP;
    with a cache of its own (every stage computes) and progress lines every second."""
    url, server_folder = mlflow_server
    folder = tmp_path_factory.mktemp("sweep")
    command = [str(BIN / "specray"), "run", str(REPO / "sweeps" / "smoke.yaml"), f"tracking.uri={url}"]
    command += [f"output_dir={folder}", COARSE_TIMING]
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env |= QUIET | {INTERVAL_ENV: "1", "SPECRAY_CACHE": str(tmp_path_factory.mktemp("cache"))}
    result = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    experiment = MlflowClient(url).get_experiment_by_name("smoke")
    return TrackedSweep(url, experiment.experiment_id, server_folder, result.stdout, result.stderr)


def test_progress_lines_reach_the_pipe_during_every_stage(tracked_sweep: TrackedSweep) -> None:
    """In stage order, each stage prints lines while it runs (not only at its end), counts never go back,
    and where a stage has several units an intermediate count comes before the stage's closing line."""
    assert "\r" not in tracked_sweep.stderr  # lines, not a terminal bar redrawn in place
    lines = [line for line in tracked_sweep.stderr.splitlines() if PROGRESS.match(line)]
    stages = [PROGRESS.match(line)["stage"] for line in lines]
    assert list(dict.fromkeys(stages)) == STAGES, stages  # in order, each stage's lines together
    for stage in STAGES:
        own = [line for line in lines if PROGRESS.match(line)["stage"] == stage]
        counts = [int(PROGRESS.match(line)["done"]) for line in own]
        total = int(PROGRESS.match(own[-1])["total"])
        assert own[-1].endswith("done") and counts[-1] == total, own
        running = counts[:-1]  # printed before the stage ended
        assert running and running == sorted(running) and running[-1] <= total, own
        if total > 1:
            assert any(0 < count < total for count in running), own
    assert any(
        "loss" in line and "acceptance" in line for line in lines if line.startswith("progress distill")
    )


def test_the_server_listens_on_loopback_only(mlflow_server: tuple[str, Path]) -> None:
    port = int(mlflow_server[0].rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}


def test_runs_read_back_from_the_server(tracked_sweep: TrackedSweep, tmp_path: Path) -> None:
    client = MlflowClient(tracked_sweep.url)
    runs = client.search_runs([tracked_sweep.experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.data.params["eval.gamma"] == "[3]"  # γ is a grid axis: a list
    assert parent.data.params["teacher.temperatures"] == "[0.0, 1.0]"
    assert parent.data.params["tracking.uri"] == tracked_sweep.url

    children = [r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id]
    assert sorted(r.data.tags["draft"] for r in children) == DRAFTS
    assert sorted(r.info.run_name for r in children) == TITLES
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
        "--window-size=1920,1000",
        "--virtual-time-budget=15000",  # the UI is a React app: let it fetch and render the runs
    ]
    return subprocess.run([CHROMIUM, *flags, *action, url], capture_output=True, text=True, timeout=300)


def _runs_page(stdout: str) -> str:
    """The runs page `specray run` prints at the end."""
    return next(line.split(": ", 1)[1] for line in stdout.splitlines() if line.startswith("MLflow runs: "))


def _dom_with(url: str, profile: Path, needles: list[str]) -> str:
    for attempt in range(3):  # the first start of a fresh profile can be slow
        dom = _chromium(url, profile / f"dom-{attempt}", "--dump-dom").stdout
        if all(needle in dom for needle in needles):
            break
    missing = [needle for needle in needles if needle not in dom]
    assert not missing, f"not on the page {url}: {missing}\n{dom[-3000:]}"
    return dom


def test_ui_opens_on_the_sweeps_runs_with_datasets_and_models(
    tracked_sweep: TrackedSweep, tmp_path: Path
) -> None:
    """The page the sweep prints is the runs table in the drafts view: every run by its name, a draft's
    shard as its dataset (name and content key), its logged model; the model's page has its recipe.
    (MLflow 3.17 opens an experiment's bare address on the GenAI pages whatever its kind tag: its sidebar
    switch decides, so the printed address names `workflowType=machine_learning`.)"""
    if CHROMIUM is None:
        pytest.skip("chromium not found: `make setup-test` installs it on Debian (apt-get install chromium)")
    page = _runs_page(tracked_sweep.stdout)
    assert page.startswith(f"{tracked_sweep.url}/#/experiments/{tracked_sweep.experiment_id}/runs?")
    client = MlflowClient(tracked_sweep.url)
    runs = [client.get_run(r.info.run_id) for r in client.search_runs([tracked_sweep.experiment_id])]
    draft = next(r for r in runs if r.data.tags.get("draft") == "offline/tau_kd=0")
    shard = next(i.dataset for i in draft.inputs.dataset_inputs if i.dataset.name.startswith("teacher"))
    model = client.get_logged_model(draft.outputs.model_outputs[0].model_id)
    expected = [*TITLES, f"{shard.name} ({shard.digest})", model.name, "specray: drafts"]
    _dom_with(page, tmp_path / "runs", expected)

    model_page = f"{tracked_sweep.url}/#/experiments/{tracked_sweep.experiment_id}/models/{model.model_id}"
    _dom_with(model_page, tmp_path / "model", [model.name, "distill.lr", "smoke · offline τ_kd=0"])

    screenshot = tmp_path / "mlflow_ui.png"
    shot = _chromium(page, tmp_path / "profile-shot", f"--screenshot={screenshot}")
    assert screenshot.exists() and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, SCREENSHOT_COPY)


def test_datasets_models_and_views_read_back(tracked_sweep: TrackedSweep) -> None:
    """The experiment is a model-development one with the drafts view; the parent lists every dataset,
    each draft run its shard and the test sets, and each distilled draft is one logged model."""
    client = MlflowClient(tracked_sweep.url)
    experiment = client.get_experiment(tracked_sweep.experiment_id)
    assert (
        experiment.tags[EXPERIMENT_KIND] == MODEL_DEVELOPMENT and SAVED_VIEW + DRAFTS_VIEW in experiment.tags
    )
    assert "specray: drafts" in experiment.tags[NOTE]  # what to open, on every page of the experiment
    runs = [client.get_run(r.info.run_id) for r in client.search_runs([tracked_sweep.experiment_id])]
    parent = next(r for r in runs if r.data.tags.get(ROLE) == "sweep")
    assert parent.info.run_name.startswith("smoke · sweep ") and "smoke" in parent.data.tags[NOTE]
    names = sorted(i.dataset.name for i in parent.inputs.dataset_inputs)
    tests = ["in_domain test", "out_of_domain test"]
    assert names == [*tests, "teacher τ_kd=0", "teacher τ_kd=1", "train prompts"]
    shard_digest = {i.dataset.name: i.dataset.digest for i in parent.inputs.dataset_inputs}
    for child in (r for r in runs if r.data.tags.get(PARENT) == parent.info.run_id):
        draft, inputs = child.data.tags["draft"], child.inputs.dataset_inputs
        assert child.data.tags[NOTE], draft
        if draft == "non-distill":
            assert sorted(i.dataset.name for i in inputs) == tests and not child.outputs.model_outputs
            continue
        shard = f"teacher τ_kd={child.data.tags['tau_kd']}"
        assert sorted(i.dataset.name for i in inputs) == [*tests, shard], draft
        assert {i.dataset.digest for i in inputs} <= set(shard_digest.values())
        (output,) = child.outputs.model_outputs
        model = client.get_logged_model(output.model_id)
        assert model.status == "READY" and model.source_run_id == child.info.run_id
        assert model.tags["specray.draft_key"] == child.data.tags["specray.draft_key"]
        assert model.params["paradigm"] == child.data.tags["paradigm"]
