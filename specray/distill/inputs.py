"""What one distillation run is asked to do, validated and resolved before any training starts.

`prepare_inputs` is the edge: a bad paradigm or τ_kd, a missing shard or incompatible models fail here with
one clear error (SpecError, DataError, ModelError). Under Ray it runs on the driver, before Ray starts, and
its result travels to the workers — so no worker reads the driver's cache or builds the zoo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specray.config import SweepSpec
from specray.distill.data import TrainRow, rows_from_table
from specray.distill.probe import probe_prompts
from specray.errors import DataError, SpecError
from specray.models.loading import check_same_vocabulary, load_tokenizer, resolve_model_path

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedTokenizerBase

PARADIGMS = ("offline", "online")


@dataclass(frozen=True)
class DistillInputs:
    """Everything the loop reads, resolved and validated once (under Ray: on the driver, before Ray)."""

    draft_path: str
    target_path: str
    rows: dict[float, list[TrainRow]]  # per τ_kd of the mixture
    probe_prompts: list[list[int]]


def draft_name(paradigm: str, mixture: Mapping[float, float]) -> str:
    """`offline/tau_kd=0.6` for a single τ_kd, `online/mix=0.7:1,0.8:1,0.9:1` for a mixture."""
    if len(mixture) == 1:
        return f"{paradigm}/tau_kd={float(next(iter(mixture))):g}"
    return f"{paradigm}/mix=" + ",".join(f"{float(t):g}:{w:g}" for t, w in sorted(mixture.items()))


def variant_name(name: str, divergence: str = "", data_source: str = "") -> str:
    """An online draft of DistillSpec's grid: `online/tau_kd=1/tvd/gkd`, with only the axes its sweep varies
    ("" = not varied), so a sweep of one divergence and one data source keeps `online/tau_kd=1`."""
    return "/".join([name, *(axis for axis in (divergence, data_source) if axis)])


def replicate_name(name: str, replicate: int) -> str:
    """Training replicate r of the draft `name`: `online/tau_kd=0.6/r1`; replicate 0 is `name` itself (a
    run without replicates made it, under the same key)."""
    return f"{name}/r{replicate}" if replicate else name


def draft_folder_name(name: str) -> str:
    """The folder a draft named `name` is published in (`offline/tau_kd=0.6` -> `offline__tau_kd=0.6`)."""
    return name.replace("/", "__")


def check_request(spec: SweepSpec, paradigm: str, mixture: Mapping[float, float]) -> dict[float, float]:
    """The mixture as {τ_kd: weight}; SpecError naming the bad value before any work starts."""
    if paradigm not in PARADIGMS:
        raise SpecError(f"paradigm {paradigm!r} is not one of {', '.join(PARADIGMS)}")
    weights = {float(tau): float(weight) for tau, weight in mixture.items()}
    if not weights or any(not weight > 0 for weight in weights.values()):
        raise SpecError(f"a mixture needs at least one τ_kd and weights > 0, got {weights}")
    unknown = sorted(set(weights) - set(spec.teacher.temperatures))
    if unknown:
        raise SpecError(
            f"τ_kd {unknown} not in teacher.temperatures {spec.teacher.temperatures} "
            "(distillation trains on those shards only)"
        )
    d = spec.distill
    if d.batch_size < d.workers:
        raise SpecError(
            f"distill.batch_size ({d.batch_size}) must be >= distill.workers ({d.workers}): "
            "each worker trains on its slice of every batch"
        )
    return weights


def prepare_inputs(spec: SweepSpec, paradigm: str, mixture: Mapping[float, float]) -> DistillInputs:
    """Validate the request, read the τ_kd shards (DataError if `specray generate` has not made them)
    and resolve both models (building the tiny zoo if needed). An online run with fixed data
    (`distill.data_sources`) also gets each row's ground-truth response."""
    from specray.data.shards import load_train_shards

    weights = check_request(spec, paradigm, mixture)
    tables = load_train_shards(spec, list(weights))
    draft_path = resolve_model_path(spec.models.draft, spec.models.zoo)
    target_path = resolve_model_path(spec.models.target, spec.models.zoo)
    tokenizer = load_tokenizer(target_path, spec.models.target.trust_remote_code)
    draft_tokenizer = load_tokenizer(draft_path, spec.models.draft.trust_remote_code)
    check_same_vocabulary(tokenizer, draft_tokenizer, target_path, draft_path)
    truth = None
    if paradigm == "online" and spec.distill.sources.fixed > 0:
        from specray.data.dataset import build_splits

        outputs = {example.id: example.output for example in build_splits(spec.data)["train"]}
        # every shard holds the same prompts (the train split), so one table gives every prompt's truth
        table = next(iter(tables.values()))
        truth = ground_truth_responses(table, outputs, tokenizer, spec.teacher.max_new_tokens)
    rows = {
        tau: rows_from_table(table, tau, spec.data.max_prompt_tokens, truth) for tau, table in tables.items()
    }
    return DistillInputs(draft_path, target_path, rows, probe_prompts(spec, tokenizer))


def ground_truth_responses(
    table: pa.Table, outputs: Mapping[str, str], tokenizer: PreTrainedTokenizerBase, limit: int
) -> dict[str, tuple[int, ...]]:
    """Prompt id -> its example's ground-truth `outputs[id]` as a response to the shard's prompt,
    tokenised like the teacher's responses: the tokens that follow the prompt's own in the tokenisation
    of prompt + output (so the boundary is cut as a model continuing the prompt sees it; the output alone
    where a merge crosses the boundary), then EOS, cut at `limit` (teacher.max_new_tokens) tokens."""
    ids = table.column("prompt_id").to_pylist()
    missing = [i for i in ids if i not in outputs]
    if missing:
        raise DataError(f"{len(missing)} shard prompts are not in the train split (e.g. {missing[0]!r})")
    prompts = table.column("prompt").to_pylist()
    joint = tokenizer([prompt + outputs[i] for i, prompt in zip(ids, prompts, strict=True)])["input_ids"]
    eos = tokenizer.eos_token_id
    truth = {}
    for i, prompt_ids, ids_joint in zip(
        ids, table.column("prompt_token_ids").to_pylist(), joint, strict=True
    ):
        if ids_joint[: len(prompt_ids)] == prompt_ids:
            response = ids_joint[len(prompt_ids) :]
        else:
            response = tokenizer(outputs[i], add_special_tokens=False)["input_ids"]
        if eos is not None and response[-1:] != [eos]:
            response = [*response, eos]
        truth[i] = tuple(response[:limit])
    return truth


def parse_mixture(text: str) -> dict[float, float]:
    """`0.7:1,0.8:1,0.9:1` -> {0.7: 1.0, 0.8: 1.0, 0.9: 1.0}; a τ without `:WEIGHT` weighs 1."""
    usage = f"mixture {text!r}: expected TAU:WEIGHT[,TAU:WEIGHT...], e.g. 0.7:1,0.8:1,0.9:1"
    weights: dict[float, float] = {}
    for part in text.split(","):
        tau, sep, weight = part.strip().partition(":")
        try:
            value = (float(tau), float(weight) if sep else 1.0)
        except ValueError:
            raise SpecError(usage) from None
        if value[0] in weights:
            raise SpecError(f"mixture {text!r}: τ_kd {value[0]:g} appears twice")
        weights[value[0]] = value[1]
    return weights
