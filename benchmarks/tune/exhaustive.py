"""Tune's search against exhaustive enumeration: on a space small enough to train whole, how far the recipe
Tune picks is from the best one, and after how many trials its pick is within 1% of it.

    .venv/bin/python -m benchmarks.tune.exhaustive [--replicates 3] [--trials 16] [--seeds 3] [--output DIR]
    .venv/bin/python -m benchmarks.tune.exhaustive --quick   # a smoke check on a micro zoo

The space: sweeps/tune_tiny.yaml with `tune.space: subset`, `tune.subset_size: 2` over six τ_kd
{0, 0.2, …, 1}: C(6, 2) = 15 recipes (equal parts of two τ_kd), each trained at the search budget
(`tune.steps`, 100 steps).

Exhaustive: every recipe trained `--replicates` times (replicate r with distill.seed + r) through the stage
runner and scored by the search's own objective (mean analytic `speedup_model` at τ_dec 0.8 and 1.0 on the
validation split). A recipe's figure S is its mean over replicates: the reference every pick is judged by.

Tune: `--seeds` searches (tune.seed 0, 1, …) of `--trials` trials each, with the driver's own searcher and
scheduler (`specray.sweep.tune.search.search`: Optuna TPE, its first 10 trials random, ASHA stopping
trials early). Each trial trains its own draft (replicate 0's seed), as in `specray tune`.

Figures, per search:
- regret = 1 − S(Tune's pick) / S(best recipe), with its 95% interval over training replicates and
  validation prompts (`bootstrap.replicated_interval`, two levels); the best recipe is re-chosen in
  every resample, so the interval includes the doubt about which recipe is best;
- trials to 1%: the first n such that the recipe Tune would pick had it stopped after n trials (the best
  objective among them) has S within 1% of the best S; "never" when none of the `--trials` does.

Needs the tiny zoo and tiny.yaml's τ_kd shards (`specray generate sweeps/tiny.yaml`, else the teacher pool
samples them first); `--quick` makes its own on the micro zoo. `--output DIR` keeps the drafts and cells
(keyed: a second run with the same settings reuses them and only searches again).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks import REPO
from benchmarks.quick import quick_spec
from specray.bootstrap import ReplicatedInterval, replicated_interval
from specray.cluster.runtime import ray_session
from specray.config import SweepSpec, load_spec
from specray.progress import SweepDisplay
from specray.report.paired import PromptCells, prompt_cells
from specray.sweep.plan import VALIDATION, plan_sweep
from specray.sweep.stages import Stages
from specray.sweep.tune.driver import Tune
from specray.sweep.tune.final import draft_objectives
from specray.sweep.tune.outputs import cells_json
from specray.sweep.tune.search import TrialRecord, search, summarise
from specray.sweep.tune.search_stage import trial_context
from specray.sweep.tune.space import baseline_recipe

GRID, QUICK_GRID = "[0.0,0.2,0.4,0.6,0.8,1.0]", "[0.0,1.0]"
QUICK = (
    "distill.paradigms=[offline]",
    "distill.steps=4",
    "distill.report_every=1",
    "distill.checkpoint_every=2",
    "tune.steps=2",
    "tune.objective_temperatures=[1.0]",
    "ray.num_cpus=2",
    "eval.timing_precision=0.5",  # a smoke check: c to ±50% (tests/sweeps.py COARSE_TIMING), not ±2%
    "eval.replicas=1",  # one eval actor to start, not tiny.yaml's two
)
TOLERANCE = 0.01


class NoRuns:
    """The tune driver's MLflow side, left out: the benchmark logs nothing."""

    runs: dict[str, str] = {}

    def open(self, drafts, tags=None) -> None:  # noqa: ANN001
        pass

    def draft_done(self, draft, curves, reused=False) -> None:  # noqa: ANN001
        pass

    def records_done(self, records, saved=False) -> None:  # noqa: ANN001
        pass


def bench_spec(quick: bool, trials: int, output: Path) -> SweepSpec:
    subset = ["tune.space=subset", "tune.subset_size=2", f"tune.num_samples={trials}", f"output_dir={output}"]
    if quick:
        # quick: one τ_kd per recipe, so 2 recipes x the replicates are trained whole (4 drafts, not 6)
        return quick_spec([f"teacher.temperatures={QUICK_GRID}", *QUICK, *subset, "tune.subset_size=1"])
    return load_spec(REPO / "sweeps" / "tune_tiny.yaml", [f"teacher.temperatures={GRID}", *subset])


def pair(mixture) -> str:  # noqa: ANN001
    return "+".join(f"{tau:g}" for tau in sorted(mixture))


def exhaustive(run: Tune, replicates: int) -> tuple[pd.Series, PromptCells]:
    """Every recipe of the space, `replicates` times: S per recipe (mean over replicates, best first) and
    the per-prompt table its intervals resample."""
    spec = run.spec
    space = itertools.combinations(spec.teacher.temperatures, spec.tune.subset_size)
    recipes = [baseline_recipe(spec, dict.fromkeys(taus, 1.0)) for taus in space]
    drafts = [run.draft(recipe, r) for recipe in recipes for r in range(replicates)]
    run.distill(drafts, "exhaustive", f"{len(recipes)} recipes x {replicates}")
    records = run.evaluate(drafts, [VALIDATION], "validation")
    objectives = draft_objectives(records, spec.tune.objective_temperatures)
    label = {d.name: pair(d.mixture) for d in drafts}
    frame = pd.Series({d.name: objectives[d.name] for d in drafts}).groupby(label).mean()
    cells = pd.DataFrame(cells_json(records, {d.name: pair(d.mixture) for d in drafts}))
    return frame.sort_values(ascending=False), prompt_cells(cells)[VALIDATION]


def regret(
    table: PromptCells, pick: str, recipes: list[str], taus: list[float], n: int
) -> ReplicatedInterval:
    """1 − S(pick) / max over recipes of S, over `n` replicates and the validation prompts (two levels)."""

    def objective(recipe: str, index: np.ndarray) -> np.ndarray:  # [resamples, replicates]
        return np.mean([table.speedup(table.existing_row(recipe, tau), index) for tau in taus], axis=0)

    def effect(chosen: np.ndarray, index: np.ndarray) -> np.ndarray:
        means = np.stack([objective(r, index)[:, chosen].mean(-1) for r in recipes])  # [recipes, resamples]
        return 1.0 - objective(pick, index)[:, chosen].mean(-1) / means.max(axis=0)

    return replicated_interval(effect, n, int(table.tokens[0].shape[0]))


def order(trial: TrialRecord) -> float:
    """When a trial started (its first result's time less the time it had run): the order the searcher
    proposed trials in (trial ids are random)."""
    first = trial.history[0] if trial.history else trial.metrics
    return float(first.get("timestamp", 0.0)) - float(first.get("time_total_s", 0.0))


def trials_to_within(trials: list[TrialRecord], s: pd.Series) -> int | None:
    """The first n after which Tune's pick among its first n trials is within TOLERANCE of the best S."""
    ordered = sorted(trials, key=order)
    for n in range(1, len(ordered) + 1):
        measured = [t for t in ordered[:n] if t.objective is not None]
        if measured and s[picked(measured)] >= (1 - TOLERANCE) * s.iloc[0]:
            return n
    return None


def picked(trials: list[TrialRecord]) -> str:
    """The recipe of the trial with the best measured objective: what Tune returns as its winner."""
    measured = [t for t in trials if t.objective is not None]
    return pair(max(measured, key=lambda t: t.objective or 0.0).recipe.mixture)


def one_search(run: Tune, seed: int) -> list[TrialRecord]:
    tune = run.spec.tune.model_copy(update={"seed": seed})
    spec = run.spec.model_copy(update={"tune": tune})
    context = trial_context(run)
    run.stages.release_pool()  # its actors would hold the CPUs the trials need
    results = search(spec, context, run.out / f"search-seed{seed}", resume=False)
    return summarise(spec, results, Path(context.trials_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=None, help="default 3 (2 with --quick)")
    parser.add_argument("--trials", type=int, default=None, help="default 16, tune_tiny's (2 with --quick)")
    parser.add_argument(
        "--seeds", type=int, default=None, help="searches, tune.seed 0.. (default 3; 1 --quick)"
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="keep drafts and cells here (default: temp)"
    )
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few steps: a smoke check")
    args = parser.parse_args()
    replicates = args.replicates or (2 if args.quick else 3)
    trials, seeds = args.trials or (2 if args.quick else 16), args.seeds or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory() as temp:
        output = (args.output or Path(temp)).absolute()
        spec = bench_spec(args.quick, trials, output)
        plan = plan_sweep(spec, validation=True)
        with ray_session(spec.ray), Stages(plan, SweepDisplay(enabled=False)) as stages:
            run = Tune(plan, output / spec.name / "tune", stages, NoRuns())  # type: ignore[arg-type]
            stages.models()
            stages.generate()
            run.cost = stages.time_steps()
            s, table = exhaustive(run, replicates)
            searches = [one_search(run, seed) for seed in range(seeds)]
    report(spec, s, table, searches, replicates, trials)


def report(
    spec: SweepSpec, s: pd.Series, table: PromptCells, searches: list[list[TrialRecord]], n: int, trials: int
) -> None:
    taus = list(spec.tune.objective_temperatures)
    steps = spec.tune.steps or spec.distill.steps
    print(
        f"exhaustive: {len(s)} recipes x {n} replicates at {steps} steps; S = mean objective over replicates"
    )
    print("| recipe | S |\n|---|---|")
    for recipe, value in s.items():
        print(f"| {recipe} | {value:.4f} |")
    regrets, within = [], []
    for seed, found in enumerate(searches):
        completed = [t for t in found if t.objective is not None]
        pick = picked(found)
        interval = regret(table, pick, list(s.index), taus, n)
        low = max(0.0, interval.low)  # a regret is never negative: the t interval's lower end can be
        first = trials_to_within(found, s)
        regrets.append(interval.effect)
        within.append("never" if first is None else str(first))
        print(
            f"search seed {seed}: pick {pick} (rank {list(s.index).index(pick) + 1} of {len(s)}), regret "
            f"{interval.effect:.2%} [{low:.2%}, {interval.high:.2%}], within 1% after "
            f"{within[-1]} of {len(found)} trials ({len(completed)} completed)"
        )
    print(
        f"Tune vs exhaustive: regret {np.mean(regrets):.2%} (mean of {len(searches)} searches, each with its "
        f"interval above); trials to within 1%: {', '.join(within)} of {trials}"
    )


if __name__ == "__main__":
    main()
