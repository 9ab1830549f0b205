"""What `specray export` reads: a finished sweep (`source.py`) or a finished `specray tune`.

A tune run is given as its folder (`<output_dir>/<name>/tune`, or its `report/` folder) or its MLflow parent
run id. Its candidates are the drafts its Table 3 compares, retrained at the full budget (`tune.final_steps`)
— the winner's recipe, each best single τ_kd and each manual recipe, every replicate — with their test-set
cells; the drafts of the search budget (trials, search baselines) are the search's record and never
served. The routing plan then chooses among recipes on their mean over replicates and serves the replicate
closest to that mean (`plan.py`). What the tune left for this (`sweep/tune/outputs.py`): the drafts
(`drafts.json`), their cells (`cells.json`), the step costs and the spec; a tune run without them (one
interrupted before its full-budget drafts) is refused, naming `tune.final_steps`.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from specray.config import SweepSpec, load_spec
from specray.draft import Draft
from specray.errors import SpecError
from specray.keys import OlderFormat, older_format_line
from specray.names import TUNE_DRAFTS, TUNE_REPORT, TUNE_SPEC, TUNE_STATE, TUNE_STEP_COSTS
from specray.report.tables import TUNE_CELLS_FILE
from specray.serving.source import DraftDirs, SweepResults, read_sweep
from specray.specdec.records import CellRecord, StepCosts

REPORT_ONLY = ("recipe", "replicate")  # what the tune's cell rows add to `CellRecord.flat()`


def read_source(source: str, tracking_uri: str | None = None, work: Path | None = None) -> SweepResults:
    """A finished sweep or tune run, from its folder or its MLflow parent run id (at `tracking_uri`)."""
    folder = Path(source)
    if folder.is_dir():
        return read_tune_folder(folder) if is_tune_folder(folder) else read_sweep(source)
    if tracking_uri is None:
        raise SpecError(f"{source}: not a folder; for an MLflow run id give --tracking-uri")
    work = work or Path(tempfile.mkdtemp(prefix="specray-export-"))
    return read_tune_run(source, tracking_uri, work) or read_sweep(source, tracking_uri, work)


def is_tune_folder(folder: Path) -> bool:
    """`<output_dir>/<name>/tune` (its state file) or the report folder inside it."""
    report = folder.name == TUNE_REPORT and (folder.parent / TUNE_STATE).is_file()
    return report or (folder / TUNE_STATE).is_file()


def read_tune_folder(folder: Path) -> SweepResults:
    """A tune run from its folder: its full-budget drafts where they were published."""
    from specray.distill.checkpoints import is_finished

    report = folder if folder.name == TUNE_REPORT else folder / TUNE_REPORT
    drafts, parent = _drafts(report, str(folder))
    missing = [d.name for d in drafts if not is_finished(d.folder, d.key)]
    if missing:
        raise SpecError(f"{folder}: draft {missing[0]} is not in {drafts[0].folder.parent} any more")
    spec, cells, cost = _records(report, drafts)
    dirs = {draft.key: draft.folder for draft in drafts}
    return SweepResults(spec, cells, cost, dirs, str(folder), parent or None)


def read_tune_run(run_id: str, tracking_uri: str, work: Path) -> SweepResults | None:
    """A tune run from its MLflow parent run (None when the run is not a tune's): the drafts' weights are
    downloaded from their child runs, as each is chosen."""
    from specray.tracking.client import open_tracker
    from specray.tracking.fetch import fetch_tune_report

    found = fetch_tune_report(tracking_uri, run_id, work / "records")
    if found is None:
        return None
    report, experiment = found
    drafts, _ = _drafts(report, f"run {run_id}")
    spec, cells, cost = _records(report, drafts)
    tracker = open_tracker(tracking_uri, experiment)

    def fetch(key: str) -> Path:
        return tracker.download_draft(run_id, key, work / "drafts" / key)

    dirs = DraftDirs((draft.key for draft in drafts), fetch)
    return SweepResults(spec, cells, cost, dirs, f"mlflow:{run_id}", run_id)


def tune_drafts(folder: Path) -> list[Draft]:
    """The drafts Table 3 compares, from a tune folder, its report folder, or fetched records."""
    report = folder / TUNE_REPORT if (folder / TUNE_REPORT).is_dir() else folder
    return _drafts(report, str(folder))[0]


def _drafts(report: Path, source: str) -> tuple[list[Draft], str]:
    """The drafts Table 3 compares and the tune's parent run id; the one-line refusal without them."""
    path = report / TUNE_DRAFTS
    if not path.is_file():
        raise SpecError(
            f"{source}: a `specray tune` run without retrained drafts (no {TUNE_REPORT}/{TUNE_DRAFTS}); the "
            "export serves Table 3's drafts retrained at tune.final_steps: finish the run with `specray tune "
            "SPEC --resume`"
        )
    payload = json.loads(path.read_text())
    try:
        drafts = [Draft.from_json(d) for d in payload["drafts"]]
    except OlderFormat:
        raise SpecError(older_format_line(source, "run the tune again to recompute it")) from None
    return drafts, str(payload.get("parent_run_id") or "")


def _records(report: Path, drafts: list[Draft]) -> tuple[SweepSpec, list[CellRecord], StepCosts]:
    """The tune's spec, its drafts' test-set cells and the step costs those cells used."""
    spec = load_spec(report / TUNE_SPEC)
    names = {draft.name for draft in drafts}
    rows = json.loads((report / TUNE_CELLS_FILE).read_text())
    cells = [
        CellRecord.from_flat({k: v for k, v in row.items() if k not in REPORT_ONLY})
        for row in rows
        if row["draft"] in names and row["test_set"] in spec.eval.test_sets
    ]
    cost = StepCosts.from_json(json.loads((report / TUNE_STEP_COSTS).read_text()))
    return spec, cells, cost
