"""The whole sweep: every section, and the checks that span several of them."""

from __future__ import annotations

from pydantic import Field, model_validator

from specray.config.base import Frozen
from specray.config.data import DataSpec
from specray.config.evaluation import EvalSpec, TuneSpec, WorkloadSpec
from specray.config.models import ModelsSpec
from specray.config.presets import source_name
from specray.config.stages import DistillSpec, TeacherSpec
from specray.config.vocabulary import SPEC_BENCH_CATEGORIES, resolve_categories


class TrackingSpec(Frozen):
    uri: str = "sqlite:///mlflow.db"
    experiment: str | None = Field(default=None, description="None = the sweep's name")


class RaySpec(Frozen):
    address: str | None = Field(default=None, description="None = start a local Ray")
    num_cpus: int | None = Field(default=None, ge=1)


class SweepSpec(Frozen):
    """Everything one sweep needs. `name` becomes the MLflow experiment and the output folder."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    output_dir: str = "outputs"
    models: ModelsSpec
    data: DataSpec
    teacher: TeacherSpec
    distill: DistillSpec = DistillSpec()
    eval: EvalSpec
    tune: TuneSpec = TuneSpec()
    tracking: TrackingSpec = TrackingSpec()
    ray: RaySpec = RaySpec()

    @model_validator(mode="after")
    def _cross_checks(self) -> SweepSpec:
        missing = sorted(set(self.eval.empirical_temperatures) - set(self.eval.temperatures))
        if missing:
            raise ValueError(f"eval.empirical_temperatures {missing} are not in eval.temperatures")
        unnamed = [t for t in self.eval.test_sets if t not in self.data.test_set_names]
        if unnamed:
            raise ValueError(
                f"eval.test_sets {unnamed} are not test sets; allowed: {', '.join(self.data.test_set_names)} "
                "(name more under data.test_sets)"
            )
        if self.eval.workload is not None:
            self._check_workload(self.eval.workload)
        max_model_len = self.teacher.vllm.max_model_len
        needed = self.data.max_prompt_tokens + self.teacher.max_new_tokens
        if self.teacher.engine == "vllm" and max_model_len is not None and max_model_len < needed:
            # vLLM would end such a response at the context limit with finish reason "length", which a
            # shard could not tell from max_new_tokens
            raise ValueError(
                f"teacher.vllm.max_model_len {max_model_len} is below data.max_prompt_tokens + "
                f"teacher.max_new_tokens = {needed}"
            )
        for mixture in self.distill.mixtures:
            unknown = sorted(set(mixture.weights) - set(self.teacher.temperatures))
            if unknown:
                raise ValueError(f"distill.mixtures uses τ_kd {unknown} not in teacher.temperatures")
        if self.tune.onpolicy_fractions and not self.distill.reads_onpolicy_fraction:
            raise ValueError(
                f"tune.onpolicy_fractions searches λ, but distill.data_sources "
                f"{self.distill.model_dump(mode='json')['data_sources']} does not read it "
                "(only the presets tempspec and tempspec_teacher do)"
            )
        return self

    def _check_workload(self, workload: WorkloadSpec) -> None:
        """A workload names an evaluated test set with categories, gives every category of it a
        temperature on the τ_dec grid, and weighs only those categories."""
        if workload.test_set not in self.eval.test_sets:
            raise ValueError(
                f"eval.workload.test_set {workload.test_set!r} is not in eval.test_sets {self.eval.test_sets}"
            )
        source = self.data.test_source(workload.test_set)
        if not source.has_categories:
            raise ValueError(
                f"eval.workload.test_set {workload.test_set!r} has no categories (a {source.kind} source); "
                "a workload needs a spec_bench source"
            )
        categories = resolve_categories(source.categories) or SPEC_BENCH_CATEGORIES
        table = workload.table
        missing = [c for c in categories if c not in table]
        if missing:
            raise ValueError(
                f"eval.workload.temperatures has no temperature for categories {missing} of test set "
                f"{workload.test_set!r}; narrow its source's categories or add them"
            )
        off_grid = sorted({table[c] for c in categories} - set(self.eval.temperatures))
        if off_grid:
            raise ValueError(
                f"eval.workload.temperatures {off_grid} are not in eval.temperatures "
                f"{self.eval.temperatures}: add them, so every category's cells exist"
            )
        if isinstance(workload.weights, dict) and set(workload.weights) != set(categories):
            raise ValueError(
                f"eval.workload.weights must name exactly the categories {list(categories)} "
                f"(got {sorted(workload.weights)})"
            )

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name

    def for_paradigm(self, paradigm: str) -> SweepSpec:
        """The spec one draft of `paradigm` trains under: `distill.steps` is that paradigm's steps and
        `online_steps` is resolved away, so the loop, its checkpoints and the draft's key read one number."""
        steps = self.distill.steps_for(paradigm)
        if steps == self.distill.steps and self.distill.online_steps is None:
            return self
        distill = self.distill.model_copy(update={"steps": steps, "online_steps": None})
        return self.model_copy(update={"distill": distill})

    def for_variant(self, divergence: str, data_source: str) -> SweepSpec:
        """The spec one online draft of DistillSpec's grid trains under: `distill.divergence` and
        `distill.data_sources` the single values named (a data source by its `source_name`): a draft of a
        list has the key of the one-value spec with its values (the cache knows it)."""
        d = self.distill
        sources = {source_name(s): s for s in d.data_source_list}
        if divergence not in d.divergences or data_source not in sources:
            raise ValueError(
                f"({divergence}, {data_source}) is not a draft of this sweep: distill.divergence "
                f"{d.divergences}, distill.data_sources {list(sources)}"
            )
        if not d.varies_divergence and not d.varies_data_source:
            return self  # its own one value of each: nothing to change
        update = {"divergence": divergence, "data_sources": sources[data_source]}
        return self.model_copy(update={"distill": d.model_copy(update=update)})

    def for_draft(
        self, paradigm: str, replicate: int = 0, divergence: str = "", data_source: str = ""
    ) -> SweepSpec:
        """The spec one draft trains under: its paradigm's steps, its replicate's seeds and (online, in
        DistillSpec's grid) its divergence and data source ("" = the spec's only one)."""
        spec = self.for_paradigm(paradigm)
        if paradigm == "online" and (divergence or data_source):
            d = spec.distill
            one_source = source_name(d.data_source_list[0])
            spec = spec.for_variant(divergence or d.divergences[0], data_source or one_source)
        return spec.for_replicate(replicate)

    def for_replicate(self, replicate: int) -> SweepSpec:
        """The spec training replicate `replicate` of a draft trains under: `distill.seed` + r, and with
        `teacher.replicate_shards` its shards sampled with `teacher.seed` + r. Replicate 0 is the spec
        itself, so its draft keeps the key (and the cache) of a run without replicates. An offset rather
        than a hash: replicate 1 of seed 0 is the draft of seed 1, and the cache knows it."""
        if replicate == 0:
            return self
        if replicate < 0:
            raise ValueError(f"replicate {replicate}: replicates are numbered from 0")
        distill = self.distill.model_copy(update={"seed": self.distill.seed + replicate})
        update: dict[str, object] = {"distill": distill}
        if self.teacher.replicate_shards:
            update["teacher"] = self.teacher.model_copy(update={"seed": self.teacher.seed + replicate})
        return self.model_copy(update=update)
