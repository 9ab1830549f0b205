"""What the steps of one `specray tune` share: its plan, folder, stage runner and MLflow runs, and the three
things it does with drafts — plan one for a recipe at a budget (`Tune.draft`), train some through the stage
runner (`Tune.distill`), and measure them in keyed, cached analytic cells (`Tune.evaluate`).

Names and folders. A draft trained at the full budget (`space.final_budget`, the budget drafts are served
at) carries its recipe's name, as a sweep's draft does (`offline/tau_kd=0.6`, replicate r `…/r1`); a
draft at any other budget — the search's — is marked with its steps (`offline/tau_kd=0.6@100`), so the two
never share a name in Table 3, MLflow or the report. A draft is looked for, by its key, in the folder a
`specray run` of the same recipe would publish it in: this sweep's, then every other sweep's under the same
output directory (a tune spec that includes `tiny.yaml` and agrees with it on every draft setting finds
`tiny`'s drafts there), and only then trained into the tune's own `baselines/` (search budget) or `final/`
(full budget). Such a draft is read, never written: its folder belongs to its sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specray.config import SweepSpec
from specray.distill.checkpoints import is_finished
from specray.draft import Draft, control_name, draft_folder_name, plan_control, plan_draft, replicate_name
from specray.specdec.records import CellRecord, StepCosts
from specray.sweep.plan import ShardPlan, SweepPlan, other_sweeps, plan_samples, plan_shards
from specray.sweep.stages import Stages
from specray.sweep.tracked import DraftRuns
from specray.sweep.tune.space import Recipe, budget_spec, final_budget, tune_grid

SEARCH_DIR, TRIALS_DIR, BASELINES_DIR, FINAL_DIR, CELLS_DIR = (
    "search",
    "trials",
    "baselines",
    "final",
    "cells",
)
TUNED = "tuned:"  # prefix of the winner's name in records: its recipe may equal a baseline's


def budget_name(name: str, steps: int, final_steps: int) -> str:
    """A draft's name at a budget: the recipe's own at the full budget, marked `@<steps>` at any other."""
    return name if steps == final_steps else f"{name}@{steps}"


def one_folder_per_key(drafts: Sequence[Draft]) -> list[Draft]:
    """`drafts` with every draft of one key in the folder of the first (the winner's recipe may be a
    baseline's under another name: one training, two names)."""
    folders: dict[str, Path] = {}
    return [replace(d, folder=folders.setdefault(d.key, d.folder)) for d in drafts]


@dataclass
class Tune:
    """What the steps of one search share."""

    plan: SweepPlan
    out: Path
    stages: Stages
    runs: DraftRuns
    cost: StepCosts | None = None

    @property
    def spec(self) -> SweepSpec:
        return self.plan.spec

    def draft(self, recipe: Recipe, replicate: int = 0, name: str = "") -> Draft:
        """Replicate `replicate` of `recipe` at the recipe's budget (its `steps`), named `name` (default:
        the recipe's) marked with that budget; found where a sweep published it, else in the tune's folder."""
        spec, train = budget_spec(self.spec, recipe), self.plan.splits["train"]
        own = replicate and spec.teacher.replicate_shards  # its own teacher sample, seed + replicate
        keys = plan_shards(spec.for_replicate(replicate), train).keys if own else self.plan.shards[0].keys
        steps, final = int(recipe.distill["steps"]), final_budget(self.spec)
        name = replicate_name(budget_name(name or recipe.name, steps, final), replicate)
        published = draft_folder_name(replicate_name(recipe.name, replicate))  # a sweep's name for it
        where = FINAL_DIR if steps == final else BASELINES_DIR
        own_folder = self.out / where / draft_folder_name(name.replace(TUNED, "tuned__"))

        def folder(key: str) -> Path:
            found = (f for f in self._sweep_folders(published) if is_finished(f, key))
            return next(found, own_folder).absolute()

        return plan_draft(spec, keys, recipe.paradigm, recipe.mixture, replicate, name=name, folder=folder)

    def control(self, recipe: Recipe, tau: float, replicate: int = 0) -> Draft:
        """Replicate `replicate` of the control of `recipe` (a mixture of k τ_kd) at the τ_kd `tau`
        (`draft.plan_control`): k teacher samples of the train prompts at `tau`, sample j with the
        replicate's teacher.seed + j·stride (stride: the replicates when each has its own teacher sample,
        so no two replicates share a sample), weighted like the mixture's τ_kd in ascending order; at the
        recipe's budget, in the tune's own folder."""
        spec, train = budget_spec(self.spec, recipe), self.plan.splits["train"]
        stride = self.spec.tune.replicates if spec.teacher.replicate_shards else 1
        weights = [weight for _, weight in sorted(recipe.mixture.items())]
        samples = plan_samples(spec.for_replicate(replicate), train, tau, len(weights), stride)
        steps, final = int(recipe.distill["steps"]), final_budget(self.spec)
        name = budget_name(control_name(recipe.paradigm, tau, weights), steps, final)
        name = replicate_name(name, replicate)
        where = self.out / (FINAL_DIR if steps == final else BASELINES_DIR)
        folder = (where / draft_folder_name(name)).absolute()
        return plan_control(spec, samples, weights, recipe.paradigm, replicate, name=name, folder=folder)

    def _sweep_folders(self, folder_name: str) -> list[Path]:
        """Where a `specray run` publishes a draft of this folder name: this sweep's drafts, then any other
        sweep's under the same output directory."""
        own = self.plan.drafts_dir / folder_name
        return [own, *(other / "drafts" / folder_name for other in other_sweeps(self.plan.folder))]

    def distill(self, drafts: list[Draft], role: str, stage: str) -> None:
        """Train (or reuse) `drafts` through the stage runner, each logged to a child run tagged `role`.
        Two names for one draft (the winner's recipe may be a baseline's) train once."""
        self.runs.open(drafts, {"tune_role": role})
        unique = list({(d.folder, d.key): d for d in drafts}.values())
        first, train = self.plan.shards[0], self.plan.splits["train"]
        own = [d for d in unique if any(first.keys.get(tau) != key for tau, key in d.shards.items())]
        if own:  # replicates with their own teacher sample (teacher.replicate_shards)
            self.stages.generate([plan_shards(d.train_spec, train) for d in own])
        samples = {  # the controls' further samples at their one τ_kd
            key: d.train_spec
            for d in unique
            for key in d.sample_shards.values()
            if first.keys.get(key.tau) != key
        }
        if samples:
            plans = [ShardPlan(spec, tuple(train), {key.tau: key}) for key, spec in samples.items()]
            self.stages.generate(plans, stage="control samples")
        self.stages.distill(unique, self.runs.draft_done, stage=stage)

    def evaluate(self, drafts: list[Draft], test_sets: list[str], stage: str) -> list[CellRecord]:
        """Analytic cells of `drafts` at every objective τ_dec and γ on `test_sets` (each saved under its
        key in the tune's cells folder and logged to its draft's run); every γ's record is returned."""
        assert self.cost is not None, "the step costs are measured before any cell"
        jobs = self.plan.cell_jobs(self.cost, drafts, tune_grid(self.spec, test_sets))
        return self.stages.evaluate(jobs, self.cost, self.runs.records_done, self.out / CELLS_DIR, stage)
