"""Sweep specs: typed, frozen, validated once at the edge.

A sweep is one YAML file under `sweeps/`. Any mapping in it may pull in a reusable part from `configs/`
with an `include:` key (a path relative to the including file, or to the working directory); the keys next
to `include:` override the included ones. `key=value` overrides from the CLI are applied last
(`eval.gamma=3`, `teacher.temperatures=[0.0,0.5]`). Every bad value fails here, before any work starts, with
its field path and what is allowed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from specray.errors import SpecError
from specray.kd_presets import DATA_PRESETS, DEFAULT_PRESET, DataSources, DataSourcesField, resolve_sources

# τ is a softmax temperature; 0 means greedy. Above 5 a 32k-vocab softmax is near uniform, so a larger
# value is almost certainly a typo (the paper's out-of-range study stops at 2.0).
MAX_TEMPERATURE = 5.0
Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]
Paradigm = Literal["offline", "online"]
Divergence = Literal["fkl", "rkl", "jsd", "tvd"]
Estimator = Literal["analytic", "empirical"]
TestSet = Literal["in_domain", "out_of_domain"]
DType = Literal["auto", "float32", "bfloat16", "float16"]
LenienceFunction = Literal["lin", "sq", "exp"]  # specray/ops/lenience.py: p/ε, p/ε², p^ε


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _unique_sorted(values: Sequence[float], field: str) -> list[float]:
    if len(set(values)) != len(values):
        raise ValueError(f"{field} has duplicates: {list(values)}")
    return sorted(values)


# ---------------------------------------------------------------- models


class TinyLlamaSpec(_Frozen):
    """Shape of one tiny Llama-architecture model of the zoo."""

    hidden_size: int = Field(ge=8)
    num_layers: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    train_steps: int = Field(ge=1, description="optimizer steps of pre-training")
    lr: float = Field(gt=0, le=1.0)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> TinyLlamaSpec:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        return self


class ZooSpec(_Frozen):
    """Recipe of the tiny zoo: a BPE tokenizer, a tiny target and a much smaller draft, trained locally."""

    corpus_size: int = Field(default=20000, ge=16, description="synthetic examples to pre-train on")
    corpus_seed: int = 1234
    vocab_size: int = Field(default=1024, ge=300, le=65536)
    seq_len: int = Field(default=128, ge=16, le=4096, description="packed pre-training sequence length")
    batch_size: int = Field(default=32, ge=1)
    target: TinyLlamaSpec = TinyLlamaSpec(
        hidden_size=256, num_layers=6, num_heads=8, intermediate_size=688, train_steps=240, lr=2e-3
    )
    # The draft sees only ground-truth responses, briefly: the role llama-68m plays for Llama-2 in the paper.
    # One layer: on CPU a tiny model's step is mostly per-layer overhead, so the cost ratio c follows the
    # layer counts rather than the parameter counts; real draft/target pairs have a much smaller c than a
    # tiny CPU pair, hence eval.projected_cost_ratio.
    draft: TinyLlamaSpec = TinyLlamaSpec(
        hidden_size=128, num_layers=1, num_heads=4, intermediate_size=344, train_steps=60, lr=3e-3
    )
    seed: int = 0


class ModelRef(_Frozen):
    """One model: an entry of the tiny zoo (`zoo: target`) or an HF hub name or local path."""

    zoo: Literal["target", "draft"] | None = None
    name_or_path: str | None = None
    dtype: DType = "auto"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _exactly_one_source(self) -> ModelRef:
        if (self.zoo is None) == (self.name_or_path is None):
            raise ValueError("set exactly one of 'zoo' (target or draft) or 'name_or_path' (HF name or path)")
        return self


class ModelsSpec(_Frozen):
    target: ModelRef
    draft: ModelRef
    zoo: ZooSpec = ZooSpec()


# ---------------------------------------------------------------- data

SourceKind = Literal["synthetic", "alpaca", "jsonl", "gsm8k", "self_instruct", "parquet"]


class SourceSpec(_Frozen):
    """Where examples come from. `synthetic` needs no path; every other kind needs `path` (a local file,
    or for `alpaca` also a hub dataset name such as tatsu-lab/alpaca)."""

    kind: SourceKind
    path: str | None = None
    split: str = "train"
    families: list[str] | None = Field(
        default=None, min_length=1, description="synthetic task families (None = in-domain)"
    )
    size: int = Field(default=4000, ge=1, description="synthetic examples to generate")
    seed: int = 0
    columns: dict[str, str] | None = Field(default=None, description="parquet: Alpaca field -> column name")

    @model_validator(mode="after")
    def _path_matches_kind(self) -> SourceSpec:
        if self.kind == "synthetic" and self.path is not None:
            raise ValueError("a synthetic source takes no 'path'")
        if self.kind != "synthetic" and not self.path:
            raise ValueError(f"a {self.kind} source needs 'path' (a local file or dataset name)")
        if self.kind == "synthetic" and self.families:
            from specray.data.synthetic import FAMILIES

            unknown = sorted(set(self.families) - set(FAMILIES))
            if unknown:
                raise ValueError(f"unknown synthetic families {unknown} (allowed: {', '.join(FAMILIES)})")
        return self


class DataSpec(_Frozen):
    """Train source split into train / validation / in-domain test; a separate out-of-domain test source."""

    train: SourceSpec
    out_of_domain: SourceSpec
    train_size: int = Field(ge=1)
    validation_size: int = Field(ge=1)
    in_domain_test_size: int = Field(ge=1)
    out_of_domain_test_size: int = Field(ge=1)
    template: Literal["alpaca"] = "alpaca"
    max_prompt_tokens: int = Field(default=256, ge=8)
    seed: int = 0


# ---------------------------------------------------------------- stages


# What vLLM's `SamplingParams` does with a temperature (vllm 0.33.0, `sampling_params.py`): τ > 2 is
# rejected, and 0 < τ < 0.01 is silently raised to 0.01. A shard records the τ it asked for, so both are
# refused here, before any replica loads a model.
VLLM_MAX_TEMPERATURE = 2.0
VLLM_MIN_POSITIVE_TEMPERATURE = 0.01


class VllmSpec(_Frozen):
    tensor_parallel_size: int = Field(default=1, ge=1)
    dtype: DType = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, ge=16)
    # VLLM_BATCH_INVARIANT=1 in each replica: a request's logits do not depend on the other requests in
    # its batch (vLLM implements it on CUDA compute capability 8.x, 9.x and 10.x, and on ROCm)
    batch_invariant: bool = True


class TeacherSpec(_Frozen):
    """The teacher generator pool: samples one response per train prompt at every τ_kd."""

    engine: Literal["transformers", "vllm"] = "transformers"
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    batch_size: int = Field(default=32, ge=1)
    max_new_tokens: int = Field(default=128, ge=1)
    temperatures: list[Temperature] = Field(min_length=1, description="the τ_kd grid")
    seed: int = 0
    vllm: VllmSpec = VllmSpec()

    @field_validator("temperatures")
    @classmethod
    def _sorted_unique(cls, v: list[float]) -> list[float]:
        return _unique_sorted(v, "temperatures")

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


class Mixture(_Frozen):
    """A composition recipe: training data drawn from several τ_kd shards with these weights."""

    weights: dict[Temperature, float] = Field(min_length=1)

    @field_validator("weights")
    @classmethod
    def _positive(cls, v: dict[float, float]) -> dict[float, float]:
        if any(w <= 0 for w in v.values()):
            raise ValueError(f"mixture weights must be > 0, got {v}")
        return v


class DistillSpec(_Frozen):
    paradigms: list[Paradigm] = Field(default=["offline", "online"], min_length=1)
    divergence: Divergence = "fkl"
    jsd_beta: float = Field(default=0.5, gt=0.0, lt=1.0)
    onpolicy_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0, description="λ: share of student samples (tempspec presets)"
    )
    data_sources: DataSourcesField = Field(
        default=DEFAULT_PRESET,
        description="online batches: a preset of specray/kd_presets.py or {fixed: λ1, student: λ2}",
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
    checkpoint_every: int = Field(default=100, ge=1)
    report_every: int = Field(default=25, ge=1)
    mixtures: list[Mixture] = Field(default=[], description="extra composition recipes to distill")
    seed: int = 0

    def steps_for(self, paradigm: str) -> int:
        """The optimizer steps a draft of this paradigm trains."""
        return (self.online_steps or self.steps) if paradigm == "online" else self.steps

    @property
    def sources(self) -> DataSources:
        """The online paradigm's fractions, a preset resolved with λ = onpolicy_fraction."""
        return resolve_sources(self.data_sources, self.onpolicy_fraction)

    @property
    def reads_onpolicy_fraction(self) -> bool:
        """Whether λ = onpolicy_fraction changes the batches (only the tempspec presets read it)."""
        return isinstance(self.data_sources, str) and DATA_PRESETS[self.data_sources].reads_lambda


class LenienceSpec(_Frozen):
    """Lossy speculative decoding (DistillSpec Algorithm A.1): accept y with min(1, f(p(y), ε) / q(y)).

    `function` and `epsilon` are grid axes like τ_dec: every (function, ε < 1) pair is a cell coordinate.
    ε = 1 is the lossless rule whatever the function, so it is one cell, not one per function. At τ_dec = 0
    lenience changes nothing (greedy verification has no ratio to relax; `specray/ops/lenience.py`), so
    lossy cells are planned only at τ_dec > 0.
    """

    function: list[LenienceFunction] = Field(
        default=["lin"], min_length=1, description="f: lin (p/ε), sq (p/ε²), exp (p^ε); one or a list"
    )
    epsilon: list[Annotated[float, Field(gt=0.0, le=1.0)]] = Field(
        default=[1.0], min_length=1, description="ε in (0, 1]; 1 = lossless; one value or a list"
    )

    @field_validator("function", "epsilon", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return v if isinstance(v, list | tuple) else [v]

    @field_validator("function")
    @classmethod
    def _functions_unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"function has duplicates: {v}")
        return v

    @field_validator("epsilon")
    @classmethod
    def _epsilons_sorted_unique(cls, v: list[float]) -> list[float]:
        return sorted(_unique_sorted(v, "epsilon"), reverse=True)  # lossless first

    def points(self, tau_dec: float) -> list[tuple[str | None, float]]:
        """The (function, ε) cells at one τ_dec: (None, 1.0) for lossless, then every lossy pair."""
        lossy = [(f, e) for f in self.function for e in self.epsilon if e < 1.0] if tau_dec > 0 else []
        return ([(None, 1.0)] if 1.0 in self.epsilon or not lossy else []) + lossy


class EvalSpec(_Frozen):
    temperatures: list[Temperature] = Field(min_length=1, description="the τ_dec grid")
    gamma: list[Annotated[int, Field(ge=1, le=64)]] = Field(
        default=[4], min_length=1, description="γ: draft tokens per block; one value or a list (a grid axis)"
    )
    repeats: int = Field(default=5, ge=1, description="R: decodes per prompt (empirical)")
    max_new_tokens: int = Field(default=128, ge=1)
    estimators: list[Estimator] = Field(default=["analytic"], min_length=1)
    empirical_temperatures: list[Temperature] = Field(default=[], description="τ_dec cells run empirically")
    empirical_prompts: int = Field(default=16, ge=1)
    empirical_drafts: Literal["all", "diagonal"] = Field(
        default="all",
        description="diagonal: only drafts with τ_kd = τ_dec, mixtures and the un-distilled one",
    )
    test_sets: list[TestSet] = Field(default=["in_domain", "out_of_domain"], min_length=1)
    lenience: LenienceSpec = Field(
        default=LenienceSpec(), description="lossy decoding grid (ε = 1: lossless)"
    )
    quality_ends: bool = Field(
        default=False,
        description="also decode each model alone at every empirical τ_dec: target-only and draft-only "
        "quality, the two ends of the quality-speedup trade-off (DistillSpec Fig. 5b)",
    )
    draft_cost_ratio: float | None = Field(default=None, ge=0.0, description="c; None = measure it")
    projected_cost_ratio: float | None = Field(
        default=None, gt=0.0, description="also report speedup_model at this c (e.g. a target pair's)"
    )
    drafts_per_pass: int = Field(
        default=8, ge=1, description="drafts an eval actor holds while streaming one target pass"
    )
    replicas: int = Field(default=1, ge=1)
    num_cpus: float = Field(default=1.0, ge=0)
    num_gpus: float = Field(default=0.0, ge=0)
    seed: int = 0

    @field_validator("temperatures")
    @classmethod
    def _sorted_unique(cls, v: list[float]) -> list[float]:
        return _unique_sorted(v, "temperatures")

    @field_validator("gamma", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return v if isinstance(v, list | tuple) else [v]  # one γ; a wrong scalar is then named as one

    @field_validator("gamma")
    @classmethod
    def _gammas_sorted_unique(cls, v: list[int]) -> list[int]:
        return _unique_sorted(v, "gamma")


class TuneSpec(_Frozen):
    """`specray tune`: a Ray Tune search over mixtures of the τ_kd shards (see specray/sweep/tune/run.py)."""

    num_samples: int = Field(default=16, ge=1)
    search: Literal["optuna", "random"] = "optuna"
    space: Literal["weights", "subset"] = "weights"
    subset_size: int = Field(default=3, ge=1)
    objective_temperatures: list[Temperature] = Field(default=[0.8, 1.0], min_length=1)
    max_concurrent_trials: int = Field(default=2, ge=1)
    asha_grace_period: int = Field(default=1, ge=1, description="in distillation reports")
    asha_reduction_factor: int = Field(default=2, ge=2)
    paradigm: Paradigm = "offline"
    steps: int | None = Field(
        default=None,
        ge=1,
        description="optimizer steps per trial and per baseline; None = distill.steps (online trials "
        "too: one budget for every trial, whatever its paradigm)",
    )
    paradigms: list[Paradigm] = Field(default=[], description="also search the paradigm; [] = `paradigm`")
    divergences: list[Divergence] = Field(default=[], description="also search the divergence (online)")
    onpolicy_fractions: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        default=[], description="also search λ (online); [] = distill.onpolicy_fraction"
    )
    manual_top_k: int = Field(default=3, ge=1, description="τ_kd in the paper's manual recipe")
    registered_model: str | None = Field(
        default=None, min_length=1, description="Model Registry name; None = <sweep name>-tuned-draft"
    )
    seed: int = 0

    @field_validator("objective_temperatures", "paradigms", "divergences", "onpolicy_fractions")
    @classmethod
    def _no_duplicates(cls, v: list, info: ValidationInfo) -> list:
        if len(set(v)) != len(v):
            raise ValueError(f"{info.field_name} has duplicates: {list(v)}")
        return v


class TrackingSpec(_Frozen):
    uri: str = "sqlite:///mlflow.db"
    experiment: str | None = Field(default=None, description="None = the sweep's name")


class RaySpec(_Frozen):
    address: str | None = Field(default=None, description="None = start a local Ray")
    num_cpus: int | None = Field(default=None, ge=1)


class SweepSpec(_Frozen):
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


# ---------------------------------------------------------------- loading


def _read_yaml(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: malformed YAML: {' '.join(str(e).split())}") from None


def _deep_merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _deep_merge(base.get(key), value) if key in base else value
        return merged
    return copy.deepcopy(over)


def _resolve_includes(node: Any, here: Path, seen: tuple[Path, ...] = ()) -> Any:
    """Replace every `include: PATH` mapping key with the file's content, overridden by the sibling keys."""
    if isinstance(node, list):
        return [_resolve_includes(item, here, seen) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _resolve_includes(value, here, seen) for key, value in node.items()}
    if "include" not in node:
        return node
    include = str(node.pop("include"))
    candidates = [here.parent / include, Path(include)]
    target = next((c.resolve() for c in candidates if c.exists()), None)
    if target is None:
        raise SpecError(f"{here}: include {include!r} not found (looked in {here.parent} and {Path.cwd()})")
    if target in seen:
        raise SpecError(f"{here}: include cycle through {target}")
    part = _resolve_includes(_read_yaml(target), target, (*seen, target))
    if not isinstance(part, dict):
        raise SpecError(f"{target}: an included part must be a mapping, got {type(part).__name__}")
    return _deep_merge(part, node)


def _apply_override(raw: dict[str, Any], override: str) -> None:
    """Apply one `dotted.key=value` override; the value is parsed as YAML (`3`, `[0.0, 0.5]`, `null`)."""
    key, sep, value = override.partition("=")
    if not sep or not key:
        raise SpecError(f"override {override!r}: expected KEY=VALUE, e.g. eval.gamma=3")
    node = raw
    parts = key.strip().split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise SpecError(f"override {override!r}: {part!r} is not a section")
    try:
        node[parts[-1]] = yaml.safe_load(value)
    except yaml.YAMLError:
        raise SpecError(f"override {override!r}: value is not valid YAML") from None


def _allowed_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str] | None:
    """Field names allowed at `loc` (the parent of an unknown key), for the error message."""
    for part in loc:
        # a list index, or the tag pydantic puts in the path of a tagged union (distill.data_sources):
        # the item's model is already selected
        if isinstance(part, int) or part not in model.model_fields:
            continue
        annotation = model.model_fields[part].annotation
        # union members may be Annotated[Model, Tag(...)]: look inside those too
        candidates = [annotation, *(get_args(a)[0] if get_args(a) else a for a in get_args(annotation))]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return sorted(model.model_fields)


def format_validation_error(error: ValidationError, source: str) -> str:
    """One line per problem: `source: field.path: what is wrong (allowed: ...)`."""
    lines = []
    for item in error.errors():
        loc = [str(p) for p in item["loc"]]
        path = ".".join(loc) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            allowed = _allowed_keys(SweepSpec, item["loc"][:-1])
            message = "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        elif "input" in item and not isinstance(item["input"], dict):
            message += f" (got {json.dumps(item['input'], default=str)})"
        lines.append(f"{source}: {path}: {message}")
    return "\n".join(lines)


def load_raw(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The sweep as a plain dict with includes resolved and overrides applied (not yet validated)."""
    path = Path(path)
    raw = _resolve_includes(_read_yaml(path), path)
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: a sweep must be a YAML mapping, got {type(raw).__name__}")
    for override in overrides:
        _apply_override(raw, override)
    return raw


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> SweepSpec:
    """Load, resolve and validate a sweep YAML; raises SpecError naming the file and every bad field."""
    raw = load_raw(path, overrides)
    try:
        return SweepSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, str(path))) from None


def validate_part(model: type[BaseModel], path: str | Path) -> BaseModel:
    """Validate one reusable part from `configs/` against its section model."""
    path = Path(path)
    raw = _resolve_includes(_read_yaml(path), path)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, str(path))) from None


def dump_spec(spec: SweepSpec) -> str:
    """The resolved spec as YAML (what `specray validate` prints and what runs save beside outputs)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
