"""What a sweep will produce: one draft per (paradigm, τ_kd) and per named mixture, plus the baseline.

Pure planning: names, tags and folders; nothing runs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specray.config import SweepSpec

BASELINE = "non-distill"


@dataclass(frozen=True)
class DraftPlan:
    name: str  # offline/tau_kd=0.6, online/mix=0.7:1,0.8:1, or non-distill
    paradigm: str | None  # None for the un-distilled baseline
    mixture: dict[float, float]  # {} for the baseline
    output_dir: Path

    @property
    def tau_kd(self) -> float | None:
        """The single τ_kd of a one-temperature recipe (None for mixtures and the baseline)."""
        return next(iter(self.mixture)) if len(self.mixture) == 1 else None

    @property
    def tags(self) -> dict[str, str]:
        """MLflow tags the UI can filter on."""
        mixture = ",".join(f"{t:g}:{w:g}" for t, w in sorted(self.mixture.items()))
        tau_kd = "" if self.tau_kd is None else f"{self.tau_kd:g}"
        return {"paradigm": self.paradigm or "none", "tau_kd": tau_kd, "mixture": mixture}

    @property
    def info(self) -> dict:
        """What the report needs to place this draft in the figures."""
        return {"paradigm": self.paradigm, "tau_kd": self.tau_kd, "mixture": self.tags["mixture"]}


def sweep_dir(spec: SweepSpec) -> Path:
    return Path(spec.output_dir) / spec.name


def _name(paradigm: str, mixture: dict[float, float]) -> str:
    from specray.distill.loop import draft_name

    return draft_name(paradigm, mixture)


def plan_drafts(spec: SweepSpec) -> list[DraftPlan]:
    """Every distilled draft of the sweep, in a stable order (paradigm, then τ_kd, then mixtures)."""
    root = sweep_dir(spec) / "drafts"
    plans = []
    for paradigm in spec.distill.paradigms:
        recipes = [{tau: 1.0} for tau in spec.teacher.temperatures]
        recipes += [dict(m.weights) for m in spec.distill.mixtures]
        for mixture in recipes:
            name = _name(paradigm, mixture)
            plans.append(DraftPlan(name, paradigm, mixture, root / name.replace("/", "__")))
    return plans


def baseline_plan(spec: SweepSpec, draft_path: str) -> DraftPlan:
    """The un-distilled draft, evaluated like every other one."""
    return DraftPlan(BASELINE, None, {}, Path(draft_path))
