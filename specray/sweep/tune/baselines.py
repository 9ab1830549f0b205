"""The baselines `specray tune` measures next to its winner, and the paper's Table 3. Pure functions.

Baselines are chosen on the validation split, like the winner, from the single-τ_kd grid (one draft per
τ_kd of `teacher.temperatures`, same paradigm and step budget as the trials):

- *best single τ_kd* at a τ_dec: the τ_kd whose draft has the highest validation `speedup_model` there;
- *manual recipe* at a τ_dec (the paper's composition, its Table 3): equal parts of the `manual_top_k`
  consecutive grid τ_kd centred on that peak — shifted inward when the peak sits at an end of the grid.

Both are picked per τ_dec (a small advantage over the winner, which is one mixture for every objective
τ_dec). Table 3 then compares the three on each test set: acceptance rate and speedup per τ_dec, with the
gain of the manual recipe and of the tuned mixture over the best single τ_kd.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specray.metrics import ACCEPTANCE_RATE, SPEEDUP_MODEL
from specray.specdec.records import CellRecord


def manual_recipe(grid: Sequence[float], peak: float, k: int = 3) -> dict[float, float]:
    """Equal weights on the k consecutive τ_kd of `grid` centred on `peak` (shifted inward at the edges)."""
    taus = sorted(grid)
    if peak not in taus:
        raise ValueError(f"peak τ_kd {peak} is not in the grid {taus}")
    k = min(k, len(taus))
    start = taus.index(peak) - (k - 1) // 2
    start = min(max(start, 0), len(taus) - k)
    return dict.fromkeys(taus[start : start + k], 1.0)


def best_single(scores: Mapping[float, float]) -> float:
    """The τ_kd with the highest score (ties: the lower τ_kd)."""
    return min(scores, key=lambda tau: (-scores[tau], tau))


def peaks(records: Sequence[CellRecord], tau_kd_of: Mapping[str, float]) -> dict[float, float]:
    """Per τ_dec, the single τ_kd with the best `speedup_model` among `records` (draft name -> its τ_kd)."""
    scores: dict[float, dict[float, float]] = {}
    for record in records:
        if record.draft in tau_kd_of:
            by_tau_kd = scores.setdefault(float(record.tau_dec), {})
            by_tau_kd[tau_kd_of[record.draft]] = record.metrics[SPEEDUP_MODEL]
    return {tau_dec: best_single(by_tau_kd) for tau_dec, by_tau_kd in sorted(scores.items())}


def relative_gain(value: float, reference: float) -> float:
    """value / reference − 1 (nan if the reference is 0)."""
    return value / reference - 1.0 if reference else float("nan")


@dataclass(frozen=True)
class Contenders:
    """Draft names of Table 3: the tuned one, and per τ_dec the best single τ_kd and the manual recipe."""

    tuned: str
    single: dict[float, str]
    manual: dict[float, str]
    labels: dict[str, str]  # draft name -> what the table shows (τ_kd, recipe or mixture)
    # per contender with a control (`tune.controls`: "manual", "tuned"), per τ_dec, its control's name
    controls: dict[str, dict[float, str]] = field(default_factory=dict)

    @property
    def names(self) -> set[str]:
        """Every recipe the table compares (the contenders' and their controls')."""
        controls = {name for by_tau in self.controls.values() for name in by_tau.values()}
        return {*self.single.values(), *self.manual.values(), self.tuned, *controls}


def table3(
    records: Sequence[CellRecord], contenders: Contenders, recipes: Mapping[str, str] | None = None
) -> pd.DataFrame:
    """One row per (test set, τ_dec): acceptance rate and speedup of each contender, and the gains. A
    contender trained several times (`tune.replicates`: `recipes` maps each replicate's draft name to the
    contender's) shows the mean over its replicates, at the γ whose mean is best (`records` may hold every
    γ: a recipe is served at one γ, chosen on its mean, not on a lucky replicate's)."""
    recipes = recipes or {}
    by_gamma: dict[tuple[str, str, float], dict[int, list[CellRecord]]] = {}
    for r in records:
        if r.estimator == "analytic":
            where = (recipes.get(r.draft, r.draft), r.test_set, float(r.tau_dec))
            by_gamma.setdefault(where, {}).setdefault(r.gamma, []).append(r)
    cell = {}
    for key, gammas in by_gamma.items():
        rs = max(gammas.values(), key=lambda rs: float(np.mean([r.metrics[SPEEDUP_MODEL] for r in rs])))
        means = {m: float(np.mean([r.metrics[m] for r in rs])) for m in (ACCEPTANCE_RATE, SPEEDUP_MODEL)}
        cell[key] = {"draft": key[0]} | means
    test_sets = sorted({r.test_set for r in records})
    rows = []
    for test_set in test_sets:
        for tau_dec in sorted(contenders.single):
            single = cell[(contenders.single[tau_dec], test_set, tau_dec)]
            manual = cell[(contenders.manual[tau_dec], test_set, tau_dec)]
            tuned = cell[(contenders.tuned, test_set, tau_dec)]
            row = _row(test_set, tau_dec, single, manual, tuned, contenders)
            for who, names in contenders.controls.items():
                control = cell[(names[tau_dec], test_set, tau_dec)]
                row |= _control_columns(who, row[f"{who} speedup_model"], control, contenders)
            rows.append(row)
    return pd.DataFrame(rows)


def _row(
    test_set: str, tau_dec: float, single: Mapping, manual: Mapping, tuned: Mapping, c: Contenders
) -> dict:
    return {
        "test_set": test_set,
        "tau_dec": tau_dec,
        "single tau_kd": c.labels[single["draft"]],
        "single acceptance_rate": single[ACCEPTANCE_RATE],
        "single speedup_model": single[SPEEDUP_MODEL],
        "manual recipe": c.labels[manual["draft"]],
        "manual acceptance_rate": manual[ACCEPTANCE_RATE],
        "manual speedup_model": manual[SPEEDUP_MODEL],
        "manual gain": relative_gain(manual[SPEEDUP_MODEL], single[SPEEDUP_MODEL]),
        "tuned acceptance_rate": tuned[ACCEPTANCE_RATE],
        "tuned speedup_model": tuned[SPEEDUP_MODEL],
        "tuned gain": relative_gain(tuned[SPEEDUP_MODEL], single[SPEEDUP_MODEL]),
        "tuned gain vs manual": relative_gain(tuned[SPEEDUP_MODEL], manual[SPEEDUP_MODEL]),
        # which cells these are, so the sweep report can bootstrap the gains over the same prompts
        "single draft": single["draft"],
        "manual draft": manual["draft"],
        "tuned draft": tuned["draft"],
    }


def _control_columns(who: str, speedup: float, control: Mapping, c: Contenders) -> dict:
    """A contender's control (its samples at the best single τ_kd) and the contender's gain over it."""
    return {
        f"{who} control": c.labels[control["draft"]],
        f"{who} control acceptance_rate": control[ACCEPTANCE_RATE],
        f"{who} control speedup_model": control[SPEEDUP_MODEL],
        f"{who} vs control": relative_gain(speedup, control[SPEEDUP_MODEL]),
        f"{who} control draft": control["draft"],
    }


def table3_markdown(frame: pd.DataFrame, tuned_label: str, title: str) -> str:
    """Table 3 as Markdown: α and speedup per contender; gains in percent."""
    lines = [
        f"# {title}",
        "",
        f"Tuned mixture: `{tuned_label}`. Gains are relative to the best single τ_kd at that τ_dec "
        "(chosen on the validation split, like the manual recipe and the tuned mixture).",
        "",
        "| test set | τ_dec | best single τ_kd | α | speedup | manual recipe | α | speedup | gain "
        "| tuned α | tuned speedup | gain | vs manual |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in frame.to_dict("records"):
        single = f"{r['single tau_kd']} | {r['single acceptance_rate']:.3f} | {r['single speedup_model']:.3f}"
        manual = f"{r['manual recipe']} | {r['manual acceptance_rate']:.3f} | {r['manual speedup_model']:.3f}"
        tuned = f"{r['tuned acceptance_rate']:.3f} | {r['tuned speedup_model']:.3f}"
        gains = f"{_percent(r['tuned gain'])} | {_percent(r['tuned gain vs manual'])}"
        lines.append(
            f"| {r['test_set']} | {r['tau_dec']:g} | {single} | {manual} | {_percent(r['manual gain'])} "
            f"| {tuned} | {gains} |"
        )
    return "\n".join(lines) + "\n"


def _percent(gain: float) -> str:
    return f"{gain:+.1%}"
