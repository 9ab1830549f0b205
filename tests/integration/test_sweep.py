"""`specray run` end to end on the smoke sweep: real Ray, real MLflow, the real CLI — and resume after
the driver is killed mid-sweep."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from specray.tracking.names import PARENT, ROLE
from tests.stores import new_store
from tests.sweeps import (
    ALL_DRAFTS,
    COARSE_TIMING,
    SPECRAY,
    assert_cells_once,
    assert_tracked_once,
    finished_drafts,
    smoke_command,
)
from tests.waiting import CLI_TIMEOUT_S, wait_until

pytestmark = pytest.mark.integration


def _command(tmp_path: Path) -> list[str]:
    # the smoke sweep's short drafts train one after another in one Train run; Ray on 2 CPUs, as on a
    # 2-core machine, whatever this one has (ray settings are not part of the sweep's identity)
    return smoke_command(tmp_path, new_store(tmp_path), "ray.num_cpus=2", COARSE_TIMING)


def _kill_after_first_draft(tmp_path: Path) -> dict[str, float]:
    """Start the sweep, SIGKILL the driver (and the Ray it started) once a draft is finished."""
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    process = subprocess.Popen(_command(tmp_path), cwd=tmp_path, start_new_session=True, **quiet)
    wait_until(lambda: finished_drafts(tmp_path) or process.poll() is not None, "a finished draft")
    assert process.poll() is None, "the sweep ended before it could be interrupted"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    return finished_drafts(tmp_path)


def test_killed_sweep_resumes_without_redoing_finished_work(tmp_path: Path) -> None:
    before = _kill_after_first_draft(tmp_path)
    assert 1 <= len(before) < 4
    result = subprocess.run(
        _command(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(resumed)" in result.stdout

    after = finished_drafts(tmp_path)
    assert len(after) == 4
    for name, mtime in before.items():  # finished distillations were not redone
        assert after[name] == mtime, name

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert_tracked_once(uri, ALL_DRAFTS)
    assert_cells_once(tmp_path, ALL_DRAFTS)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("smoke")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE) == "sweep"]
    children = [r for r in runs if r.data.tags.get(PARENT) == parents[0].info.run_id]
    distilled = [c for c in children if c.data.tags["draft"] != "non-distill"]
    assert all(len(client.get_metric_history(c.info.run_id, "loss")) >= 1 for c in distilled)

    report = tmp_path / "smoke" / "report"
    assert (report / "report.md").exists() and (report / "heatmap_speedup_model_in_domain.png").exists()
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"report", "records", "spec.yaml"} <= artifacts

    args = ["report", parents[0].info.run_id, "--tracking-uri", uri, "--output", str(tmp_path / "rebuilt")]
    rebuilt = subprocess.run(
        [SPECRAY, *args], cwd=tmp_path, capture_output=True, text=True, timeout=CLI_TIMEOUT_S
    )
    assert rebuilt.returncode == 0, rebuilt.stderr[-2000:]
    assert (tmp_path / "rebuilt" / "report.md").read_text().split("\n", 1)[1] == (
        (report / "report.md").read_text().split("\n", 1)[1]
    )
    _assert_paper_report(report)


def _assert_paper_report(report: Path) -> None:
    """Every figure and table of the papers, and the verdict table with an interval where the smoke grid
    (τ_dec 0 and 1, τ_kd 0 and 1, no tune) allows one."""
    text = (report / "report.md").read_text()
    headings = ("## Verdicts", "## Fig. 1", "## Fig. 3", "## Table 2", "## Table 3", "## Fig. 5", "## Fig. 6")
    assert all(heading in text for heading in headings), [h for h in headings if h not in text]
    for figure in (
        "fig1_against_tau_dec",
        "peak_speedup_model_in_domain",
        "fig5_token_lengths",
        "fig6_kd_steps",
    ):
        assert (report / f"{figure}.png").exists() and f"({figure}.png)" in text, figure
    falls = next(
        line for line in text.splitlines() if line.startswith("| speedup falls as τ_dec rises | un-")
    )
    assert "| [" in falls  # its 95% interval
    assert "| the U-curve over τ_kd out of range |" in text and "not testable on this sweep" in text
