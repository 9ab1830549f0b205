"""What the MLflow UI shows about a sweep, from the spec and the plan's records (calls: `client.py`):
the datasets each run used, with their content keys as digests; a finished draft as a model with its KD
recipe; run names and descriptions a person reads; and the saved runs view with the columns a user compares.

Datasets: the train prompts (the teacher's input), one teacher shard per τ_kd (its shard key: the same key
the Parquet cache uses) and the test sets (the fingerprint of their prompts' token ids). The parent run of
a sweep lists them all; a draft's run its shard(s) and the test sets; the un-distilled draft's the test sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specray.metrics import ACCEPTANCE_RATE, SPEEDUP_MODEL
from specray.tracking.names import cell_key

if TYPE_CHECKING:
    from specray.config import SweepSpec
    from specray.draft import Draft

DRAFTS_VIEW = "specray-drafts"  # the saved runs view's id (stable: a re-run replaces it)
EXPERIMENT_NOTE = (  # MLflow 3.17 shows its first line on every page of the experiment (GenAI ones too)
    "To compare the drafts: **Model training** (sidebar) → Runs → Views → **specray: drafts**. "
    "One parent run per sweep, one child run per draft; each draft's model is under **Models**."
)


@dataclass(frozen=True)
class DatasetRef:
    """A dataset as a run's input: `digest` is its content key (a shard key, a split's fingerprint)."""

    name: str
    digest: str
    context: str  # generation | training | evaluation
    source: str  # where it lives: a folder, a file, or how it is made
    rows: int
    source_type: str = "local"


@dataclass(frozen=True)
class DraftModel:
    """A finished draft as a logged model: its HF folder, and the KD recipe its draft key hashes."""

    draft: str  # offline/tau_kd=0.6
    key: str  # the draft key
    folder: Path
    recipe: Mapping[str, Any]
    tags: Mapping[str, str]


@dataclass(frozen=True)
class RunsView:
    """A saved runs view; `columns` as the UI names them, e.g. metrics.`speedup_model/in_domain/tau_dec_1`."""

    view_id: str
    name: str
    columns: tuple[str, ...]
    order_by: str


# ---------------------------------------------------------------- datasets


@dataclass(frozen=True)
class SweepData:
    train: DatasetRef
    shards: dict[float, DatasetRef]  # by τ_kd
    tests: tuple[DatasetRef, ...]

    def datasets(self) -> list[DatasetRef]:
        """Every dataset of the sweep: the train split, each τ_kd shard, each test set."""
        return [self.train, *self.shards.values(), *self.tests]

    def for_draft(self, mixture: Mapping[float, float]) -> list[DatasetRef]:
        """What a draft used: the shards of its τ_kd (or mixture) and the test sets it is evaluated on."""
        shards = [self.shards[float(tau)] for tau in sorted(mixture) if float(tau) in self.shards]
        return [*shards, *self.tests]


# ---------------------------------------------------------------- models, names and descriptions


def draft_model(draft: Draft) -> DraftModel:
    """A finished draft's logged model: its folder, and what its draft key hashes as the KD recipe."""
    return DraftModel(draft.name, draft.key, draft.folder, dict(draft.key_inputs), draft.tags)


def sweep_note(spec: SweepSpec, drafts: int) -> str:
    """The parent run's description (Markdown)."""
    taus = ", ".join(f"{t:g}" for t in spec.teacher.temperatures)
    return (
        f"specray sweep **{spec.name}**: {drafts} drafts distilled ({', '.join(spec.distill.paradigms)}) "
        f"on the teacher's responses at τ_kd ∈ {{{taus}}}, and the un-distilled draft, evaluated at "
        f"{_grid(spec)}. The drafts are this run's child runs (the view *specray: drafts* ranks them); "
        "the report is under Artifacts → `report/report.md`."
    )


def draft_note(spec: SweepSpec, draft: Draft) -> str:
    """A draft run's description (Markdown): what it was trained on and how, and where its results are."""
    if draft.paradigm is None:
        return f"The un-distilled draft (the student as loaded), evaluated like the others at {_grid(spec)}."
    d = spec.distill
    how = (
        "cross-entropy on the teacher's responses (SeqKD)"
        if draft.paradigm == "offline"
        else (
            f"white-box KD, divergence `{draft.divergence or d.divergence}`, data source "
            f"`{draft.data_source or d.data_sources}`, on-policy fraction {d.onpolicy_fraction:g}"
        )
    )
    steps = (draft.spec or spec).distill.steps_for(draft.paradigm)
    data = f"τ_kd={draft.tau_kd:g}" if draft.tau_kd is not None else f"the mixture {draft.tags['mixture']}"
    return (
        f"**{draft.paradigm}** draft trained on the teacher's responses at **{data}** — {how}; "
        f"{steps} steps, lr {d.lr:g}. Evaluated at {_grid(spec)}. The draft is this "
        f"run's logged model (Models); its key `{draft.key}` is the hash of its recipe (the model's params)."
    )


def _grid(spec: SweepSpec) -> str:
    e = spec.eval
    taus = ", ".join(f"{t:g}" for t in e.temperatures)
    gammas = ", ".join(str(g) for g in e.gamma)
    return f"τ_dec ∈ {{{taus}}} on {', '.join(e.test_sets)} (γ {gammas})"


def runs_view(spec: SweepSpec) -> RunsView:
    """The drafts ranked by modelled speedup at the highest τ_dec ≤ 1 on the first test set, with the
    columns a user compares: speedup and acceptance per τ_dec, paradigm, τ_kd, the data and the model."""
    e = spec.eval
    test_set, gamma = e.test_sets[0], e.gamma[0] if len(e.gamma) > 1 else None
    in_range = [t for t in e.temperatures if t <= 1.0] or list(e.temperatures)

    def metric(name: str, tau: float) -> str:
        return f"metrics.`{cell_key(name, test_set, tau, gamma)}`"

    columns = ["attributes.`Models`", "attributes.`Dataset`", "tags.`paradigm`", "tags.`tau_kd`"]
    columns += [metric(SPEEDUP_MODEL, t) for t in e.temperatures]
    columns += [metric(ACCEPTANCE_RATE, t) for t in e.temperatures]
    sort = metric(SPEEDUP_MODEL, max(in_range))
    return RunsView(DRAFTS_VIEW, "specray: drafts", tuple(columns), sort)
