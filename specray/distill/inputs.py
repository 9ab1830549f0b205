"""What one distillation run reads, resolved and checked before any training starts.

`prepare_inputs` is the edge for the run's data and models: a missing shard or incompatible models fail here
with one clear error (DataError, ModelError). The request itself (paradigm, τ_kd, weights, workers) was
validated once, where the draft was planned (`draft.plan_draft`); a `Draft` is that validated request, and
nothing downstream checks it again. Under Ray it runs on the driver, before Ray starts, and its result
travels to the workers — so no worker reads the driver's cache or builds the zoo.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specray.data.examples import Example
from specray.distill.data import TrainRow, rows_from_table
from specray.distill.probe import probe_prompts
from specray.errors import DataError, SpecError
from specray.models.loading import check_same_vocabulary, load_tokenizer
from specray.models.sources import resolve_model_path

if TYPE_CHECKING:
    import pyarrow as pa
    from transformers import PreTrainedTokenizerBase

    from specray.data.shards import ShardKey
    from specray.draft import Draft


@dataclass(frozen=True)
class DistillInputs:
    """Everything the loop reads, resolved and checked once (under Ray: on the driver, before Ray)."""

    draft_path: str
    target_path: str
    rows: dict[float, list[TrainRow]]  # per component of the draft (`Draft.components`)
    probe_prompts: list[list[int]]


def prepare_inputs(draft: Draft, splits: Mapping[str, Sequence[Example]] | None = None) -> DistillInputs:
    """Read the planned draft's τ_kd shards (DataError if `specray generate` has not made them) and
    resolve both models (building the tiny zoo if needed). An online run with fixed data
    (`distill.data_sources`) also gets each row's ground-truth response. `splits`: the sweep's, as its plan
    built them (else they are built here, for a draft trained on its own)."""
    from specray.data.shards import is_complete, read_shard

    spec, paradigm = draft.train_spec, draft.paradigm or ""
    shards = component_shards(draft)
    missing = sorted({tau for tau in draft.mixture if tau not in draft.shards})
    missing += sorted({key.tau for key in shards.values() if not is_complete(key)} - set(missing))
    if missing:
        samples = f" (the control's {len(shards)} teacher samples)" if draft.samples else ""
        raise DataError(
            f"no teacher shards yet for τ_kd {missing}{samples}; run `specray generate` on this sweep first"
        )
    tables = {component: read_shard(key) for component, key in shards.items()}
    draft_path = resolve_model_path(spec.models.draft, spec.models)
    target_path = resolve_model_path(spec.models.target, spec.models)
    tokenizer = load_tokenizer(target_path, spec.models.target.trust_remote_code)
    draft_tokenizer = load_tokenizer(draft_path, spec.models.draft.trust_remote_code)
    check_same_vocabulary(tokenizer, draft_tokenizer, target_path, draft_path)
    if splits is None:
        from specray.data.dataset import build_splits

        splits = build_splits(spec.data)
    truth = None
    if paradigm == "online" and spec.distill.sources.fixed > 0:
        outputs = {example.id: example.output for example in splits["train"]}
        # every shard holds the same prompts (the train split), so one table gives every prompt's truth
        table = next(iter(tables.values()))
        truth = ground_truth_responses(table, outputs, tokenizer, spec.teacher.max_new_tokens)
    rows = {
        component: rows_from_table(table, shards[component].tau, spec.data.max_prompt_tokens, truth)
        for component, table in tables.items()
    }
    probe = probe_prompts(splits["validation"], tokenizer, spec.data)
    return DistillInputs(draft_path, target_path, rows, probe)


def component_shards(draft: Draft) -> dict[float, ShardKey]:
    """The teacher shard each component of the draft's training data is read from (`Draft.components`):
    a mixture's τ_kd shards, or a control's teacher samples at its one τ_kd."""
    if draft.samples:
        return {float(j): draft.sample_shards[j] for j in sorted(draft.samples)}
    return {tau: draft.shards[tau] for tau in draft.mixture if tau in draft.shards}


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
