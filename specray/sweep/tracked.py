"""What the sweep and the tune search log of their stages to MLflow (the calls are in `specray.tracking`):
the datasets as the plan keys them, a child run per draft, each finished draft's curves, convergence
metrics, datasets and model, and each cell's metrics on its draft's run — each once, so a driver that died
between any two is resumed by logging only what is missing (a record saved but not logged is backfilled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from specray.config import SourceSpec
from specray.data.shards import shard_dir
from specray.data.splits import fingerprint
from specray.distill.convergence import convergence_metrics
from specray.distill.curves import CurvePoint, curves_to_json
from specray.draft import Draft
from specray.specdec.records import CellRecord
from specray.sweep.plan import ShardPlan, SweepPlan
from specray.tracking.client import Tracker
from specray.tracking.lineage import DatasetRef, SweepData, draft_model, draft_note
from specray.tracking.names import CellAxes, cell_metrics


def sweep_data(plan: SweepPlan, sample: ShardPlan | None = None) -> SweepData:
    """The sweep's datasets, keyed as the caches key them: the train prompts, the shards of one teacher
    sample (default: the first) and the test sets."""
    sample = sample or plan.shards[0]
    train, spec = sample.examples, plan.spec
    shards = {
        tau: DatasetRef(f"teacher τ_kd={tau:g}", key.digest, "training", str(shard_dir(key)), len(train))
        for tau, key in sample.keys.items()
    }
    tests = []
    for test_set in spec.eval.test_sets:
        prompts = plan.prompt_sets[test_set]
        where, kind = _source(spec.data.test_source(test_set))
        tests.append(
            DatasetRef(f"{test_set} test", prompts.key, "evaluation", where, len(prompts.examples), kind)
        )
    where, kind = _source(spec.data.train)
    train_ref = DatasetRef("train prompts", fingerprint(train), "generation", where, len(train), kind)
    return SweepData(train_ref, shards, tuple(tests))


def _source(source: SourceSpec) -> tuple[str, str]:
    """(where the examples come from, MLflow's source type) for a data source."""
    if source.kind == "synthetic":
        families = ",".join(source.families) if source.families else "in-domain"
        return f"specray synthetic corpus (size {source.size}, seed {source.seed}, {families})", "code"
    path = str(source.path)
    return (str(Path(path).absolute()), "local") if Path(path).exists() else (path, "hugging_face")


def log_missing(tracker: Tracker, run_id: str, metrics: Mapping[str, float]) -> None:
    """`metrics` on `run_id`, except those it has already: a driver that died after logging them, before
    it marked the run finished, is resumed without logging them a second time."""
    have = tracker.metric_keys(run_id)
    tracker.log_metrics(run_id, {name: value for name, value in metrics.items() if name not in have})


class DraftRuns:
    """The child runs of one parent run, by draft name."""

    def __init__(self, tracker: Tracker, parent: str, plan: SweepPlan) -> None:
        self.tracker, self.parent, self.plan = tracker, parent, plan
        self.runs: dict[str, str] = {}
        self.axes = CellAxes.of(plan.spec)
        self.tests = sweep_data(plan).tests

    def open(self, drafts: Sequence[Draft], tags: Mapping[str, str] | None = None) -> None:
        """A child run per draft (found again by its draft key on a resumed run)."""
        for draft in drafts:
            note = draft_note(self.plan.spec, draft)
            all_tags = draft.tags | dict(tags or {})
            self.runs[draft.name] = self.tracker.child_run(self.parent, draft.name, draft.key, all_tags, note)
            if not draft.trained:
                self.tracker.log_datasets(self.runs[draft.name], self.tests)

    def datasets(self, draft: Draft) -> list[DatasetRef]:
        """What a draft used: the shards it trained on and the test sets."""
        rows = len(self.plan.splits["train"])
        shards = [
            DatasetRef(f"teacher τ_kd={tau:g}", key.digest, "training", str(shard_dir(key)), rows)
            for tau, key in sorted(draft.shards.items())
        ]
        return [*shards, *self.tests]

    def draft_done(self, draft: Draft, curves: list[CurvePoint], reused: bool = False) -> None:
        """A finished draft's curves, the trend of its probe's acceptance, the datasets it used and the draft
        as a logged model, each logged once (`reused` drafts are logged only where missing, like the rest)."""
        run_id, tracker = self.runs[draft.name], self.tracker
        logged = tracker.metric_keys(run_id)
        if "loss" not in logged:
            tracker.log_curves(run_id, curves_to_json(curves))
        trend = convergence_metrics(curves)  # the last window's slope of the probe's acceptance
        if trend and not set(trend) <= logged:
            tracker.log_metrics(run_id, trend)
        tracker.log_datasets(run_id, self.datasets(draft))
        tracker.log_draft_model(run_id, draft_model(draft))

    def records_done(self, records: Sequence[CellRecord], saved: bool = False) -> None:
        """Each record's metrics on its draft's run; `saved` records (found on disk) only where missing."""
        logged: dict[str, set[str]] = {}
        for record in records:
            run_id = self.runs.get(record.draft)
            if run_id is None:
                continue
            metrics = cell_metrics(record, axes=self.axes)
            if saved:
                have = logged.setdefault(record.draft, self.tracker.metric_keys(run_id))
                if set(metrics) <= have:
                    continue
            self.tracker.log_metrics(run_id, metrics)

    def finish(self) -> None:
        for run_id in self.runs.values():
            self.tracker.finish(run_id)
