"""The one stage runner: the stages every driver runs — the sweep (`sweep/run.py`), the tune search
(`sweep/tune/`) and the model garden (`garden/`) — each written once, each resumable.

    models      build (or reuse) the zoo models the plan names
    generate    the teacher shards of each teacher sample (`ShardPlan`), cached by shard key
    distill     the plan's drafts with Ray Train: one scheduler shares them out among Train runs side by
                side (`train_runs`), longest first; a draft published under its key is reused
    time_steps  the step costs T_t(B, k), T_d(B): the spec's fixed c, or reused under the plan's key, or
                timed once on an eval actor and saved
    evaluate    cells: a record saved under its key is reused, the others are evaluated by the eval pool
                and each is saved once as it ends

A stage receives the plan's records (`Draft`, `ShardPlan`, keyed `EvalJob`s) and computes no key. What a
driver does with a finished draft or cell (MLflow, its own tables) it passes in as a callback; MLflow is
never called from here. Runs inside the driver's Ray session (`cluster.runtime.ray_session`).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import ray
from transformers import PreTrainedTokenizerBase

from specray.config import ModelRef, SweepSpec
from specray.data.templates import encode_prompts
from specray.distill.checkpoints import read_curves
from specray.distill.curves import CurvePoint, curve_note
from specray.draft import Draft
from specray.files import write_json
from specray.models.loading import load_tokenizer
from specray.models.sources import resolve_model_path
from specray.progress import SweepDisplay
from specray.specdec.categories import with_categories
from specray.specdec.cells import eval_settings, passes
from specray.specdec.records import CellRecord, EvalJob, StepCosts
from specray.specdec.turns import conversation_answers
from specray.specdec.workers import EvalPool, make_eval_pool
from specray.sweep.plan import PromptSet, ShardPlan, SweepPlan, answers_device
from specray.sweep.survey import (
    CELLS_DIR,
    cell_stage,
    read_cells,
    step_costs_file,
    step_costs_stage,
)

log = logging.getLogger(__name__)

# an online step's cost in offline steps: it also samples from the student and runs the teacher
# (benchmarks/README.md has the tiny sweep's timings and the command that measures them)
ONLINE_STEP_COST = 2.0
# A Ray Train run's start (its controller, placement group and helper actors, a worker process importing
# torch) costs about 10 s wall and 12 CPU s on a 2-core machine (benchmarks/README.md): another run side by
# side is started only for a share of at least this many offline steps (a tiny-zoo draft's step takes
# ~0.03 s, a real draft's far more). benchmarks/README.md measures the smoke sweep's four 8-step drafts in
# one run against two.
RUN_START_STEPS = 200

DraftDone = Callable[[Draft, list[CurvePoint], bool], None]  # (draft, its curves, reused)
RecordsDone = Callable[[list[CellRecord], bool], None]  # (records, found saved)


class Stages:
    """The stages of one plan, sharing the models' paths, the encoded prompts and one lazily started eval
    pool (a re-run with every cell saved loads nothing). Use as a context manager: the pool is closed at
    the end."""

    def __init__(self, plan: SweepPlan, display: SweepDisplay) -> None:
        self.plan, self.display = plan, display
        self._prompts: dict[str, list[list[int]]] | None = None
        self._pool: EvalPool | None = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.close()

    # ------------------------------------------------------------ models and data

    def models(self, extra: Sequence[ModelRef] = ()) -> None:
        """Build (or reuse) the target and the student, and any `extra` models (a garden's targets)."""
        spec = self.plan.spec
        with self.display.stage("zoo", 1, "model"):
            for ref in (spec.models.target, spec.models.draft, *extra):
                resolve_model_path(ref, spec.models)
            self.display.advance()

    def generate(self, samples: Sequence[ShardPlan] | None = None, stage: str = "teacher shards") -> None:
        """Every teacher shard of `samples` (default: the plan's), one sample after another."""
        from specray.teacher.shards import generate_shards

        self.release_pool()  # the teacher pool needs the CPUs (or GPUs) an eval pool would be holding
        samples = self.plan.shards if samples is None else samples
        sizes = [len(s.examples) * len(s.keys) for s in samples]
        with self.display.stage(stage, sum(sizes), "response"):
            for i, sample in enumerate(samples):
                offset = sum(sizes[:i])

                def counts(done: int, total: int, reused: int = 0, offset: int = offset) -> None:
                    self.display.set_counts(offset + done, sum(sizes), reused)

                generate_shards(
                    sample.spec, sample.examples, sample.keys, show_progress=False, on_progress=counts
                )

    @property
    def prompts(self) -> dict[str, list[list[int]]]:
        """Token ids of every prompt set of the plan (a later turn holds the target's earlier answers,
        decoded once and cached under the plan's answers key)."""
        if self._prompts is None:
            plan = self.plan
            tokenizer = load_tokenizer(plan.target_path, plan.spec.models.target.trust_remote_code)
            self._prompts = {name: encode(plan, p, tokenizer) for name, p in plan.prompt_sets.items()}
        return self._prompts

    # ------------------------------------------------------------ distillation

    def distill(self, drafts: Sequence[Draft], on_done: DraftDone, stage: str = "distill") -> None:
        """Distill every draft not published under its key; `on_done(draft, curves, reused)` once per draft,
        on this thread, as each is found finished or published. Drafts go to Train runs side by side
        (`train_runs`), each run distilling its share one after another (`split_runs`); their curve points
        and publications come straight from the workers' one queue (`ray_train.distill_runs`)."""
        from specray.distill.checkpoints import is_finished
        from specray.distill.ray_train import distill_runs

        spec, display = self.plan.spec, self.display
        with display.stage(stage, len(drafts), "draft"):
            todo = {d.name: d for d in drafts if not is_finished(d.folder, d.key)}
            if todo:
                self.release_pool()
            for draft in drafts:
                if draft.name not in todo:
                    on_done(draft, read_curves(draft.folder), True)
                    display.advance(reused=True)

            def note(name: str, curve: CurvePoint) -> None:
                train = todo[name].train_spec  # the spec it trains under
                display.note(curve_note(name, curve, train.distill.steps, train.eval.temperatures))

            def published(name: str) -> None:
                draft = todo[name]
                on_done(draft, read_curves(draft.folder), False)
                display.advance()

            runs = split_runs(drafts, train_runs(spec, drafts))
            lanes = [lane for lane in runs if any(d.name in todo for d in lane)]
            if lanes:  # a failed run stops the driver once the others end; published drafts stay published
                distill_runs(spec, lanes, self.plan.splits, note, published)
        remove_stale_work(drafts)

    # ------------------------------------------------------------ evaluation

    def pool(self) -> EvalPool:
        """The eval pool over every prompt set of the plan, started on first use."""
        if self._pool is None:
            plan = self.plan
            examples = {name: list(p.examples) for name, p in plan.prompt_sets.items()}
            settings = eval_settings(plan.spec.eval)
            self._pool = make_eval_pool(
                plan.spec,
                plan.target_path,
                self.prompts,
                settings,
                target_id=plan.target_id,
                examples=examples,
            )
        return self._pool

    def release_pool(self) -> None:
        """Close the eval pool (the next evaluation starts it again): its actors hold the CPUs (or GPUs)
        that Train workers, Tune trials and the teacher pool need — a driver that evaluates before it trains
        or generates (the tune search, then its controls' samples) would otherwise wait for them forever on a
        machine the pool fills (2 cores, `eval.replicas` 2)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def time_steps(self) -> StepCosts:
        """The step costs: the spec's fixed c, those saved under the plan's key, or timed now on an eval
        actor with the un-distilled draft at every γ and B of the grid (and saved under that key)."""
        plan, e = self.plan, self.plan.spec.eval
        with self.display.stage("step costs", 1, "measurement"):
            _, known = step_costs_stage(plan)
            reused = known is not None
            if known is None:
                log.info("timing decoding steps on an eval actor (γ %s, B %s)", e.gamma, e.batch_sizes)
                measured = self.pool().measure_step_costs(
                    plan.student_path, list(e.batch_sizes), list(e.gamma)
                )
                known = replace(measured, key=plan.step_costs_key, key_inputs=dict(plan.step_costs_inputs))
                log.info("%s", known.describe())
            if (
                known.key and not step_costs_file(plan.folder, known.key).exists()
            ):  # measured, or another sweep's
                write_json(step_costs_file(plan.folder, known.key), known.to_json())
            self.display.advance(reused=reused)
        return known

    def evaluate(
        self,
        jobs: Sequence[EvalJob],
        costs: StepCosts,
        on_records: RecordsDone,
        folder: Path | None = None,
        stage: str = "eval",
        saved: Mapping[str, CellRecord] | None = None,
    ) -> list[CellRecord]:
        """Every cell of `jobs`: read back where saved under its key in `folder` (default: the sweep's
        cells; `saved`: its records as the survey read them), else evaluated by the pool and saved as it
        ends, labelled with its prompts' categories.
        `on_records(records, saved)` gets the saved records first, then each pass's as it ends. Returns a
        record per job, in order, under the draft name the job gives."""
        folder = folder or self.plan.folder / CELLS_DIR
        sets = self.plan.prompt_sets
        categories = {name: list(p.categories) for name, p in sets.items() if p.categories}
        conversations = {name: list(p.conversations) for name, p in sets.items() if p.categories}

        def labelled(record: CellRecord) -> CellRecord:
            return with_categories(record, categories, conversations)

        with self.display.stage(stage, len(jobs), "cell"):
            found = read_cells(folder) if saved is None else saved
            saved = {key: labelled(record) for key, record in found.items()}
            survey, todo = cell_stage(jobs, saved, folder)
            for key in {
                job.key for job in jobs if job.key in saved
            }:  # another sweep's: into this one's folder
                if not (folder / f"{key}.json").exists():
                    write_json(folder / f"{key}.json", found[key].to_json(), indent=None)
            on_records([replace(saved[job.key], draft=job.draft) for job in jobs if job.key in saved], True)
            self.display.advance(survey.reused, reused=True)

            def on_result(records: list[CellRecord]) -> None:
                records = [labelled(record) for record in records]
                for record in records:
                    write_json(folder / f"{record.key}.json", record.to_json(), indent=None)
                    saved[record.key] = record
                on_records(records, False)
                self.display.advance(len(records))

            if todo:
                pool = self.pool()
                pool.step_costs = costs
                per_pass = self.plan.spec.eval.drafts_per_pass
                pool.run(passes(todo, per_pass), on_result=on_result, show_progress=False)
        # a record is found by its key; the draft it names is this run's name for it (the same weights may
        # have been evaluated under another name: `online/tau_kd=1` before it was `online/tau_kd=1/fkl/gkd`)
        return [replace(saved[job.key], draft=job.draft) for job in jobs]

    def target_outputs(self) -> dict[str, dict[float, list[list[int]]]]:
        """The target's cached test outputs (response token ids) per test set and τ_dec, where decoded."""
        from specray.devices import device_kind
        from specray.specdec.evaluator import continuations_file, default_continuations_dir

        spec = self.plan.spec
        settings, device = eval_settings(spec.eval), device_kind(spec.eval.num_gpus)
        outputs: dict[str, dict[float, list[list[int]]]] = {}
        for test_set in spec.eval.test_sets:
            for tau in spec.eval.temperatures:
                prompts = self.prompts[test_set]
                path = continuations_file(
                    default_continuations_dir(), self.plan.target_id, prompts, tau, settings, device
                )
                if path.exists():
                    outputs.setdefault(test_set, {})[tau] = json.loads(path.read_text())["responses"]
        return outputs


def encode(
    plan: SweepPlan, prompt_set: PromptSet, tokenizer: PreTrainedTokenizerBase, target_path: str | None = None
) -> list[list[int]]:
    """Token ids of a prompt set's prompts (`data.templates.encode_prompts`); a later turn's prompt holds the
    target's own greedy answers to the turns before it, decoded once (by the target at `target_path`,
    default the plan's) and cached under the plan's key."""
    spec, key, target = plan.spec, prompt_set.answers_key, target_path or plan.target_path
    length, device = spec.eval.max_new_tokens, answers_device(spec)
    answers = conversation_answers(prompt_set.examples, target, key, length, device) if key else {}
    return encode_prompts(prompt_set.examples, tokenizer, spec.data, answers)


# ---------------------------------------------------------------- the one Train-run scheduler


def remove_stale_work(drafts: Sequence[Draft]) -> None:
    """Every draft of `drafts` is published: a Train run's work folder still beside them whose checkpoints
    are all of these drafts is stale, and is removed. A run removes its own when it ends; one cut short
    with its driver is resumed by the re-run only when the re-run shares the drafts out the same way
    (`split_runs`), which a re-run on a cluster of another size (a node lost and not replaced yet) does
    not: its folder would stay for good. A folder holding another draft's checkpoint is kept (another
    command's run, e.g. the sweep's beside the tune search's drafts, may still resume from it)."""
    published = {draft.key for draft in drafts}
    for folder in {draft.folder.parent for draft in drafts if draft.trained}:
        for work in folder.glob(".*.work"):
            tags = work.glob("*/checkpoint_*/fingerprint.txt")  # Ray Train's checkpoints: whose draft
            if {tag.read_text().strip() for tag in tags} <= published:
                shutil.rmtree(work, ignore_errors=True)


def train_runs(spec: SweepSpec, drafts: Sequence[Draft]) -> int:
    """How many Train runs share the drafts: `distill.runs` if set, else one per RUN_START_STEPS of their
    work; at least one, at most as many as fit side by side (`concurrent_runs`). A function of all the
    stage's drafts, finished or not, so that a re-run finds the same runs (`split_runs`)."""
    fit = concurrent_runs(spec)
    if spec.distill.runs is not None:
        return min(spec.distill.runs, fit)
    return max(1, min(fit, int(sum(map(_cost, drafts)) // RUN_START_STEPS)))


def _cost(draft: Draft) -> float:
    """A draft's training cost in offline steps."""
    steps = draft.train_spec.distill.steps
    return steps * (ONLINE_STEP_COST if draft.paradigm == "online" else 1.0)


def concurrent_runs(spec: SweepSpec) -> int:
    """How many distillations fit side by side on the cluster (Ray still decides where each goes)."""
    d = spec.distill
    cpus = ray.cluster_resources().get("CPU", 1.0)
    per_run = max(d.workers * d.num_cpus_per_worker, 1e-9)
    gpus = ray.cluster_resources().get("GPU", 0.0)
    by_gpu = gpus / (d.workers * d.num_gpus_per_worker) if d.num_gpus_per_worker else float("inf")
    return max(1, int(min(cpus / per_run, by_gpu)))


def split_runs(drafts: Sequence[Draft], runs: int) -> list[list[Draft]]:
    """The drafts shared out among `runs` Train runs, each list in the order its run trains them.

    Longest first onto the least loaded run (LPT: the last draft to end is a short one, and the runs end
    close together), a draft's cost estimated as its steps, an online step counting ONLINE_STEP_COST
    offline ones (it also samples from the student and runs the teacher). The same drafts and run count
    always give the same runs, which is what lets a re-run after the driver died find each run's folder
    and resume it (`ray_train.distill_runs`); drafts that are finished are skipped inside their run."""
    lanes: list[list[Draft]] = [[] for _ in range(max(1, min(runs, len(drafts))))]
    loads = [0.0] * len(lanes)
    for draft in sorted(drafts, key=lambda d: (-_cost(d), d.name)):
        lightest = loads.index(min(loads))
        lanes[lightest].append(draft)
        loads[lightest] += _cost(draft)
    return [lane for lane in lanes if lane]
