"""The sections of the stages that make drafts: `teacher` (the shards) and `distill` (the training)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from specray.config.base import (
    LIST_TAG,
    MAX_TEMPERATURE,
    ONE_TAG,
    Divergence,
    DType,
    Frozen,
    Paradigm,
    Temperature,
    unique_sorted,
)
from specray.config.presets import (
    DATA_PRESETS,
    DEFAULT_PRESET,
    DataPresetName,
    DataSources,
    DataSourcesField,
    resolve_sources,
    source_name,
)

# What vLLM's `SamplingParams` does with a temperature (vllm 0.33.0, `sampling_params.py`): τ > 2 is
# rejected, and 0 < τ < 0.01 is silently raised to 0.01. A shard records the τ it asked for, so both are
# refused here, before any replica loads a model.
VLLM_MAX_TEMPERATURE = 2.0


VLLM_MIN_POSITIVE_TEMPERATURE = 0.01


class VllmSpec(Frozen):
    tensor_parallel_size: int = Field(default=1, ge=1)
    dtype: DType = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=16)
    # VLLM_BATCH_INVARIANT=1 in each replica: a request's logits do not depend on the other requests in
    # its batch (vLLM implements it on CUDA compute capability 8.x, 9.x and 10.x, and on ROCm)
    batch_invariant: bool = True


class TeacherSpec(Frozen):
    """The teacher generator pool: samples one response per train prompt at every τ_kd."""

    engine: Literal["transformers", "vllm"] = "transformers"
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=32, ge=1)
    max_new_tokens: int = Field(default=128, ge=1)
    temperatures: list[Temperature] = Field(min_length=1, description="the τ_kd grid")
    seed: int = 0
    replicate_shards: bool = Field(
        default=False,
        description="training replicate r > 0 (distill.replicates) also gets its own teacher sample: "
        "shards sampled with teacher.seed + r (replicate 0 keeps the shards of teacher.seed)",
    )
    vllm: VllmSpec = VllmSpec()

    @field_validator("temperatures")
    @classmethod
    def _sorted_unique(cls, v: list[float]) -> list[float]:
        return unique_sorted(v, "temperatures")

    @model_validator(mode="after")
    def _vllm_gpus_match_tensor_parallel(self) -> TeacherSpec:
        tp = self.vllm.tensor_parallel_size
        if self.engine == "vllm" and self.num_gpus != tp:
            raise ValueError(
                f"num_gpus ({self.num_gpus:g}) must equal vllm.tensor_parallel_size ({tp}) for the vllm "
                "engine: each replica holds one model over that many GPUs"
            )
        if self.engine == "vllm":
            refused = [t for t in self.temperatures if not vllm_accepts_temperature(t)]
            if refused:
                raise ValueError(
                    f"temperatures {refused} cannot be sampled by the vllm engine: vLLM takes 0 (greedy) or "
                    f"{VLLM_MIN_POSITIVE_TEMPERATURE:g} <= τ <= {VLLM_MAX_TEMPERATURE:g} (it rejects τ > "
                    f"{VLLM_MAX_TEMPERATURE:g} and raises smaller positive τ to "
                    f"{VLLM_MIN_POSITIVE_TEMPERATURE:g}); use teacher.engine=transformers for these"
                )
        return self


def vllm_accepts_temperature(tau: float) -> bool:
    """Whether vLLM samples at exactly `tau`: greedy at 0, else within its accepted range."""
    return tau == 0.0 or VLLM_MIN_POSITIVE_TEMPERATURE <= tau <= VLLM_MAX_TEMPERATURE


class Mixture(Frozen):
    """A composition recipe: training data drawn from several τ_kd shards with these weights."""

    weights: dict[Temperature, float] = Field(min_length=1)

    @field_validator("weights")
    @classmethod
    def _positive(cls, v: dict[float, float]) -> dict[float, float]:
        if any(w <= 0 for w in v.values()):
            raise ValueError(f"mixture weights must be > 0, got {v}")
        return v


def _one_or_list(value: Any) -> str:
    return LIST_TAG if isinstance(value, list | tuple) else ONE_TAG


# `distill.divergence` and `distill.data_sources`: one value, or a list of them (DistillSpec's grid axes).
# The tags show in no error path (`config/loading.py` drops them): distill.divergence.1 names the list's
# second item, distill.data_sources.preset a bad single preset as before.
DivergenceAxis = Annotated[
    Union[Annotated[Divergence, Tag(ONE_TAG)], Annotated[list[Divergence], Tag(LIST_TAG)]],  # noqa: UP007
    Discriminator(_one_or_list),
]
DataSourcesAxis = Annotated[
    Union[  # noqa: UP007
        Annotated[DataPresetName, Tag("preset")],
        Annotated[DataSources, Tag("fractions")],
        Annotated[list[DataSourcesField], Tag(LIST_TAG)],
    ],
    Discriminator(
        lambda v: "preset" if isinstance(v, str) else _one_or_list(v).replace(ONE_TAG, "fractions")
    ),
]


class DistillSpec(Frozen):
    paradigms: list[Paradigm] = Field(default=["offline", "online"], min_length=1)
    divergence: DivergenceAxis = Field(
        default="fkl",
        description="online loss: fkl, rkl, jsd, tvd; one or a list (a grid axis: one online draft each)",
    )
    jsd_beta: float = Field(default=0.5, gt=0.0, lt=1.0)
    onpolicy_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0, description="λ: share of student samples (tempspec presets)"
    )
    data_sources: DataSourcesAxis = Field(
        default=DEFAULT_PRESET,
        description="online batches: a preset of specray/config/presets.py or {fixed: λ1, student: λ2}; "
        "one or a list (a grid axis: one online draft each)",
    )
    loss_temperature: float = Field(default=1.0, gt=0.0, le=MAX_TEMPERATURE)
    loss_averaging: Literal["token", "sequence"] = Field(
        default="token",
        description="token: mean over all response tokens; sequence: mean within each response, then "
        "over responses (DistillSpec Eq. 2)",
    )
    loss_chunk_size: int = Field(
        default=256,
        ge=0,
        description="response tokens per LM-head chunk: the heads run on response positions only and "
        "the [batch, seq, vocab] logits are never built (large vocabularies); same loss up to fp "
        "round-off; 0 = full logits at every position (models whose logits are not their head applied "
        "to the final hidden state)",
    )
    teacher_cache_mb: float = Field(
        default=1024,
        ge=0,
        description="online: keep the teacher's hidden states of rows that never change (teacher and "
        "ground-truth responses), computed once per run, if they fit in this many MB, and with what is "
        "left the teacher's KV caches of the prompts (a student sample's teacher pass then covers its "
        "response only); same loss up to fp round-off; 0 = run the teacher on every row every step",
    )
    steps: int = Field(default=200, ge=1, description="optimizer steps per draft")
    online_steps: int | None = Field(
        default=None,
        ge=1,
        description="optimizer steps of online drafts; None = steps. Online batches hold fresh student "
        "samples every step, so an online draft keeps improving after an offline one (a fixed set of "
        "teacher responses) has plateaued",
    )
    batch_size: int = Field(default=16, ge=1)
    grad_accum: int = Field(default=1, ge=1)
    lr: float = Field(default=5e-4, gt=0.0, le=1.0)
    warmup_steps: int = Field(default=10, ge=0)
    weight_decay: float = Field(default=0.0, ge=0.0)
    max_grad_norm: float = Field(default=1.0, gt=0.0)
    max_new_tokens: int = Field(default=64, ge=1, description="length of on-policy student samples")
    workers: int = Field(default=1, ge=1)
    num_cpus_per_worker: float = Field(default=1.0, ge=0)
    num_gpus_per_worker: float = Field(default=0.0, ge=0)
    cpu_autocast: bool = Field(
        default=False,
        description="train under bf16 autocast on the CPU too (on CUDA it always is): about twice as fast "
        "where the CPU has bf16 matmul units (avx512_bf16, AMX), slower where it has not",
    )
    runs: int | None = Field(
        default=None,
        ge=1,
        description="at most this many Ray Train runs side by side, each distilling its share of the drafts "
        "one after another; None = as many as fit and the work is worth (a run's start costs about as much "
        "as a few hundred steps of a tiny draft)",
    )
    checkpoint_every: int = Field(default=100, ge=1)
    report_every: int = Field(default=25, ge=1)
    mixtures: list[Mixture] = Field(default=[], description="extra composition recipes to distill")
    seed: int = 0
    replicates: int = Field(
        default=1,
        ge=1,
        description="training replicates of every distilled draft: replicate r trains with distill.seed + r "
        "(data order, on-policy samples, source positions); replicate 0 is the draft of a run without "
        "replicates",
    )

    @field_validator("divergence", "data_sources")
    @classmethod
    def _one_value_or_distinct_list(cls, v: Any) -> Any:
        """A list of one is that value (its drafts keep the names and keys of a one-value spec); a list
        names each value once."""
        if not isinstance(v, list):
            return v
        if not v:
            raise ValueError("needs at least one value")
        names = [source_name(item) for item in v]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return v[0] if len(v) == 1 else v

    @property
    def divergences(self) -> list[str]:
        """The divergences of the online drafts: one, or the grid axis."""
        return list(self.divergence) if isinstance(self.divergence, list) else [self.divergence]

    @property
    def data_source_list(self) -> list[str | DataSources]:
        """The data sources of the online drafts: one, or the grid axis."""
        value = self.data_sources
        return list(value) if isinstance(value, list) else [value]

    @property
    def varies_divergence(self) -> bool:
        return len(self.divergences) > 1

    @property
    def varies_data_source(self) -> bool:
        return len(self.data_source_list) > 1

    def grid_axes_problems(self, command: str) -> list[str]:
        """Why `command`, which trains one online draft per recipe, cannot take this spec's lists."""
        listed = {"divergence": self.varies_divergence, "data_sources": self.varies_data_source}
        return [
            f"distill.{field}: {command} trains one value; the list is a grid axis of specray run "
            f"(give one, e.g. distill.{field}={self.divergences[0] if field == 'divergence' else 'gkd'})"
            for field, varied in listed.items()
            if varied
        ]

    @property
    def draft_divergence(self) -> str:
        """The one divergence a draft trains with; a list is a grid, trained one value at a time
        (`SweepSpec.for_variant`)."""
        if isinstance(self.divergence, list):
            raise ValueError(
                f"distill.divergence {self.divergence} is a grid axis: one draft trains one divergence "
                "(specray run trains each; other commands take one value)"
            )
        return self.divergence

    def steps_for(self, paradigm: str) -> int:
        """The optimizer steps a draft of this paradigm trains."""
        return (self.online_steps or self.steps) if paradigm == "online" else self.steps

    @property
    def sources(self) -> DataSources:
        """The online paradigm's fractions, a preset resolved with λ = onpolicy_fraction (one draft's: a
        list is a grid, trained one value at a time, `SweepSpec.for_variant`)."""
        if isinstance(self.data_sources, list):
            names = [source_name(s) for s in self.data_sources]
            raise ValueError(
                f"distill.data_sources {names} is a grid axis: one draft trains one data source "
                "(specray run trains each; other commands take one value)"
            )
        return resolve_sources(self.data_sources, self.onpolicy_fraction)

    @property
    def reads_onpolicy_fraction(self) -> bool:
        """Whether λ = onpolicy_fraction changes the batches (only the tempspec presets read it)."""
        return any(isinstance(s, str) and DATA_PRESETS[s].reads_lambda for s in self.data_source_list)
