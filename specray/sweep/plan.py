"""The plan of a sweep: everything its spec implies, computed once, as frozen records.

`plan_sweep(spec)` builds the splits and the prompt sets, each teacher sample's shard keys, every draft as
one `Draft` (name, recipe, folder, key and key inputs, the spec it trains under), the un-distilled
baseline, and the step costs' key; `SweepPlan.cell_jobs` turns measured step costs into the keyed cells.
Every key of a sweep is computed here (from the recipes in `specray/keys/`) and nowhere downstream: the
stage runner (`sweep/stages.py`), the Train workers, the evaluators, the report and the export receive
these records and read their keys and folders. The tune search and the model garden plan their own
drafts through the same functions (`specray.draft.plan_draft`, `plan_shards`).

Pure planning: no model is loaded, nothing is written, Ray is not started. What of the plan is already on
disk is a separate question (`sweep/survey.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specray.config import EvalSpec, SweepSpec
from specray.config.presets import source_name
from specray.data.dataset import build_splits, held_out_split
from specray.data.examples import Example
from specray.data.shards import ShardKey
from specray.data.spec_bench import conversation_id, expand_turns
from specray.data.splits import fingerprint
from specray.devices import device_kind
from specray.draft import Draft, plan_draft
from specray.keys import (
    answers_key,
    cell_key_inputs,
    cost_ratio_inputs,
    digest,
    draft_key_inputs,
    shard_key,
    train_shard_keys,
)
from specray.models.sources import model_id, model_path
from specray.names import BASELINE
from specray.specdec.cells import plan_jobs
from specray.specdec.records import EvalJob, StepCosts
from specray.specdec.turns import later_turns

SPEC_FILE = "spec.yaml"  # the resolved spec of the sweep's last run, in its output folder
VALIDATION = "validation"  # the prompt set a tune search scores on (never a test set)


def sweep_dir(spec: SweepSpec) -> Path:
    return Path(spec.output_dir) / spec.name


def other_sweeps(folder: Path) -> list[Path]:
    """The other sweeps' folders under the output directory that holds `folder` (a sweep's own)."""
    here = folder.absolute()
    if not here.parent.is_dir():
        return []
    return sorted(p for p in here.parent.iterdir() if p.is_dir() and p != here)


def published_draft(own: Path, key: str) -> Path:
    """Where the draft of `key` planned at `own` (`<output dir>/<sweep>/drafts/<name>`) is: `own` when it
    holds a finished draft (or a damaged one, which the survey sets aside and trains again there); else the
    folder of that name in another sweep under the same output directory that finished it under the same
    key — read there, never written (sweeps/study.yaml reuses sweeps/demo.yaml's drafts so); else `own`."""
    from specray.distill.checkpoints import FINISHED_FILE, is_finished

    if (own / FINISHED_FILE).is_file():
        return own
    found = (o / "drafts" / own.name for o in other_sweeps(own.parent.parent))
    return next((folder for folder in found if is_finished(folder, key)), own)


@dataclass(frozen=True)
class ShardPlan:
    """One teacher sample: the train prompts, sampled by `spec`'s teacher at every τ_kd of its grid with
    its `teacher.seed` (one per training replicate with `teacher.replicate_shards`)."""

    spec: SweepSpec
    examples: tuple[Example, ...]
    keys: Mapping[float, ShardKey]  # by τ_kd


@dataclass(frozen=True)
class PromptSet:
    """An evaluated prompt set (a test set, or validation for a tune search), one example per prompt: under
    the chat template a conversation is one prompt per turn, whose later turns hold the target's earlier
    answers (decoded once, cached under `answers_key`)."""

    name: str
    examples: tuple[Example, ...]
    key: str  # the prompts' fingerprint: what every cell on this set is keyed by
    answers_key: str = ""  # "" when no prompt needs earlier answers
    categories: tuple[str, ...] = ()  # per prompt, for a source with categories
    conversations: tuple[str, ...] = ()  # per prompt: its question's id (turns of one question together)


@dataclass(frozen=True)
class SweepPlan:
    """A sweep, planned. `target_path` and `student_path` are where the models are (a zoo entry: where the
    zoo stage builds it)."""

    spec: SweepSpec
    folder: Path
    splits: Mapping[str, tuple[Example, ...]]
    prompt_sets: Mapping[str, PromptSet]
    shards: tuple[ShardPlan, ...]
    drafts: tuple[Draft, ...]  # every distilled draft, replicate 0 of every recipe first
    baseline: Draft  # the un-distilled draft
    target_path: str
    student_path: str
    target_id: str  # the target as the continuations' cache key names it (model and dtype)
    step_costs_inputs: Mapping[str, Any]
    # the keyed cells of the whole grid, per step costs' fingerprint: computed once per plan
    _cells: dict[str | None, list[EvalJob]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def step_costs_key(self) -> str:
        return digest(self.step_costs_inputs)

    @property
    def evaluated(self) -> tuple[Draft, ...]:
        """The baseline and every distilled draft: what is evaluated."""
        return (self.baseline, *self.drafts)

    @property
    def drafts_dir(self) -> Path:
        return self.folder / "drafts"

    def cell_jobs(
        self,
        costs: StepCosts | None,
        drafts: Sequence[Draft] | None = None,
        grid: EvalSpec | None = None,
    ) -> list[EvalJob]:
        """The keyed cells of `drafts` (default: the baseline and every draft) on `grid`'s coordinates
        (default: `eval`), analytic cells keyed by the step costs' values (None: not measured yet)."""
        costs_key = None if costs is None else costs.fingerprint()
        whole = drafts is None and grid is None
        if whole and costs_key in self._cells:
            return list(self._cells[costs_key])
        jobs = plan_jobs(grid or self.spec.eval, list(self.evaluated if drafts is None else drafts))
        keyed = [self._keyed(job, costs_key) for job in jobs]
        if whole:
            self._cells[costs_key] = keyed
        return list(keyed)

    def _keyed(self, job: EvalJob, costs_key: str | None) -> EvalJob:
        lenience = (job.lenience, job.epsilon)
        prompts = self.prompt_sets[job.test_set].key
        inputs = cell_key_inputs(
            self.spec,
            job.draft_key,
            prompts,
            job.test_set,
            job.tau_dec,
            job.estimator,
            job.gamma,
            costs_key,
            lenience,
            job.batch_size,
        )
        return replace(job, key=digest(inputs), key_inputs=inputs)


def plan_sweep(spec: SweepSpec, validation: bool = False) -> SweepPlan:
    """The whole sweep, planned once (`validation`: also the validation prompts, for a tune search)."""
    splits = {name: tuple(examples) for name, examples in build_splits(spec.data).items()}
    sets = list(spec.eval.test_sets) + ([VALIDATION] if validation else [])
    prompt_sets = {name: plan_prompt_set(spec, name, splits) for name in sets}
    samples = range(spec.distill.replicates) if spec.teacher.replicate_shards else range(1)
    shards = tuple(plan_shards(spec.for_replicate(r), splits["train"]) for r in samples)
    root = sweep_dir(spec) / "drafts"
    drafts = []
    for replicate in range(spec.distill.replicates):
        sample = shards[replicate if spec.teacher.replicate_shards else 0]
        for paradigm in spec.distill.paradigms:
            recipes = [{tau: 1.0} for tau in spec.teacher.temperatures]
            recipes += [dict(m.weights) for m in spec.distill.mixtures]
            for mixture in recipes:
                for divergence, data_source in variants(spec, paradigm):
                    axes = (replicate, divergence, data_source)
                    draft = plan_draft(spec, sample.keys, paradigm, mixture, *axes, root=root)
                    drafts.append(replace(draft, folder=published_draft(draft.folder, draft.key)))
    student = model_path(spec.models.draft, spec.models)
    baseline_inputs = draft_key_inputs(spec, None, {}, {})
    baseline = Draft(BASELINE, None, {}, Path(student), digest(baseline_inputs), baseline_inputs, spec)
    return SweepPlan(
        spec=spec,
        folder=sweep_dir(spec),
        splits=splits,
        prompt_sets=prompt_sets,
        shards=shards,
        drafts=tuple(drafts),
        baseline=baseline,
        target_path=model_path(spec.models.target, spec.models),
        student_path=student,
        target_id=f"{model_id(spec.models.target, spec.models)}|{spec.models.target.dtype}",
        step_costs_inputs=cost_ratio_inputs(spec),
    )


def variants(spec: SweepSpec, paradigm: str) -> list[tuple[str, str]]:
    """The (divergence, data source name) of each draft of `paradigm` per recipe; ("", "") for offline."""
    if paradigm != "online":
        return [("", "")]
    d = spec.distill
    return [(div, source_name(src)) for div in d.divergences for src in d.data_source_list]


def plan_shards(spec: SweepSpec, train: Sequence[Example]) -> ShardPlan:
    """The shard keys of one teacher sample of `train` (the spec's teacher, seed and τ_kd grid)."""
    return ShardPlan(spec, tuple(train), train_shard_keys(spec, train))


def plan_samples(
    spec: SweepSpec, train: Sequence[Example], tau: float, count: int, stride: int = 1
) -> list[ShardKey]:
    """The keys of `count` teacher samples of `train` at one τ_kd `tau` (a control's, `draft.plan_control`):
    sample j drawn with the spec's teacher.seed + j·stride, so sample 0 is the spec's own shard at `tau`."""
    teacher = spec.teacher
    return [
        shard_key(spec, train, tau, teacher.max_new_tokens, teacher.seed + j * stride) for j in range(count)
    ]


def plan_prompt_set(spec: SweepSpec, name: str, splits: Mapping[str, Sequence[Example]]) -> PromptSet:
    """A prompt set: its examples, and the key of their token ids without tokenizing (the examples, the
    template, the cut and the target's tokenizer determine them, and the earlier answers where needed)."""
    examples = tuple(splits[VALIDATION if name == VALIDATION else held_out_split(name)])
    if name != VALIDATION and spec.data.template == "chat":
        examples = tuple(expand_turns(examples))
    inputs: dict[str, Any] = {
        "examples": fingerprint(examples),
        "template": spec.data.template,
        "max_prompt_tokens": spec.data.max_prompt_tokens,
        "tokenizer": model_id(spec.models.target, spec.models),
    }
    answers = ""
    if later := later_turns(examples):  # the target's earlier answers are part of these prompts
        target = model_id(spec.models.target, spec.models)
        answers = answers_key(later, target, spec.eval.max_new_tokens, answers_device(spec))
        inputs["earlier_answers"] = answers
    labelled = name != VALIDATION and spec.data.test_source(name).has_categories
    return PromptSet(
        name,
        examples,
        digest(inputs),
        answers,
        tuple(e.family for e in examples) if labelled else (),
        tuple(conversation_id(e.id) for e in examples) if labelled else (),
    )


def answers_device(spec: SweepSpec) -> str:
    """Where the driver decodes the earlier answers of multi-turn prompts: the eval device when this process
    has it, else the CPU (a cluster's driver often has no GPU; the answers' key says which it was)."""
    import torch

    return "cuda" if device_kind(spec.eval.num_gpus) == "cuda" and torch.cuda.is_available() else "cpu"
