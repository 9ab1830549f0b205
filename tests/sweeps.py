"""Helpers for the tests that run the smoke sweep through the real CLI and check what it left behind."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from mlflow.tracking import MlflowClient

from specray.distill.checkpoints import FINISHED_FILE
from specray.tracking.names import PARENT, ROLE
from tests.conftest import REPO
from tests.waiting import CLI_TIMEOUT_S

SPECRAY = str(Path(sys.executable).parent / "specray")
SMOKE = REPO / "sweeps" / "smoke.yaml"
ALL_DRAFTS = ["non-distill", "offline/tau_kd=0", "offline/tau_kd=1", "online/tau_kd=0", "online/tau_kd=1"]
# metrics per draft: 2 τ_dec × 2 test sets × 6 analytic metrics (the β-based block efficiency beside the
# exact one) + 1 τ_dec × 2 test sets × 6 empirical ones (5 decoding metrics and the task quality of the
# decoded outputs; acceptance per draft position, `.../position_<k>`, comes on top)
CELL_METRICS_PER_DRAFT = 2 * 2 * 6 + 1 * 2 * 6
CELLS_PER_DRAFT = 2 * 2 + 1 * 2
# For the tests that check no step cost: c timed to ±50% (5-15 rounds) rather than smoke's ±10%, which the
# draft's noisy time (a difference of two timings) reaches after 20-200 rounds (200: the cap) on 2 cores,
# the more the busier the machine: 4-40 s a sweep. The stage still runs, on its eval actor, keyed and
# saved like any other.
COARSE_TIMING = "eval.timing_precision=0.5"


def smoke_command(output_dir: Path, uri: str, *overrides: str) -> list[str]:
    return [SPECRAY, "run", str(SMOKE), f"tracking.uri={uri}", f"output_dir={output_dir}", *overrides]


def run_cli(
    command: Sequence[str], cwd: Path, timeout: float = CLI_TIMEOUT_S, **env: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(command), cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


def finished_drafts(output_dir: Path) -> dict[str, float]:
    """Finished draft folder -> modification time of its completion marker (a damaged draft's folder, kept
    aside as `NAME.damaged-TIME`, is no draft)."""
    markers = (output_dir / "smoke" / "drafts").glob(f"*/{FINISHED_FILE}")
    return {m.parent.name: m.stat().st_mtime for m in markers if ".damaged-" not in m.parent.name}


def assert_tracked_once(uri: str, drafts: Sequence[str], experiment: str = "smoke") -> None:
    """One finished parent run; one child run per draft; every cell metric logged exactly once."""
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    parents = [r for r in runs if r.data.tags.get(ROLE) == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = [r for r in runs if r.data.tags.get(PARENT) == parents[0].info.run_id]
    assert sorted(r.data.tags["draft"] for r in children) == sorted(drafts)
    for child in children:
        cell_keys = [k for k in child.data.metrics if "/tau_dec_" in k and k.count("/") == 2]
        assert len(cell_keys) == CELL_METRICS_PER_DRAFT, child.data.tags["draft"]
        for key in cell_keys:
            history = client.get_metric_history(child.info.run_id, key)
            assert len(history) == 1, (child.data.tags["draft"], key)
        assert {"paradigm", "tau_kd", "mixture"} <= set(child.data.tags)
        assert child.info.status == "FINISHED"
        _assert_lineage_once(client, child.info.run_id, child.data.tags["draft"] != "non-distill")


def _assert_lineage_once(client: MlflowClient, run_id: str, distilled: bool) -> None:
    """A draft run's datasets each once; a distilled draft exactly one (finished) logged model."""
    run = client.get_run(run_id)
    names = [i.dataset.name for i in run.inputs.dataset_inputs]
    assert len(names) == len(set(names)) == (3 if distilled else 2), names  # its shard, two test sets
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"
    )
    assert [m.status for m in models] == (["READY"] if distilled else []), models


def assert_cells_once(output_dir: Path, drafts: Sequence[str]) -> None:
    """The local cell records: one file per (draft, τ_dec, test set, estimator), no temp files left."""
    folder = output_dir / "smoke" / "cells"
    assert len(list(folder.glob("*.json"))) == CELLS_PER_DRAFT * len(drafts)
    assert not list(folder.glob(".cell-*"))
