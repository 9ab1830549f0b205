"""Result keys: every cached result is stored under a hash of everything that made it, and nothing else.

Every field of a sweep spec is classified below by what it changes (`FIELDS`); the key functions take
their direct inputs from that table, so a field classified as changing a draft or a cell is in that key by
construction, and a unit test fails naming any field that is not classified. Key inputs are flat dicts
named like the spec (`distill.divergence`), so a changed key can say why: `eval.gamma 3 → 6`.

Roles of a field:
  shard          the teacher's responses (through the shard key, `data/shards.py`)
  draft          every distilled draft's weights;  draft:online  only online drafts'
  cell           every evaluation cell;  cell:empirical / cell:analytic  one estimator's cells only
  cost_ratio     the measured step costs T_t(B, k), T_d(B) (analytic cells depend on their values)
  curves         the acceptance-vs-KD-step curves recorded while training (not the weights)
  grid           which drafts and cells exist, not what any of them holds
  tune           the `specray tune` search only;  report  the report only
  none           where or how work runs, never what it computes
A field reaches a key either as its own value (`Direct`) or through a derived input (`Via`: the zoo key,
a data split's fingerprint, the device).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specray.devices import device_kind, train_device_kind
from specray.models.sources import model_id

if TYPE_CHECKING:
    from pydantic import BaseModel

    from specray.config import ModelsSpec, SweepSpec, TeacherSpec
    from specray.data.examples import Example
    from specray.data.shards import ShardKey

KEY_FORMAT = 1  # bump when a key's recipe changes, so nothing stored under the old recipe is reused
# bump when an analytic cell record's metrics change: a record saved by older code lacks them and is
# recomputed
CELL_RECORD_FORMAT = 7
# the same for empirical cells' records only, so a change to them leaves analytic keys and caches valid
EMPIRICAL_RECORD_FORMAT = 7
# the same for analytic cells at ε < 1 only (`specdec/lossy.py`), so lossless cells' keys stay valid
LOSSY_ANALYTIC_FORMAT = 2
# bump when the step costs' measurement changes what it times
STEP_COSTS_FORMAT = 2


@dataclass(frozen=True)
class Direct:
    """The field's own value is a key input of every result with one of `roles`."""

    roles: frozenset[str]


@dataclass(frozen=True)
class Via:
    """The field reaches the keys of `roles` through a derived input named `through`."""

    roles: frozenset[str]
    through: str


def _direct(*roles: str) -> Direct:
    return Direct(frozenset(roles))


def _via(through: str, *roles: str) -> Via:
    return Via(frozenset(roles), through)


NONE = _direct("none")
TARGET = _via("target id", "shard", "draft:online", "cell", "cost_ratio")
STUDENT = _via("student id", "draft", "cell", "cost_ratio")
ZOO = _via("zoo key (target and student ids)", "shard", "draft", "cell", "cost_ratio")
SPLITS = _via("split fingerprints (train, validation and test sets)", "shard", "draft", "cell")
OOD = _via("out-of-domain test prompts fingerprint", "cell")

# Every leaf field of SweepSpec. A prefix entry (ending in ".") covers a whole section whose every field
# reaches the keys the same way (the zoo recipe is hashed whole into the zoo key; a data source whole
# into its split's fingerprint).
FIELDS: dict[str, Direct | Via] = {
    "name": NONE,  # the experiment and folder name
    "output_dir": NONE,
    "models.target.zoo": TARGET,
    "models.target.name_or_path": TARGET,
    "models.target.gguf": TARGET,  # the target id names the file by its sha256
    "models.target.cut": TARGET,  # refused by the spec (only a draft is made from the target)
    "models.target.fresh": TARGET,
    "models.target.dtype": _direct("shard", "draft:online", "cell", "cost_ratio"),
    "models.target.trust_remote_code": NONE,
    "models.draft.zoo": STUDENT,
    "models.draft.name_or_path": STUDENT,
    "models.draft.gguf": STUDENT,
    # a derived draft's id holds its recipe and the target's id: a new target makes a new draft
    "models.draft.cut": STUDENT,
    "models.draft.fresh": STUDENT,
    "models.draft.dtype": NONE,  # training is fp32 master weights; drafts are evaluated in the target's dtype
    "models.draft.trust_remote_code": NONE,
    "models.zoo.": ZOO,
    # a model garden's targets: the garden's own distillations and points are keyed by the models they use
    # (`garden/run.py`); no sweep result depends on which models a garden lists
    "models.garden": _direct("garden"),
    "data.train.": SPLITS,
    "data.out_of_domain.": OOD,
    "data.train_size": _via("train split fingerprint (cut after the held-out splits)", "shard", "draft"),
    "data.validation_size": SPLITS,  # held-out splits are cut first: their sizes move the train split
    "data.in_domain_test_size": SPLITS,
    "data.out_of_domain_test_size": OOD,
    # each named test set's prompts reach its cells' keys through its own prompts fingerprint
    "data.test_sets": _via("named test sets' prompts fingerprints", "cell"),
    "data.template": _direct("shard", "draft", "cell"),
    "data.max_prompt_tokens": _direct("draft", "cell"),
    "data.seed": SPLITS,
    "teacher.engine": _via("shard key (engine)", "shard", "draft"),
    "teacher.replicas": NONE,
    "teacher.num_cpus": NONE,
    "teacher.num_gpus": _via("shard key (engine device)", "shard", "draft"),
    "teacher.batch_size": NONE,  # every request has its own seed: batching does not change a response
    "teacher.max_new_tokens": _via("shard key", "shard", "draft"),
    "teacher.temperatures": _direct("grid"),
    "teacher.seed": _via("shard key", "shard", "draft"),
    # which drafts exist: replicate r > 0 trains from the shards of teacher.seed + r (`for_replicate`)
    "teacher.replicate_shards": _direct("grid"),
    "teacher.vllm.tensor_parallel_size": NONE,
    "teacher.vllm.dtype": _via("shard key (engine)", "shard", "draft"),
    "teacher.vllm.gpu_memory_utilization": NONE,
    "teacher.vllm.max_model_len": _via("shard key (engine)", "shard", "draft"),
    "teacher.vllm.batch_invariant": NONE,  # which kernels compute the logits: round-off, not the sampler
    "distill.paradigms": _direct("grid"),
    # one value: in every online draft's key; a list: which online drafts exist, each keyed by its own one
    # value (`SweepSpec.for_variant`), so a one-value sweep's drafts keep their keys
    "distill.divergence": _direct("draft:online", "grid"),
    "distill.jsd_beta": _direct("draft:online"),  # dropped from the key unless divergence is jsd
    "distill.onpolicy_fraction": _direct("draft:online"),
    # fixed / teacher / student rows (online runs only); a list: one online draft per value, as divergence
    "distill.data_sources": _direct("draft:online", "grid"),
    "distill.loss_averaging": _direct("draft"),  # a token mean or DistillSpec's per-sequence mean
    "distill.loss_chunk_size": NONE,  # LM heads in chunks: the same loss up to fp round-off
    "distill.teacher_cache_mb": NONE,  # teacher states computed once, not every step: same up to round-off
    "distill.loss_temperature": _direct("draft:online"),
    "distill.steps": _direct("draft"),
    # an online draft's key holds its own steps as distill.steps (`SweepSpec.for_paradigm`), so online
    # steps of 600 made either way share a key and an offline draft never depends on this field
    "distill.online_steps": _direct("draft:online"),
    "distill.batch_size": _direct("draft"),
    "distill.grad_accum": _direct("draft"),
    "distill.lr": _direct("draft"),
    "distill.warmup_steps": _direct("draft"),
    "distill.weight_decay": _direct("draft"),
    "distill.max_grad_norm": _direct("draft"),
    "distill.max_new_tokens": _direct("draft:online"),
    # N workers train on exactly the rows of one worker (tests/integration/test_distill_ray.py)
    "distill.workers": NONE,
    "distill.num_cpus_per_worker": NONE,
    "distill.runs": NONE,  # how the drafts are scheduled, not what any of them is
    "distill.num_gpus_per_worker": _via("train device (bf16 autocast on CUDA)", "draft"),
    "distill.cpu_autocast": _via("train device (cpu+bf16)", "draft"),
    "distill.checkpoint_every": NONE,
    "distill.report_every": _direct("curves"),
    "distill.mixtures": _direct("grid"),
    "distill.seed": _direct("draft"),
    # how many drafts per recipe: replicate r trains with distill.seed + r, which its key holds
    "distill.replicates": _direct("grid"),
    "eval.temperatures": _direct("grid", "curves"),
    # each cell's own γ is one of its coordinates, hence in its key; the step costs time each γ's pass
    "eval.gamma": _direct("grid", "cost_ratio"),
    "eval.batch_sizes": _direct("cost_ratio"),  # the B the costs are timed at (modelled cells: via them)
    "eval.empirical_batch_sizes": _direct("grid"),  # each empirical cell's own B is in its key
    "eval.repeats": _direct("cell:empirical"),
    "eval.max_new_tokens": _direct("cell", "curves"),
    "eval.estimators": _direct("grid"),
    "eval.empirical_temperatures": _direct("grid"),
    "eval.empirical_prompts": _direct("cell"),  # analytic cells also score exactly those prompts
    "eval.empirical_drafts": _direct("grid"),
    "eval.test_sets": _direct("grid"),
    "eval.workload": _direct("report"),  # weighs cells that exist anyway; the report computes it
    # each cell's own (function, ε) is one of its coordinates, hence in its key — only when ε < 1, so a
    # lossless cell keeps the key it had before lenience existed
    "eval.lenience.function": _direct("grid"),
    "eval.lenience.epsilon": _direct("grid"),
    "eval.quality_ends": _direct("grid"),  # whether the models-alone records exist, not what they hold
    "eval.draft_cost_ratio": _via("the step costs' values", "cell:analytic"),
    "eval.projected_cost_ratio": _direct("report"),
    "eval.timing_precision": _direct("cost_ratio"),  # how long they are timed: another precision re-times
    "eval.drafts_per_pass": NONE,  # how many drafts share a target pass: the numbers are the same
    "eval.replicas": NONE,
    "eval.num_cpus": _via("threads (wall times)", "cell:empirical", "cost_ratio"),
    "eval.num_gpus": _via("eval device", "cell", "cost_ratio"),
    "eval.seed": _direct("cell", "curves"),
    "tune.": _direct("tune"),
    # the retrained drafts' budget: it reaches their draft keys as their distill.steps (`budget_spec`),
    # never a sweep's results, so a full-budget draft is the sweep's own when the steps agree
    "tune.final_steps": _direct("tune"),
    "tracking.": NONE,
    "ray.": NONE,
}


def classification(path: str) -> Direct | Via | None:
    """The entry for a dotted field path (exact, else the longest section prefix), or None."""
    if path in FIELDS:
        return FIELDS[path]
    prefixes = [p for p in FIELDS if p.endswith(".") and path.startswith(p)]
    return FIELDS[max(prefixes, key=len)] if prefixes else None


def leaf_fields(model: type[BaseModel] | None = None, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf field of a pydantic model (SweepSpec by default); lists, mappings and
    optional sections are leaves."""
    import typing

    from pydantic import BaseModel

    from specray.config import SweepSpec

    model = model or SweepSpec
    paths = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        nested = [c for c in (annotation, *typing.get_args(annotation)) if isinstance(c, type)]
        section = next((c for c in nested if issubclass(c, BaseModel)), None)
        optional = type(None) in typing.get_args(annotation)  # a section that may be absent: one value
        if section is not None and typing.get_origin(annotation) not in (list, dict) and not optional:
            paths += leaf_fields(section, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def _value(spec: SweepSpec, path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        node = getattr(node, part)
    return node.model_dump(mode="json") if hasattr(node, "model_dump") else _jsonable(node)


def _jsonable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


def direct_inputs(spec: SweepSpec, *roles: str) -> dict[str, Any]:
    """{field path: value} of every directly keyed field with one of `roles`."""
    wanted = set(roles)
    return {
        path: _value(spec, path)
        for path, entry in FIELDS.items()
        if isinstance(entry, Direct) and entry.roles & wanted and not path.endswith(".")
    }


def digest(inputs: Mapping[str, Any], length: int = 20) -> str:
    """Stable hash of key inputs (sorted JSON; floats as Python prints them)."""
    payload = json.dumps({"format": KEY_FORMAT, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:length]


def describe_change(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 3) -> str:
    """`eval.gamma 3 → 6, distill.divergence fkl → tvd` for the inputs that differ ("new" if no old)."""
    if not old:
        return "new"
    changed = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    parts = [f"{key} {_short(old.get(key))} → {_short(new.get(key))}" for key in changed[:limit]]
    parts += [f"{len(changed) - limit} more"] if len(changed) > limit else []
    return ", ".join(parts) or "unchanged"


def _short(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, str) and len(value) == 20 and all(c in "0123456789abcdef" for c in value):
        return value[:8]  # another key: its first characters are enough to see that it changed
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- derived inputs


def canonical_mixture(mixture: Mapping[float, float]) -> str:
    """`0.7:0.333333,0.9:0.666667`: normalised weights, so `{0.7: 1, 0.9: 2}` and `{0.7: 2, 0.9: 4}` agree."""
    total = sum(mixture.values())
    return ",".join(f"{float(t):g}:{w / total:.6g}" for t, w in sorted(mixture.items()))


def draft_key_inputs(
    spec: SweepSpec,
    paradigm: str | None,
    mixture: Mapping[float, float],
    shard_digests: Mapping[float, str],
    samples: Sequence[tuple[float, str]] = (),
) -> dict[str, Any]:
    """What a draft's weights depend on. `paradigm` None is the un-distilled draft (the student itself).
    `samples`: a control's (weight, shard digest) per teacher sample of its one τ_kd (`draft.plan_control`);
    only a control's inputs have them."""
    inputs: dict[str, Any] = {"student": model_id(spec.models.draft, spec.models)}
    if paradigm is None:
        return inputs
    if paradigm == "online" and (spec.distill.varies_divergence or spec.distill.varies_data_source):
        raise ValueError("an online draft's key needs one divergence and data source (SweepSpec.for_variant)")
    roles = ("draft", "draft:online") if paradigm == "online" else ("draft",)
    inputs |= direct_inputs(spec.for_paradigm(paradigm), *roles)
    inputs.pop("distill.online_steps", None)  # resolved into distill.steps: the steps this draft trains
    if paradigm == "online":
        inputs["target"] = model_id(spec.models.target, spec.models)
        if spec.distill.draft_divergence != "jsd":
            inputs.pop("distill.jsd_beta")
    inputs |= {
        "paradigm": paradigm,
        "mixture": canonical_mixture(mixture),
        "shards": {f"{float(t):g}": shard_digests[t] for t in sorted(mixture)},
        "device": train_device_kind(spec.distill.num_gpus_per_worker, spec.distill.cpu_autocast),
    }
    if samples:
        total = sum(weight for weight, _ in samples)
        inputs["samples"] = [[f"{weight / total:.6g}", shard] for weight, shard in samples]
    return inputs


def curve_inputs(spec: SweepSpec) -> dict[str, Any]:
    """What the acceptance-vs-KD-step curves recorded with a draft depend on beyond its weights."""
    return direct_inputs(spec, "curves")


def cost_ratio_inputs(spec: SweepSpec) -> dict[str, Any]:
    """What the measured step costs depend on: the pair's architectures, dtype, device and threads, and
    which γ and B are timed."""
    inputs = direct_inputs(spec, "cost_ratio")
    if inputs["eval.timing_precision"] == type(spec.eval).model_fields["timing_precision"].default:
        del inputs["eval.timing_precision"]  # the default: sweeps from before the setting keep their keys
    return inputs | {
        "target": model_id(spec.models.target, spec.models),
        "student": model_id(spec.models.draft, spec.models),
        "models.target.dtype": spec.models.target.dtype,
        "device": device_kind(spec.eval.num_gpus),
        "threads": max(1, int(spec.eval.num_cpus)),
        "format": STEP_COSTS_FORMAT,
    }


def cell_key_inputs(
    spec: SweepSpec,
    draft_key: str,
    prompts_fingerprint: str,
    test_set: str,
    tau_dec: float,
    estimator: str,
    gamma: int,
    step_costs: str | None,
    lenience: tuple[str | None, float] = (None, 1.0),
    batch_size: int = 1,
) -> dict[str, Any]:
    """What one evaluation cell's record depends on (`step_costs`: a digest of the costs' values,
    analytic cells only; `lenience`: the cell's (function, ε), keyed only when ε < 1, and `batch_size`
    (empirical), keyed only above 1: a lossless batch-1 cell's key is unchanged)."""
    inputs = direct_inputs(spec, "cell", f"cell:{estimator}")
    inputs |= {
        "draft": draft_key,
        "target": model_id(spec.models.target, spec.models),
        "device": device_kind(spec.eval.num_gpus),
        "prompts": prompts_fingerprint,
        "test_set": test_set,
        "tau_dec": float(tau_dec),
        "estimator": estimator,
        "eval.gamma": int(gamma),
        "record_format": CELL_RECORD_FORMAT if estimator == "analytic" else EMPIRICAL_RECORD_FORMAT,
    }
    function, epsilon = lenience
    if epsilon < 1.0:
        inputs |= {"eval.lenience.function": function, "eval.lenience.epsilon": float(epsilon)}
        if estimator == "analytic":
            inputs["lossy_format"] = LOSSY_ANALYTIC_FORMAT
    if estimator == "analytic":
        inputs["step_costs"] = step_costs
    else:
        inputs["threads"] = max(1, int(spec.eval.num_cpus))
    if batch_size != 1:
        inputs["batch_size"] = int(batch_size)
    return inputs


def garden_point_key(
    spec: SweepSpec, decodes: Mapping[str, Any], prompts_fingerprint: str, measure_format: int
) -> str:
    """A model garden's point: what it decodes (`decodes`: the kind of point, τ, γ, lenience, and the
    models by what they are), on which prompts, how long, how often, with which seeds, on what (device and
    threads: the latencies), measured by which version of the measurement (`measure_format`)."""
    e = spec.eval
    return digest(
        {
            "garden_point": measure_format,
            "decodes": dict(decodes),
            "prompts": prompts_fingerprint,
            "max_new_tokens": e.max_new_tokens,
            "repeats": e.repeats,
            "seed": e.seed,
            "device": {"num_cpus": e.num_cpus, "num_gpus": e.num_gpus},
        }
    )


# ---------------------------------------------------------------- a sweep's teacher shards


def teacher_id(models: ModelsSpec) -> str:
    """Stable name of the teacher (the target): `zoo/<zoo key>/target` or the HF name or path."""
    return model_id(models.target, models)


def engine_id(teacher: TeacherSpec) -> str:
    """The engine as the shard key sees it: its name, plus what changes its numbers beyond the model's
    dtype (vLLM's own dtype and context length; a GPU for the transformers engine). Plain `transformers`
    on CPU has no suffix: a CPU shard's key does not depend on how other engines are named."""
    if teacher.engine == "vllm":
        return f"vllm(dtype={teacher.vllm.dtype},max_model_len={teacher.vllm.max_model_len})"
    return "transformers" if teacher.num_gpus == 0 else "transformers(cuda)"


def shard_key(
    spec: SweepSpec, examples: Sequence[Example], tau: float, max_new_tokens: int, seed: int
) -> ShardKey:
    """The key of the shard of `examples` sampled from the sweep's teacher at `tau`."""
    from specray.data.shards import ShardKey
    from specray.data.splits import fingerprint

    return ShardKey(
        teacher=teacher_id(spec.models),
        engine=engine_id(spec.teacher),
        dtype=spec.models.target.dtype,
        dataset=fingerprint(examples),
        template=spec.data.template,
        tau=float(tau),
        max_new_tokens=max_new_tokens,
        seed=seed,
    )


def train_shard_keys(spec: SweepSpec, train: Sequence[Example] | None = None) -> dict[float, ShardKey]:
    """The key of every τ_kd shard of the sweep's train split (`train` saves rebuilding the splits)."""
    if train is None:
        from specray.data.dataset import build_splits

        train = build_splits(spec.data)["train"]
    teacher = spec.teacher
    return {
        tau: shard_key(spec, train, tau, teacher.max_new_tokens, teacher.seed) for tau in teacher.temperatures
    }


def spec_key(spec: SweepSpec, with_tune: bool = False) -> str:
    """Identity of a sweep's work (MLflow parent runs are tagged with it): every field that changes a result,
    the grid or the report (and the tune search for `specray tune`); not where or how it runs."""
    skipped = {"none"} if with_tune else {"none", "tune"}
    inputs: dict[str, Any] = {}
    for path in leaf_fields():
        entry = classification(path)
        if entry is not None and not entry.roles <= skipped:
            inputs[path] = _value(spec, path)
    return digest(inputs | {"name": spec.name}, length=16)
