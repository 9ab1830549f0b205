"""A finished sweep's or model garden's records, read back from its parent run in MLflow (report, export)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from specray.draft import Draft
from specray.errors import SpecError
from specray.keys import OlderFormat, older_format_line
from specray.specdec.records import CellRecord
from specray.tracking.names import ROLE

# the parent runs whose records a report is rebuilt from
REPORTED_ROLES = ("sweep", "garden")


def run_role(uri: str, run_id: str) -> str:
    """The run's specray role (`sweep`, `garden`, `tune`, `draft`, ...); a clear error for an unknown run
    or an unreachable store, and for a run that is not a sweep's or a garden's parent run."""
    try:
        run = MlflowClient(tracking_uri=uri).get_run(run_id)
    except MlflowException as e:
        raise SpecError(f"run {run_id} at {uri}: {e.message.splitlines()[0]}") from None
    role = run.data.tags.get(ROLE, "")
    if role not in REPORTED_ROLES:
        raise SpecError(
            f"run {run_id} is not the parent run of a specray sweep or garden (tag {ROLE} is "
            f"{role or 'absent'!r}; allowed: {', '.join(REPORTED_ROLES)})"
        )
    return role


def _records(uri: str, run_id: str, destination: Path, role: str) -> tuple[Any, dict[str, Any]]:
    """(the run, its `records/*.json` by file stem), after checking that the run has the role."""
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
        folder = Path(client.download_artifacts(run_id, "records", str(destination)))
    except MlflowException as e:
        raise SpecError(f"run {run_id} at {uri}: {e.message.splitlines()[0]}") from None
    if run.data.tags.get(ROLE) != role:
        raise SpecError(f"run {run_id} is not a specray {role}'s parent run (tag {ROLE} is not {role!r})")
    return run, {path.stem: json.loads(path.read_text()) for path in folder.glob("*.json")}


def fetch_garden_records(uri: str, run_id: str, destination: Path) -> dict[str, Any]:
    """A model garden's parent run: its name, measured points (`garden_points`, as `PointResult.to_json`
    wrote them) and the seed its report's intervals drew with."""
    run, records = _records(uri, run_id, destination, "garden")
    if "garden_points" not in records:
        raise SpecError(f"run {run_id} holds no records/garden_points.json: the garden did not finish")
    return {
        "name": run.data.params.get("name", run_id),
        "points": records["garden_points"],
        "seed": int(run.data.params.get("eval.seed", 0)),
    }


def fetch_sweep_records(uri: str, run_id: str, destination: Path) -> dict[str, Any]:
    """The records a sweep's parent run holds, from MLflow: `cells` as `CellRecord`s and `drafts` as `Draft`s,
    curves, lengths and the rest as logged. A run of an older specray format is refused in one line (its
    sweep, run again, recomputes it)."""
    client = MlflowClient(tracking_uri=uri)
    run, records = _records(uri, run_id, destination, "sweep")
    try:
        records["cells"] = [CellRecord.from_json(cell) for cell in records.get("cells", [])]
        records["drafts"] = [Draft.from_json(draft) for draft in records.get("drafts", [])]
    except (OlderFormat, KeyError, TypeError, AttributeError):  # another format: flat rows, drafts by name
        raise SpecError(older_format_line(f"run {run_id}", "run its sweep again to recompute it")) from None
    records["lengths"] = {
        k: {float(t): v for t, v in by.items()} for k, by in records.get("lengths", {}).items()
    }
    records["name"] = run.data.params.get("name", run_id)
    records["experiment"] = client.get_experiment(run.info.experiment_id).name
    projected = run.data.params.get("eval.projected_cost_ratio", "null")
    records["projected_cost_ratio"] = None if projected in ("null", "None") else float(projected)
    return records


def fetch_tune_report(uri: str, run_id: str, destination: Path) -> tuple[Path, str] | None:
    """A `specray tune` parent run's report folder (its `report` artifact, downloaded into `destination`)
    and its experiment's name; None when the run is not a tune's parent run."""
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id)
    except MlflowException as e:
        raise SpecError(f"run {run_id} at {uri}: {e.message.splitlines()[0]}") from None
    if run.data.tags.get(ROLE) != "tune":
        return None
    folder = destination / "report"
    try:
        folder = Path(client.download_artifacts(run_id, "report", str(destination)))
    except (MlflowException, OSError):  # an unfinished search logged no report: the caller says so
        folder.mkdir(parents=True, exist_ok=True)
    return folder, client.get_experiment(run.info.experiment_id).name
