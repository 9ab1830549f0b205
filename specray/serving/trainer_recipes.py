"""What a trainer-data export (`trainer_data.py`) reads of a finished run and which of its recipes it writes.

A run is a finished sweep or tune, by folder or MLflow parent run id (`read_run`); a recipe is a named
mixture of the run's τ_kd (one τ_kd: weight 1). `choose_recipes` takes single τ_kd of the run's grid,
recipes the run trained (by name; `tuned` for a tune's winner) or a mixture `τ:w,τ:w` over the grid, and
refuses anything else in one line naming what there is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specray.config import SweepSpec
from specray.draft import Draft
from specray.errors import SpecError

if TYPE_CHECKING:
    from specray.sweep.plan import SweepPlan


@dataclass(frozen=True)
class Recipe:
    """A named mixture of the run's τ_kd (one τ_kd: weight 1)."""

    name: str
    mixture: Mapping[float, float]

    @property
    def file_stem(self) -> str:
        return re.sub(r"[^\w.=,+-]+", "_", self.name).strip("_")


@dataclass(frozen=True)
class RunData:
    """What an export reads of a finished run: its spec, the recipes it trained, the source's name."""

    spec: SweepSpec
    recipes: Mapping[str, Mapping[float, float]]  # recipe name -> mixture
    source: str
    kind: str  # "sweep" or "tune"
    default: tuple[str, ...] = field(default=())  # the recipes exported when none is asked for
    plan: SweepPlan | None = None  # the run's plan where reading it made one (a sweep's), else made on use


def read_run(source: str, tracking_uri: str | None = None, work: Path | None = None) -> RunData:
    """A finished sweep or tune (folder or MLflow parent run id): refused in one line when it is missing or
    not finished."""
    import tempfile

    from specray.serving.source import read_sweep
    from specray.serving.tune_source import is_tune_folder, read_tune_folder, tune_drafts
    from specray.sweep.plan import plan_sweep

    folder = Path(source)
    if not folder.exists() and tracking_uri is None:
        raise SpecError(f"{source}: no such folder (an MLflow run id needs --tracking-uri)")
    if folder.is_dir() and is_tune_folder(folder):
        results = read_tune_folder(folder)  # refuses a tune without its full-budget drafts
        return _tune(results.spec, tune_drafts(folder), source)
    if not folder.is_dir():
        from specray.config import load_spec
        from specray.names import TUNE_SPEC
        from specray.tracking.fetch import fetch_tune_report

        work = work or Path(tempfile.mkdtemp(prefix="specray-export-data-"))
        assert tracking_uri is not None  # checked above
        found = fetch_tune_report(tracking_uri, source, work / "records")
        if found is not None:
            report = found[0]
            return _tune(load_spec(report / TUNE_SPEC), tune_drafts(report), f"mlflow:{source}")
    results = read_sweep(source, tracking_uri, work)  # refuses an unfinished sweep
    plan = plan_sweep(results.spec)
    recipes = {d.recipe: dict(d.mixture) for d in plan.drafts}
    singles = tuple(dict.fromkeys(f"tau_kd={tau:g}" for tau in results.spec.teacher.temperatures))
    return RunData(results.spec, recipes, results.source, "sweep", singles, plan)


def _tune(spec: SweepSpec, drafts: Sequence[Draft], source: str) -> RunData:
    """A tune's recipes: Table 3's drafts at the full budget; its winner (`tuned:`) is the default."""
    recipes = {d.recipe: dict(d.mixture) for d in drafts if d.trained}
    tuned = tuple(name for name in recipes if name.startswith("tuned:"))
    return RunData(spec, recipes, source, "tune", tuned)


def choose_recipes(run: RunData, taus: Sequence[float] = (), names: Sequence[str] = ()) -> list[Recipe]:
    """The recipes to write: single τ_kd of the run's grid, recipes the run trained (by name, or a mixture
    written `τ:w,τ:w` over the grid), else the run's default."""
    grid = sorted(run.spec.teacher.temperatures)
    shown = ", ".join(f"{t:g}" for t in grid)
    chosen: list[Recipe] = []
    for tau in taus:
        if not any(abs(tau - t) < 1e-9 for t in grid):
            raise SpecError(f"--tau-kd {tau:g}: not in the run's τ_kd grid ({shown})")
        chosen.append(Recipe(f"tau_kd={tau:g}", {_on_grid(tau, grid): 1.0}))
    for name in names or ([] if taus else list(run.default)):
        chosen.append(_recipe(run, name, grid))
    if not chosen:
        raise SpecError(f"{run.source}: nothing to export; choose --tau-kd from {shown} or a --recipe")
    return list({r.name: r for r in chosen}.values())


def _on_grid(tau: float, grid: Sequence[float]) -> float:
    return min(grid, key=lambda t: abs(t - tau))


def _recipe(run: RunData, name: str, grid: Sequence[float]) -> Recipe:
    from specray.distill.inputs import parse_mixture

    tau = _number(name.removeprefix("tau_kd=")) if name.startswith("tau_kd=") else None
    if tau is not None and any(abs(tau - t) < 1e-9 for t in grid):
        return Recipe(f"tau_kd={tau:g}", {_on_grid(tau, grid): 1.0})
    if name == "tuned" and run.kind == "tune":
        name = run.default[0]
    matches = [n for n in run.recipes if n == name or n.split("/", 1)[-1] == name]
    if matches:
        mixture = run.recipes[matches[0]]
        return Recipe(matches[0], {_on_grid(t, grid): w for t, w in mixture.items()})
    try:
        mixture = parse_mixture(name)
    except ValueError:
        mixture = {}
    if mixture and all(any(abs(t - g) < 1e-9 for g in grid) for t in mixture):
        return Recipe(f"mix={name}", {_on_grid(t, grid): w for t, w in mixture.items()})
    known = ", ".join(sorted(run.recipes)) or "none"
    raise SpecError(
        f"--recipe {name!r}: not a recipe of the run ({known}), nor a mixture τ:w,τ:w over its τ_kd grid "
        f"({', '.join(f'{t:g}' for t in grid)})"
    )


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
