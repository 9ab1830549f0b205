"""A finished sweep, read for export: its spec, the cells of its current settings, c, and its drafts.

From an output folder (`outputs/<sweep>`): the spec is the folder's `spec.yaml` (written by `specray run`);
the current cells are exactly those whose keys the spec gives today (`sweep.plan`, `specdec.cells`) —
records of earlier settings in `cells/` are never used — and every one must be there (else the sweep is not
finished). From an MLflow parent run id: the run's `spec.yaml` and the records it logged when it finished
(`records/cells.json`, `records/step_costs.json`: the cells of that run's spec), and each draft's weights
from its child run's `draft` artifact.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specray.config import SweepSpec, load_spec
from specray.errors import SpecError
from specray.names import BASELINE, TUNE_DIR, TUNE_STATE
from specray.specdec.records import CellRecord, StepCosts


class DraftDirs(Mapping[str, Path]):
    """Draft key -> its HF folder (weights, tokenizer, and for a distilled draft its `finished.json` with the
    recipe), fetched on first use: an export downloads only the drafts it chose."""

    def __init__(self, keys: Iterable[str], fetch: Callable[[str], Path]):
        self.keys_, self.fetch = sorted(set(keys)), fetch
        self.found: dict[str, Path] = {}

    def __getitem__(self, key: str) -> Path:
        if key not in self.keys_:
            raise KeyError(key)
        if key not in self.found:
            self.found[key] = self.fetch(key)
        return self.found[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys_)

    def __len__(self) -> int:
        return len(self.keys_)


@dataclass(frozen=True)
class SweepResults:
    """What an export reads."""

    spec: SweepSpec
    cells: list[CellRecord]
    cost: StepCosts
    draft_dirs: Mapping[str, Path]
    source: str  # the folder or `mlflow:<run id>`
    parent_run_id: str | None = None


def read_sweep(source: str, tracking_uri: str | None = None, work: Path | None = None) -> SweepResults:
    """A sweep from its output folder, or from its MLflow parent run id (at `tracking_uri`)."""
    folder = Path(source)
    if folder.is_dir():
        return read_folder(folder)
    if tracking_uri is None:
        raise SpecError(f"{source}: not a folder; for an MLflow run id give --tracking-uri")
    return read_run(source, tracking_uri, work or Path(tempfile.mkdtemp(prefix="specray-export-")))


def read_folder(folder: Path) -> SweepResults:
    """The current cells, c and drafts of the sweep whose output folder this is."""
    from specray.garden.plan import require_sweep
    from specray.models.sources import resolve_model_path
    from specray.sweep.plan import SPEC_FILE, plan_sweep
    from specray.sweep.survey import CELLS_DIR, read_cells, survey

    if not (folder / SPEC_FILE).is_file():
        if (folder / TUNE_DIR / TUNE_STATE).is_file():  # the folder above a `specray tune` run's own
            raise SpecError(
                f"{folder} holds a `specray tune` run, not a sweep: give its tune folder, {folder / TUNE_DIR}"
            )
        raise SpecError(f"{folder}: no {SPEC_FILE}; run `specray run` on its sweep once more to write it")
    spec = load_spec(folder / SPEC_FILE)
    require_sweep(spec, f"specray export {folder}")
    plan = plan_sweep(spec)
    found = survey(plan)
    if found.step_costs is None or found.drafts_todo:
        raise SpecError(f"{folder}: the sweep is not finished ({'; '.join(found.lines())}); finish it first")
    jobs = plan.cell_jobs(found.step_costs)
    saved = read_cells(folder / CELLS_DIR)
    missing = [job.label for job in jobs if job.key not in saved]
    if missing:
        raise SpecError(
            f"{folder}: {len(missing)} cells of the current settings are missing (e.g. {missing[0]})"
        )
    resolve_model_path(spec.models.draft, spec.models)  # the un-distilled draft: the zoo's, if it is one
    dirs = {draft.key: Path(draft.folder) for draft in plan.evaluated}
    return SweepResults(spec, [saved[job.key] for job in jobs], found.step_costs, dirs, str(folder))


def read_run(run_id: str, tracking_uri: str, work: Path) -> SweepResults:
    """The sweep a finished MLflow parent run recorded; its drafts' weights are downloaded into `work`."""
    from specray.models.sources import resolve_model_path
    from specray.tracking.client import open_tracker
    from specray.tracking.fetch import fetch_sweep_records

    records = fetch_sweep_records(tracking_uri, run_id, work / "records")
    if "step_costs" not in records or "cells" not in records:
        raise SpecError(
            f"run {run_id} holds no records/cells.json or step_costs.json: the sweep did not finish, or "
            "an older specray ran it (run the sweep again to record its step costs)"
        )
    tracker = open_tracker(tracking_uri, records["experiment"])
    spec_path = tracker.download(run_id, "spec.yaml", work)
    spec = load_spec(spec_path)
    cells: list[CellRecord] = records["cells"]
    baseline = {c.draft_key for c in cells if c.draft == BASELINE}

    def fetch(key: str) -> Path:
        if key in baseline:  # the student itself: no child run holds it
            return Path(resolve_model_path(spec.models.draft, spec.models))
        return tracker.download_draft(run_id, key, work / "drafts" / key)

    dirs = DraftDirs((c.draft_key for c in cells), fetch)
    cost = StepCosts.from_json(records["step_costs"])
    return SweepResults(spec, cells, cost, dirs, f"mlflow:{run_id}", run_id)


def draft_recipe(folder: Path) -> dict[str, Any]:
    """The KD recipe a distilled draft was trained with (its completion marker's key inputs); {} for the
    un-distilled student."""
    from specray.distill.checkpoints import FINISHED_FILE, read_finished

    if not (folder / FINISHED_FILE).is_file():
        return {}
    return dict(read_finished(folder).key_inputs)


def copy_draft(source: Path, destination: Path) -> None:
    """The draft's HF files into `destination`: weights hard-linked where the file system allows (else
    copied), everything else copied; the sweep's own files (marker, curves, spec) left out."""
    skipped = {"finished.json", "curves.json", "spec.yaml", "trainer_state.pt", "fingerprint.txt"}
    destination.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.is_dir() or path.name in skipped:
            continue
        target = destination / path.name
        target.unlink(missing_ok=True)
        if path.suffix == ".safetensors":
            try:
                target.hardlink_to(path)
                continue
            except OSError:  # another file system, or links not allowed: a copy is the same bytes
                pass
        shutil.copy2(path, target)
