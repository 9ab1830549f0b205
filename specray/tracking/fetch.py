"""A finished sweep's records, read back from its parent run in MLflow (`specray report --run`, export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from specray.errors import SpecError
from specray.tracking.names import ROLE


def fetch_sweep_records(uri: str, run_id: str, destination: Path) -> dict[str, Any]:
    """The plain records a sweep's parent run holds (cells, drafts, curves, lengths), from MLflow."""
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
        folder = Path(client.download_artifacts(run_id, "records", str(destination)))
    except MlflowException as e:
        raise SpecError(f"run {run_id} at {uri}: {e.message.splitlines()[0]}") from None
    if run.data.tags.get(ROLE) != "sweep":
        raise SpecError(f"run {run_id} is not a specray sweep's parent run (tag {ROLE} is not 'sweep')")
    records = {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}
    records["lengths"] = {
        k: {float(t): v for t, v in by.items()} for k, by in records.get("lengths", {}).items()
    }
    records["name"] = run.data.params.get("name", run_id)
    records["experiment"] = client.get_experiment(run.info.experiment_id).name
    projected = run.data.params.get("eval.projected_cost_ratio", "null")
    records["projected_cost_ratio"] = None if projected in ("null", "None") else float(projected)
    return records
