"""Checkpoints and the published draft, on disk.

A checkpoint is an HF model dir (safetensors + tokenizer) plus `trainer_state.pt` (optimizer, scheduler,
step, RNG state, the curves so far) and `curves.json`; any checkpoint loads as a draft as it is.

The published draft `output_dir` is the last checkpoint without the trainer state, plus the resolved spec
(`spec.yaml`). It is assembled in a temporary folder beside `output_dir`, renamed into place, and only then
is the completion marker `finished.json` written (atomically). So a crash at any point leaves either no
`output_dir` or one without the marker — never a half model that looks finished. The marker records the
SHA-256 of every weight file, so weights damaged after publication (a partial copy, a full disk during a
sync) are not taken for a finished draft: such a folder is kept aside under a name that says so, and the
draft is trained again. Work in progress
(checkpoints, Ray Train's run folder) lives in `.<name>.work` beside `output_dir`, tagged with the run's
fingerprint so a changed spec never resumes from a stale checkpoint; it is removed once the draft is
published.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specray.config import SweepSpec, dump_spec
from specray.distill.curves import CurvePoint, curves_from_json, curves_to_json
from specray.files import file_sha256, write_atomic
from specray.keys.format import FORMAT, FORMAT_VERSION, OlderFormat, check_format

if TYPE_CHECKING:  # transformers' model code loads where a model does, not where a type is named
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TRAINER_STATE, CURVES_FILE, SPEC_FILE, FINISHED_FILE = (
    "trainer_state.pt",
    "curves.json",
    "spec.yaml",
    "finished.json",
)
FINGERPRINT_FILE = "fingerprint.txt"
DAMAGED = "weights differ from finished.json"

log = logging.getLogger(__name__)


@dataclass
class RunState:
    """The run's own part of a checkpoint's trainer state (beside the optimizer's, the scheduler's and the
    RNG's): the loop updates it at every report."""

    fingerprint: str  # the draft key: a checkpoint resumes only into a run with the same one
    step: int = 0
    curves: list[CurvePoint] = field(default_factory=list)
    resumed_from: list[int] = field(default_factory=list)  # the steps of the checkpoints resumed from

    def to_json(self) -> dict[str, Any]:
        """Plain data only (the trainer state loads with weights_only), in the keys it was always saved as."""
        curves = curves_to_json(self.curves)
        return {"step": self.step, "curves": curves, "resumed_from": list(self.resumed_from)} | {
            "fingerprint": self.fingerprint
        }

    @classmethod
    def from_json(cls, saved: Mapping[str, Any]) -> RunState:
        """From a loaded trainer state (its optimizer, scheduler and RNG entries are not read here)."""
        curves = curves_from_json(saved["curves"])
        return cls(saved["fingerprint"], int(saved["step"]), curves, [int(s) for s in saved["resumed_from"]])


@dataclass(frozen=True)
class FinishedDraft:
    """The completion marker `finished.json`, written last: which draft this is and what made it."""

    draft: str = ""
    paradigm: str = ""
    mixture: dict[str, float] = field(default_factory=dict)  # τ_kd written with :g -> weight
    steps: int = 0
    resumed_from: list[int] = field(default_factory=list)
    fingerprint: str = ""  # the draft key (`fingerprint`)
    key_inputs: dict[str, Any] = field(default_factory=dict)  # what it was made from: the plan's "why"
    curve_inputs: dict[str, Any] = field(default_factory=dict)  # what its curves were recorded under
    seconds: float = math.nan
    # weight file name -> SHA-256, filled in by `publish` as it writes the marker
    weights_sha256: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {FORMAT: FORMAT_VERSION}

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> FinishedDraft:
        """A marker as `to_json` wrote it; `keys.OlderFormat` for one of another format (trained again)."""
        return cls(**check_format(payload, cls))


def work_dir(output_dir: Path) -> Path:
    return output_dir.parent / f".{output_dir.name}.work"


def claim_work_dir(output_dir: Path, run_fingerprint: str) -> Path:
    """The work folder of `output_dir`, emptied first if it belongs to a different run."""
    folder = work_dir(output_dir)
    tag = folder / FINGERPRINT_FILE
    if folder.exists() and (not tag.exists() or tag.read_text().strip() != run_fingerprint):
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tag.write_text(run_fingerprint)
    return folder


def save_checkpoint(
    folder: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, state: dict[str, Any]
) -> None:
    """Write one checkpoint into `folder` (which exists); `state` is plain data (`RunState.to_json` and the
    optimizer's, scheduler's and RNG's states); its curves also go to curves.json."""
    model.save_pretrained(folder)  # safetensors
    tokenizer.save_pretrained(folder)
    torch.save(state, folder / TRAINER_STATE)
    (folder / CURVES_FILE).write_text(json.dumps(state["curves"], indent=1))
    (folder / FINGERPRINT_FILE).write_text(state["fingerprint"])  # whose checkpoint, without loading it


def checkpoint_key(folder: Path) -> str:
    """The draft key a checkpoint was written under (read from its trainer state where no tag was kept)."""
    tag = folder / FINGERPRINT_FILE
    return tag.read_text().strip() if tag.is_file() else load_trainer_state(folder)["fingerprint"]


def load_trainer_state(folder: Path) -> dict[str, Any]:
    # weights_only: tensors, numbers, strings and containers only — no pickled code runs on load
    return torch.load(folder / TRAINER_STATE, map_location="cpu", weights_only=True)


def read_curves(folder: Path) -> list[CurvePoint]:
    return curves_from_json(json.loads((folder / CURVES_FILE).read_text()))


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def publish(checkpoint: Path, output_dir: Path, spec: SweepSpec, info: FinishedDraft) -> None:
    """Turn the final checkpoint into the draft at `output_dir`; the marker (with `info`) comes last."""
    tmp = output_dir.parent / f".{output_dir.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        shutil.copytree(checkpoint, tmp, ignore=shutil.ignore_patterns(TRAINER_STATE, FINGERPRINT_FILE))
        (tmp / SPEC_FILE).write_text(dump_spec(spec))
        _fsync_tree(tmp)  # the data must be on disk before the name points at it
        if output_dir.exists():  # an unfinished leftover, or an older draft being replaced
            shutil.rmtree(output_dir)
        os.replace(tmp, output_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    marker = json.dumps(
        replace(info, weights_sha256=weight_checksums(output_dir)).to_json(), indent=2, sort_keys=True
    )
    write_atomic(output_dir / FINISHED_FILE, lambda path: path.write_text(marker))


def weight_checksums(folder: Path) -> dict[str, str]:
    """SHA-256 of each weight file of a model folder (`*.safetensors` and a sharded model's index)."""
    return {path.name: file_sha256(path) for path in sorted(folder.glob("*.safetensors*"))}


def damaged_weights(output_dir: Path) -> list[str]:
    """The weight files of a finished draft that are missing or differ from its marker's checksums."""
    expected = read_finished(output_dir).weights_sha256
    found = weight_checksums(output_dir)
    return sorted(name for name in expected.keys() | found.keys() if expected.get(name) != found.get(name))


def is_finished(output_dir: str | os.PathLike, key: str | None = None) -> bool:
    """True once the draft at `output_dir` is complete (its marker is written last) with the weights its
    marker recorded and, when `key` is given, was trained under that draft key (a draft of other settings
    is never reused)."""
    folder = Path(output_dir)
    if not (folder / FINISHED_FILE).is_file():
        return False
    try:
        if key is not None and read_finished(folder).fingerprint != key:
            return False
    except OlderFormat:  # trained again in its place (`sweep/survey.py` says so when it plans)
        return False
    return not damaged_weights(folder)


def set_aside_damaged(output_dir: Path) -> Path | None:
    """Rename a finished draft whose weights differ from its marker to `<name>.damaged-<UTC time>` beside
    it (never deleted: it may be the only copy of a long training), so it is trained again in its place."""
    if not (output_dir / FINISHED_FILE).is_file():
        return None
    try:
        damaged = damaged_weights(output_dir)
    except OlderFormat:  # not damaged: an older format's draft, replaced when it is trained again
        return None
    if not damaged:
        return None
    aside = output_dir.with_name(f"{output_dir.name}.damaged-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
    os.replace(output_dir, aside)
    log.warning(
        "%s: %s (%s); kept aside as %s, training it again", output_dir, DAMAGED, ", ".join(damaged), aside
    )
    return aside


def read_finished(output_dir: Path) -> FinishedDraft:
    return FinishedDraft.from_json(json.loads((output_dir / FINISHED_FILE).read_text()))
