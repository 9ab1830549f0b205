"""Which spec field reaches which key. Every cached result is stored under a hash of everything that
made it, and nothing else (`specray.keys`).

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from specray.config import SweepSpec


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
    # value (`SweepSpec.for_variant`)
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
    # each cell's own (function, ε) is one of its coordinates, hence in its key
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


def field_value(spec: SweepSpec, path: str) -> Any:
    """The value of the dotted field `path` of `spec`, as plain JSON data."""
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
        path: field_value(spec, path)
        for path, entry in FIELDS.items()
        if isinstance(entry, Direct) and entry.roles & wanted and not path.endswith(".")
    }
