"""What of a sweep's plan is already on disk: per stage, how many units are reused and how many will be
computed, and why (`specray run` prints it before any work; `--dry-run` prints only that). Reads the
drafts' completion markers, the saved step costs and cell records; loads no model, starts nothing.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specray.config import SweepSpec
from specray.data.shards import is_complete
from specray.distill.checkpoints import DAMAGED, FINISHED_FILE, FinishedDraft, damaged_weights, read_finished
from specray.draft import Draft
from specray.keys import OlderFormat, curve_inputs, describe_change, older_format_line
from specray.specdec.cells import fixed_step_costs
from specray.specdec.records import CellRecord, EvalJob, StepCosts
from specray.sweep.plan import SweepPlan, other_sweeps

log = logging.getLogger(__name__)
OLDER_FORMAT = "written by an older specray format"  # a reason the plan gives

STEP_COSTS_DIR = "step_costs"  # one <key>.json per timed grid: switching back reuses it
CELLS_DIR = "cells"  # one <key>.json per evaluated cell
UNREADABLE = "unreadable (truncated or corrupt)"  # a saved file that does not parse


@dataclass
class Survey:
    """The plan against the disk: per stage what is reused and what will be computed, the drafts to train
    and the step costs when they are known (fixed, or measured under the plan's key)."""

    stages: list[StagePlan]
    drafts_todo: list[Draft]
    step_costs: StepCosts | None  # None: to be measured
    cells: dict[str, CellRecord] = field(default_factory=dict)  # every record saved in the cells folder

    def lines(self) -> list[str]:
        return [stage.line() for stage in self.stages]

    @property
    def finished(self) -> bool:
        """Whether nothing is left to compute."""
        return all(stage.todo == 0 for stage in self.stages)


def survey(plan: SweepPlan) -> Survey:
    """What `run_sweep` will reuse and compute for `plan`."""
    keys = [key for sample in plan.shards for key in sample.keys.values()]
    done = sum(is_complete(key) for key in keys)
    shards = StagePlan("teacher shards", reused=done, todo=len(keys) - done)
    if shards.todo:
        shards.reasons["not generated yet"] += shards.todo
    draft_plan, drafts_todo = draft_stage(plan.spec, plan.drafts)
    cost_plan, cost = step_costs_stage(plan)
    folder = plan.folder / CELLS_DIR
    saved = read_cells(folder)
    jobs = plan.cell_jobs(cost)
    saved |= other_sweeps_cells(plan, {job.key for job in jobs} - set(saved))
    cells_plan, _ = cell_stage(jobs, saved, folder)
    if cost is None and cells_plan.todo:
        cells_plan.note = "analytic cells are keyed by the step costs, which are measured first"
    return Survey([shards, draft_plan, cost_plan, cells_plan], drafts_todo, cost, saved)


@dataclass
class StagePlan:
    """One stage: how many units are reused and how many will be computed, with the reasons."""

    stage: str
    reused: int = 0
    todo: int = 0
    reasons: Counter = field(default_factory=Counter)
    note: str = ""

    def line(self) -> str:
        why = "; ".join(
            f"{reason}" + (f" ×{n}" if n > 1 else "") for reason, n in self.reasons.most_common(3)
        )
        more = len(self.reasons) - 3
        why += f"; {more} other reasons" if more > 0 else ""
        counts = f"{self.reused} reused, {self.todo} to compute" + (f" ({why})" if self.todo and why else "")
        return f"{self.stage:15s} {counts}" + (f"; {self.note}" if self.note else "")


def draft_stage(spec: SweepSpec, drafts: Sequence[Draft]) -> tuple[StagePlan, list[Draft]]:
    """Drafts finished under their current key are reused; the others are trained (returned)."""
    stage, todo = StagePlan("drafts"), []
    stale_curves = 0
    for draft in drafts:
        marker, older = FinishedDraft(), False
        try:
            if (draft.folder / FINISHED_FILE).is_file():
                marker = read_finished(draft.folder)
        except OlderFormat:
            log.warning("%s", older_format_line(draft.folder, "trained again"))
            older = True
        same_key = marker.fingerprint == draft.key
        if same_key and not damaged_weights(draft.folder):
            stage.reused += 1
            stale_curves += marker.curve_inputs != curve_inputs(spec)
            continue
        stage.todo += 1
        why = OLDER_FORMAT if older else describe_change(marker.key_inputs, draft.key_inputs)
        stage.reasons[f"retrain ({DAMAGED})" if same_key else why] += 1
        todo.append(draft)
    if stale_curves:
        stage.note = (
            f"{stale_curves} reused drafts recorded their acceptance-vs-step curves under other probe "
            "settings (eval.temperatures, eval.max_new_tokens, eval.seed, distill.report_every)"
        )
    return stage, todo


def read_cells(folder: Path) -> dict[str, CellRecord]:
    """Every cell record saved in `folder`, by key (records of earlier settings included); records of an
    older format are left where they are, with one line for the folder, and their cells computed again."""
    cells, older = {}, 0
    for path in sorted(folder.glob("*.json")):
        try:
            record = CellRecord.from_json(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ignoring %s: %s; its cell is computed again", path, UNREADABLE)
            continue
        except OlderFormat:
            older += 1
            continue
        cells[record.key] = record
    if older:
        log.warning("%s", older_format_line(folder, f"its {older} cell records are not read; recomputed"))
    return cells


def other_sweeps_cells(plan: SweepPlan, keys: set[str]) -> dict[str, CellRecord]:
    """The records of cells under `keys` that other sweeps under the same output directory saved (the
    study reuses the demo's cells so; the run copies them into its own folder as it reuses them)."""
    found: dict[str, CellRecord] = {}
    for other in other_sweeps(plan.folder) if keys else []:
        if (other / CELLS_DIR).is_dir():
            found |= {key: record for key, record in read_cells(other / CELLS_DIR).items() if key in keys}
    return found


def cell_stage(
    jobs: Sequence[EvalJob], saved: Mapping[str, CellRecord], folder: Path | None = None
) -> tuple[StagePlan, list[EvalJob]]:
    """Cells whose key has a saved record are reused; the others are evaluated (returned), each with the
    difference to the closest earlier record of the same draft, test set, τ_dec and estimator, or, when
    `folder` holds a file under the cell's own key that did not parse, as unreadable."""
    stage, todo = StagePlan("cells"), []
    earlier: dict[tuple, list[CellRecord]] = {}
    for record in saved.values():
        earlier.setdefault((record.draft, record.test_set, record.tau_dec, record.estimator), []).append(
            record
        )
    for job in jobs:
        if job.key in saved:
            stage.reused += 1
            continue
        stage.todo += 1
        todo.append(job)
        if folder is not None and (folder / f"{job.key}.json").exists():  # its record, but damaged
            stage.reasons[UNREADABLE] += 1
            continue
        candidates = earlier.get((job.draft, job.test_set, job.tau_dec, job.estimator), [])
        stage.reasons[_closest_change(candidates, job.key_inputs)] += 1
    return stage, todo


def _closest_change(candidates: Sequence[CellRecord], inputs: Mapping[str, Any]) -> str:
    if not candidates:
        return "new"

    def differences(record: CellRecord) -> int:
        return sum(record.key_inputs.get(k) != v for k, v in inputs.items())

    closest = min(candidates, key=differences).key_inputs
    if closest.get("draft") != inputs.get("draft"):
        return "the draft changed"
    return describe_change(closest, inputs)


def step_costs_stage(plan: SweepPlan) -> tuple[StagePlan, StepCosts | None]:
    """The step costs: fixed by the spec's c, reused when measured under the same key in this sweep (or in
    another under the same output directory), or to measure."""
    stage, spec, out = StagePlan("step costs"), plan.spec, plan.folder
    if spec.eval.draft_cost_ratio is not None:
        stage.note = f"c fixed at {spec.eval.draft_cost_ratio:g} (eval.draft_cost_ratio)"
        return stage, fixed_step_costs(spec.eval)
    inputs = plan.step_costs_inputs
    mine = read_step_costs(out, plan.step_costs_key)
    theirs = (read_step_costs(other, plan.step_costs_key) for other in other_sweeps(out))
    saved = mine or next((costs for costs in theirs if costs is not None), None)
    if saved is not None:  # another sweep's under the same key: the run copies them into its own folder
        stage.reused, stage.note = 1, saved.describe()
        return stage, saved
    stage.todo = 1
    latest = _latest_step_costs(out)
    stage.reasons["new" if latest is None else describe_change(latest.key_inputs, inputs)] += 1
    return stage, None


def step_costs_file(out: Path, key: str) -> Path:
    return out / STEP_COSTS_DIR / f"{key}.json"


def read_step_costs(out: Path, key: str) -> StepCosts | None:
    """The step costs this sweep timed under `key`, if it did (a damaged file is timed again)."""
    path = step_costs_file(out, key)
    try:
        return StepCosts.from_json(json.loads(path.read_text())) if path.exists() else None
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
        log.warning("ignoring %s: %s; the step costs are timed again", path, UNREADABLE)
        return None


def _latest_step_costs(out: Path) -> StepCosts | None:
    """The most recently timed step costs of this sweep under any key (to say what changed)."""
    paths = sorted((out / STEP_COSTS_DIR).glob("*.json"), key=lambda p: p.stat().st_mtime)
    for path in reversed(paths):
        try:
            return StepCosts.from_json(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            continue
    return None
