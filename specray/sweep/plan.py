"""What a sweep will produce and what of it is already there: the drafts (with their content keys), and a
plan per stage of what is reused and what will be computed, and why.

Pure planning: names, keys, folders and a look at what is on disk; nothing runs here.
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
from specray.config.presets import source_name
from specray.distill.checkpoints import (
    DAMAGED,
    FINISHED_FILE,
    FinishedDraft,
    damaged_weights,
    draft_inputs,
    read_finished,
)
from specray.distill.inputs import draft_folder_name, draft_name, replicate_name, variant_name
from specray.keys import cost_ratio_inputs, curve_inputs, describe_change, digest, draft_key_inputs
from specray.names import BASELINE
from specray.specdec.cells import DraftRef, fixed_step_costs
from specray.specdec.records import CellRecord, EvalJob, StepCosts

log = logging.getLogger(__name__)

STEP_COSTS_DIR = "step_costs"  # one <key>.json per timed grid: switching back reuses it
UNREADABLE = "unreadable (truncated or corrupt)"  # a saved file that does not parse
SPEC_FILE = "spec.yaml"  # the resolved spec of the sweep's last run, in its output folder


@dataclass(frozen=True)
class DraftPlan:
    name: str  # offline/tau_kd=0.6, online/mix=0.7:1,0.8:1, or non-distill
    paradigm: str | None  # None for the un-distilled baseline
    mixture: dict[float, float]  # {} for the baseline
    output_dir: Path
    key: str = ""
    key_inputs: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    replicate: int = 0  # training replicate (distill.replicates); 0 for the baseline
    # online drafts: the divergence and data source (`source_name`) they train with, DistillSpec's grid
    # axes; "" for offline drafts (SeqKD on the shards) and the baseline
    divergence: str = ""
    data_source: str = ""

    @property
    def recipe(self) -> str:
        """The draft's name without its replicate: what the report averages replicates over."""
        suffix = f"/r{self.replicate}"
        return self.name.removesuffix(suffix) if self.replicate else self.name

    @property
    def tau_kd(self) -> float | None:
        """The single τ_kd of a one-temperature recipe (None for mixtures and the baseline)."""
        return next(iter(self.mixture)) if len(self.mixture) == 1 else None

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags the UI can filter on."""
        mixture = ",".join(f"{t:g}:{w:g}" for t, w in sorted(self.mixture.items()))
        tau_kd = "" if self.tau_kd is None else f"{self.tau_kd:g}"
        tags = {"paradigm": self.paradigm or "none", "tau_kd": tau_kd, "mixture": mixture}
        tags |= {"divergence": self.divergence, "data_source": self.data_source}
        return tags | {"replicate": str(self.replicate)}

    @property
    def info(self) -> dict:
        """What the report needs to place this draft in the figures (and average its replicates)."""
        place = {"paradigm": self.paradigm, "tau_kd": self.tau_kd, "mixture": self.tags["mixture"]}
        place |= {"divergence": self.divergence, "data_source": self.data_source}
        return place | {"recipe": self.recipe, "replicate": self.replicate}

    @property
    def variant(self) -> tuple[str, str]:
        """(divergence, data source) a Train job needs to derive this draft's spec (`SweepSpec.for_draft`)."""
        return self.divergence, self.data_source

    @property
    def ref(self) -> DraftRef:
        return DraftRef(self.name, str(self.output_dir), self.key, self.tau_kd)


def sweep_dir(spec: SweepSpec) -> Path:
    return Path(spec.output_dir) / spec.name


def plan_drafts(spec: SweepSpec) -> list[DraftPlan]:
    """Every distilled draft of the sweep, in a stable order (replicate, then paradigm, then τ_kd, then
    mixtures, then divergence and data source): replicate 0 of every recipe first, so a sweep stopped early
    has one draft of each. Online drafts are one per (divergence, data source) of DistillSpec's grid;
    offline drafts stay one per recipe (SeqKD on the shards)."""
    root = sweep_dir(spec) / "drafts"
    plans = []
    for replicate in range(spec.distill.replicates):
        for paradigm in spec.distill.paradigms:
            recipes = [{tau: 1.0} for tau in spec.teacher.temperatures]
            recipes += [dict(m.weights) for m in spec.distill.mixtures]
            for mixture in recipes:
                for divergence, data_source in variants(spec, paradigm):
                    plans.append(
                        _draft_plan(spec, root, paradigm, mixture, replicate, divergence, data_source)
                    )
    return plans


def variants(spec: SweepSpec, paradigm: str) -> list[tuple[str, str]]:
    """The (divergence, data source name) of each draft of `paradigm` per recipe; ("", "") for offline."""
    if paradigm != "online":
        return [("", "")]
    d = spec.distill
    return [(div, source_name(src)) for div in d.divergences for src in d.data_source_list]


def _draft_plan(
    spec: SweepSpec,
    root: Path,
    paradigm: str,
    mixture: dict[float, float],
    replicate: int,
    divergence: str,
    data_source: str,
) -> DraftPlan:
    d = spec.distill
    varied = (divergence if d.varies_divergence else "", data_source if d.varies_data_source else "")
    name = replicate_name(variant_name(draft_name(paradigm, mixture), *varied), replicate)
    inputs = draft_inputs(spec.for_draft(paradigm, replicate, divergence, data_source), paradigm, mixture)
    folder = root / draft_folder_name(name)
    return DraftPlan(
        name, paradigm, mixture, folder, digest(inputs), inputs, replicate, divergence, data_source
    )


def shard_specs(spec: SweepSpec) -> list[SweepSpec]:
    """The specs whose teacher shards the drafts train from: the sweep's own, and with
    `teacher.replicate_shards` one per training replicate (each sampled with its own teacher.seed)."""
    if not spec.teacher.replicate_shards:
        return [spec]
    return [spec.for_replicate(r) for r in range(spec.distill.replicates)]


def baseline_plan(spec: SweepSpec, draft_path: str) -> DraftPlan:
    """The un-distilled draft, evaluated like every other one."""
    inputs = draft_key_inputs(spec, None, {}, {})
    return DraftPlan(BASELINE, None, {}, Path(draft_path), digest(inputs), inputs)


# ---------------------------------------------------------------- what is reused, what is computed


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


def draft_stage(spec: SweepSpec, plans: Sequence[DraftPlan]) -> tuple[StagePlan, list[DraftPlan]]:
    """Drafts finished under their current key are reused; the others are trained (returned)."""
    stage, todo = StagePlan("drafts"), []
    stale_curves = 0
    for plan in plans:
        finished = (plan.output_dir / FINISHED_FILE).is_file()
        marker = read_finished(plan.output_dir) if finished else FinishedDraft()
        same_key = marker.fingerprint == plan.key
        if same_key and not damaged_weights(plan.output_dir):
            stage.reused += 1
            stale_curves += marker.curve_inputs != curve_inputs(spec)
            continue
        stage.todo += 1
        why = describe_change(marker.key_inputs, plan.key_inputs)
        stage.reasons[f"retrain ({DAMAGED})" if same_key else why] += 1
        todo.append(plan)
    if stale_curves:
        stage.note = (
            f"{stale_curves} reused drafts recorded their acceptance-vs-step curves under other probe "
            "settings (eval.temperatures, eval.max_new_tokens, eval.seed, distill.report_every)"
        )
    return stage, todo


def read_cells(folder: Path) -> dict[str, CellRecord]:
    """Every cell record saved in `folder`, by key (records of earlier settings included)."""
    cells = {}
    for path in sorted(folder.glob("*.json")):
        try:
            record = CellRecord.from_json(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError):
            log.warning("ignoring %s: %s; its cell is computed again", path, UNREADABLE)
            continue
        except TypeError:
            log.warning("ignoring %s: not a cell record of this specray version", path)
            continue
        cells[record.key] = record
    return cells


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


def step_costs_stage(spec: SweepSpec, out: Path) -> tuple[StagePlan, StepCosts | None]:
    """The step costs: fixed by the spec's c, reused when measured under the same key in this sweep, or
    to measure."""
    stage = StagePlan("step costs")
    if spec.eval.draft_cost_ratio is not None:
        stage.note = f"c fixed at {spec.eval.draft_cost_ratio:g} (eval.draft_cost_ratio)"
        return stage, fixed_step_costs(spec.eval)
    inputs = cost_ratio_inputs(spec)
    saved = read_step_costs(out, digest(inputs))
    if saved is not None:
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
