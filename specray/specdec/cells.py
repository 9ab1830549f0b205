"""The evaluation cells of a grid: the evaluators' settings, the (draft × test set × τ_dec × estimator × γ ×
lenience × B) jobs, and the passes they are evaluated in. Pure planning — no models are run here; the
sweep's plan gives the jobs their content keys (`SweepPlan.cell_jobs`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specray.config import EvalSpec, SweepSpec
from specray.draft import Draft
from specray.models.loading import check_same_vocabulary, load_tokenizer
from specray.specdec.records import Estimator, EvalJob, EvalSettings, StepCosts


def eval_settings(spec: EvalSpec, step_costs: StepCosts | None = None) -> EvalSettings:
    """The evaluators' settings; the step costs are the given ones, else the spec's fixed c, else None
    (to be measured)."""
    if step_costs is None and spec.draft_cost_ratio is not None:
        step_costs = fixed_step_costs(spec)
    return EvalSettings(
        repeats=spec.repeats,
        max_new_tokens=spec.max_new_tokens,
        empirical_prompts=spec.empirical_prompts,
        seed=spec.seed,
        step_costs=step_costs,
        timing_precision=spec.timing_precision,
    )


def fixed_step_costs(spec: EvalSpec) -> StepCosts:
    """The papers' model at the spec's `draft_cost_ratio` (a config validator keeps its B at 1)."""
    assert spec.draft_cost_ratio is not None
    return StepCosts.fixed(spec.draft_cost_ratio, spec.batch_sizes, spec.gamma)


def workload_json(spec: SweepSpec) -> dict[str, Any] | None:
    """The sweep's workload as the report reads it: test set, category -> τ (a preset resolved), weights."""
    workload = spec.eval.workload
    if workload is None:
        return None
    return {"test_set": workload.test_set, "temperatures": workload.table, "weights": workload.weights}


def plan_jobs(spec: EvalSpec, drafts: Sequence[Draft]) -> list[EvalJob]:
    """Every cell, unkeyed: analytic at every τ_dec, empirical at `empirical_temperatures`, per draft, test
    set, γ and lenience point (`LenienceSpec.points`: lossless, then every (function, ε < 1) at τ_dec > 0).
    The sweep's plan keys them (`SweepPlan.cell_jobs`); unkeyed, nothing is cached (`specray evaluate`).

    With `empirical_drafts: diagonal`, empirical cells go only to drafts whose single τ_kd is the one of the
    grid nearest that τ_dec (equal to it where the grid has it; elsewhere — between grid points or beyond
    the grid — the nearest, so that an export's band there is judged on measured speedups too) and to
    drafts without one (the un-distilled draft, mixtures). With `quality_ends`, each draft with an
    empirical cell at a τ_dec also gets one `ends` record there (the target and the draft decoding alone).
    Empirical cells are planned at every B of `empirical_batch_sizes`.
    """
    jobs = []
    grid = sorted({d.tau_kd for d in drafts if d.tau_kd is not None})
    nearest = {
        t: min(grid, key=lambda k: (abs(k - t), k)) if grid else None for t in spec.empirical_temperatures
    }
    for draft in drafts:
        for test_set in spec.test_sets:
            if "analytic" in spec.estimators:
                jobs += [
                    _job(draft, t, test_set, "analytic", g, point)
                    for t in spec.temperatures
                    for point in spec.lenience.points(t)
                    for g in spec.gamma
                ]
            if "empirical" not in spec.estimators:
                continue
            for tau in spec.empirical_temperatures:
                if spec.empirical_drafts == "all" or draft.tau_kd in (None, nearest[tau]):
                    jobs += [
                        _job(draft, tau, test_set, "empirical", g, point, b)
                        for point in spec.lenience.points(tau)
                        for g in spec.gamma
                        for b in spec.empirical_batch_sizes
                    ]
                    jobs += [_job(draft, tau, test_set, "ends", 0)] if spec.quality_ends else []
    return jobs


def _job(
    draft: Draft,
    tau: float,
    test_set: str,
    estimator: Estimator,
    gamma: int,
    lenience: tuple[str | None, float] = (None, 1.0),
    batch_size: int = 1,
) -> EvalJob:
    return EvalJob(
        draft.name,
        str(draft.folder),
        tau,
        test_set,
        estimator,
        gamma,
        draft.key,
        lenience=lenience[0],
        epsilon=lenience[1],
        batch_size=batch_size,
    )


def passes(jobs: Sequence[EvalJob], drafts_per_pass: int) -> list[tuple[EvalJob, ...]]:
    """The units of work: analytic cells grouped by (test set, τ_dec) — at most `drafts_per_pass` drafts,
    each with all its γ and lenience points, per pass, so one target pass serves them — and each empirical
    (or `ends`) cell alone."""
    groups: dict[tuple[str, float], dict[str, list[EvalJob]]] = {}
    units: list[tuple[EvalJob, ...]] = []
    for job in jobs:
        if job.estimator != "analytic":
            units.append((job,))
        else:
            groups.setdefault((job.test_set, job.tau_dec), {}).setdefault(job.draft_path, []).append(job)
    analytic = []
    for _, by_draft in sorted(groups.items()):
        chunks = list(by_draft.values())
        for start in range(0, len(chunks), drafts_per_pass):
            analytic.append(tuple(job for chunk in chunks[start : start + drafts_per_pass] for job in chunk))
    return analytic + units


def check_drafts(target_path: str, drafts: Mapping[str, str]) -> None:
    """Refuse, before any decoding, a draft that is missing or whose vocabulary differs from the target's."""
    target_tokenizer = load_tokenizer(target_path)
    for path in drafts.values():
        check_same_vocabulary(target_tokenizer, load_tokenizer(path), target_path, path)
