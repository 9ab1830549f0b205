"""From a sweep spec to evaluation cells: the test prompts, the settings, the (draft × test set × τ_dec ×
estimator × γ) jobs with their content keys, and the passes they are evaluated in. Pure planning — no
models are run here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from specray.config import EvalSpec, SweepSpec
from specray.data.dataset import build_splits, held_out_split
from specray.data.examples import Example
from specray.data.spec_bench import conversation_id, expand_turns
from specray.data.splits import fingerprint
from specray.data.templates import encode_prompts
from specray.devices import device_kind
from specray.keys import cell_key_inputs, digest, model_id
from specray.models.loading import check_same_vocabulary, load_tokenizer
from specray.specdec.records import EvalJob, EvalSettings, StepCosts
from specray.specdec.turns import answers_key, conversation_answers, later_turns


@dataclass(frozen=True)
class DraftRef:
    """A draft to evaluate: display name, HF dir, content key and single τ_kd (None: mixture, baseline)."""

    name: str
    path: str
    key: str = ""
    tau_kd: float | None = None


def eval_settings(spec: EvalSpec, step_costs: StepCosts | None = None) -> EvalSettings:
    """The evaluators' settings; the step costs are the given ones, else the spec's fixed c, else None
    (to be measured)."""
    if step_costs is None and spec.draft_cost_ratio is not None:
        step_costs = fixed_step_costs(spec)
    return EvalSettings(
        repeats=spec.repeats,
        max_new_tokens=spec.max_new_tokens,
        empirical_prompts=spec.empirical_prompts,
        seed=spec.seed,
        step_costs=step_costs,
        timing_precision=spec.timing_precision,
    )


def fixed_step_costs(spec: EvalSpec) -> StepCosts:
    """The papers' model at the spec's `draft_cost_ratio` (a config validator keeps its B at 1)."""
    assert spec.draft_cost_ratio is not None
    return StepCosts.fixed(spec.draft_cost_ratio, spec.batch_sizes, spec.gamma)


def evaluated_examples(spec: SweepSpec) -> dict[str, list[Example]]:
    """Every evaluated test set's examples, one per test prompt: under the chat template a conversation is
    one prompt per turn (`expand_turns`), under the Alpaca template its first turn."""
    splits = build_splits(spec.data)
    chat = spec.data.template == "chat"
    return {
        test_set: expand_turns(splits[held_out_split(test_set)]) if chat else splits[held_out_split(test_set)]
        for test_set in spec.eval.test_sets
    }


def encode_test_prompts(
    spec: SweepSpec, tokenizer: PreTrainedTokenizerBase, target_path: str
) -> dict[str, list[list[int]]]:
    """Token ids of every test prompt per test set (encoded by `data.templates.encode_prompts`); a later
    turn's prompt holds the target's own greedy answers to the turns before it (`specdec.turns`, cached)."""
    device, length = answers_device(spec), spec.eval.max_new_tokens
    prompts = {}
    for test_set, rows in evaluated_examples(spec).items():
        answers = conversation_answers(rows, target_path, _answers_key(spec, rows), length, device)
        prompts[test_set] = encode_prompts(rows, tokenizer, spec.data, answers)
    return prompts


def answers_device(spec: SweepSpec) -> str:
    """Where the driver decodes the earlier answers of multi-turn prompts: the eval device when this process
    has it, else the CPU (a cluster's driver often has no GPU; the answers' key says which it was)."""
    import torch

    return "cuda" if device_kind(spec.eval.num_gpus) == "cuda" and torch.cuda.is_available() else "cpu"


def _answers_key(spec: SweepSpec, examples: Sequence[Example]) -> str:
    target = model_id(spec.models.target, spec.models)
    return answers_key(examples, target, spec.eval.max_new_tokens, answers_device(spec))


def prompt_categories(spec: SweepSpec) -> dict[str, list[str]]:
    """Per evaluated test set with categories (a spec_bench source), each test prompt's category, in the
    order of its prompts."""
    return {
        test_set: [e.family for e in examples]
        for test_set, examples in evaluated_examples(spec).items()
        if spec.data.test_source(test_set).has_categories
    }


def prompt_conversations(spec: SweepSpec) -> dict[str, list[str]]:
    """Per evaluated test set with categories, each test prompt's conversation (its question's id: the
    turns of one question are one conversation, whose later prompts hold the earlier answers)."""
    return {
        test_set: [conversation_id(e.id) for e in examples]
        for test_set, examples in evaluated_examples(spec).items()
        if spec.data.test_source(test_set).has_categories
    }


def workload_json(spec: SweepSpec) -> dict[str, Any] | None:
    """The sweep's workload as the report reads it: test set, category -> τ (a preset resolved), weights."""
    workload = spec.eval.workload
    if workload is None:
        return None
    return {"test_set": workload.test_set, "temperatures": workload.table, "weights": workload.weights}


def prompts_fingerprints(spec: SweepSpec) -> dict[str, str]:
    """Per test set, a key of its prompts' token ids without tokenizing: the examples, the template, the
    cut and the tokenizer (the target's) determine them."""
    tokenizer = model_id(spec.models.target, spec.models)
    fingerprints = {}
    for test_set, examples in evaluated_examples(spec).items():
        inputs = {
            "examples": fingerprint(examples),
            "template": spec.data.template,
            "max_prompt_tokens": spec.data.max_prompt_tokens,
            "tokenizer": tokenizer,
        }
        if later_turns(examples):  # the target's earlier answers are part of these prompts
            inputs["earlier_answers"] = _answers_key(spec, examples)
        fingerprints[test_set] = digest(inputs)
    return fingerprints


def plan_jobs(
    spec: EvalSpec,
    drafts: Sequence[DraftRef],
    keyed: tuple[SweepSpec, Mapping[str, str], str | None] | None = None,
) -> list[EvalJob]:
    """Every cell: analytic at every τ_dec, empirical at `empirical_temperatures`, per draft, test set, γ
    and lenience point (`LenienceSpec.points`: lossless, then every (function, ε < 1) at τ_dec > 0).

    With `empirical_drafts: diagonal`, empirical cells go only to drafts whose single τ_kd equals that τ_dec
    and to drafts without one (the un-distilled draft, mixtures). With `quality_ends`, each draft with an
    empirical cell at a τ_dec also gets one `ends` record there (the target and the draft decoding alone).
    Empirical cells are planned at every B of `empirical_batch_sizes`. `keyed` = (the sweep spec, the
    prompts' fingerprints, the step costs' fingerprint) gives every job its content key; without it jobs
    carry none (nothing is cached).
    """
    jobs = []
    for draft in drafts:
        for test_set in spec.test_sets:
            if "analytic" in spec.estimators:
                jobs += [
                    _job(draft, t, test_set, "analytic", g, keyed, point)
                    for t in spec.temperatures
                    for point in spec.lenience.points(t)
                    for g in spec.gamma
                ]
            if "empirical" not in spec.estimators:
                continue
            for tau in spec.empirical_temperatures:
                if spec.empirical_drafts == "all" or draft.tau_kd in (None, tau):
                    jobs += [
                        _job(draft, tau, test_set, "empirical", g, keyed, point, b)
                        for point in spec.lenience.points(tau)
                        for g in spec.gamma
                        for b in spec.empirical_batch_sizes
                    ]
                    jobs += [_job(draft, tau, test_set, "ends", 0, keyed)] if spec.quality_ends else []
    return jobs


def _job(
    draft: DraftRef,
    tau: float,
    test_set: str,
    estimator,
    gamma: int,
    keyed,
    lenience: tuple[str | None, float] = (None, 1.0),
    batch_size: int = 1,
) -> EvalJob:
    coordinates = (draft.name, draft.path, tau, test_set, estimator, gamma, draft.key)
    rest = {"lenience": lenience[0], "epsilon": lenience[1], "batch_size": batch_size}
    if keyed is None:
        return EvalJob(*coordinates, **rest)  # type: ignore[arg-type]
    spec, fingerprints, costs = keyed
    prompts = fingerprints[test_set]
    inputs = cell_key_inputs(
        spec, draft.key, prompts, test_set, tau, estimator, gamma, costs, lenience, batch_size
    )
    return EvalJob(*coordinates, digest(inputs), inputs, **rest)  # type: ignore[arg-type]


def passes(jobs: Sequence[EvalJob], drafts_per_pass: int) -> list[tuple[EvalJob, ...]]:
    """The units of work: analytic cells grouped by (test set, τ_dec) — at most `drafts_per_pass` drafts,
    each with all its γ and lenience points, per pass, so one target pass serves them — and each empirical
    (or `ends`) cell alone."""
    groups: dict[tuple[str, float], dict[str, list[EvalJob]]] = {}
    units: list[tuple[EvalJob, ...]] = []
    for job in jobs:
        if job.estimator != "analytic":
            units.append((job,))
        else:
            groups.setdefault((job.test_set, job.tau_dec), {}).setdefault(job.draft_path, []).append(job)
    analytic = []
    for _, by_draft in sorted(groups.items()):
        chunks = list(by_draft.values())
        for start in range(0, len(chunks), drafts_per_pass):
            analytic.append(tuple(job for chunk in chunks[start : start + drafts_per_pass] for job in chunk))
    return analytic + units


def check_drafts(target_path: str, drafts: Mapping[str, str]) -> None:
    """Refuse, before any decoding, a draft that is missing or whose vocabulary differs from the target's."""
    target_tokenizer = load_tokenizer(target_path)
    for path in drafts.values():
        check_same_vocabulary(target_tokenizer, load_tokenizer(path), target_path, path)
